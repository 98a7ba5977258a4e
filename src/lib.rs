//! # ferropool
//!
//! The memory layer of a multithreaded CPU training runtime.
//!
//! - [`SlotArena`]: a lock-free arena of generational slots. Readers pin an epoch and never
//!   take a lock or write shared memory; removed values are reclaimed through crossbeam-epoch
//!   only after every reader that could see them has unpinned. A stale key (removed, reused
//!   or from another arena) yields a typed [`ArenaError`], never the wrong value.
//!
//! ```
//! use ferropool::SlotArena;
//! use std::sync::Arc;
//!
//! let arena = Arc::new(SlotArena::new());
//! let keys: Vec<_> = (0..4u64).map(|i| arena.insert(i * 10).unwrap()).collect();
//! let readers: Vec<_> = (0..2)
//!     .map(|_| {
//!         let (arena, keys) = (Arc::clone(&arena), keys.clone());
//!         std::thread::spawn(move || {
//!             let guard = arena.pin();
//!             keys.iter().map(|&k| *arena.get(k, &guard).unwrap()).sum::<u64>()
//!         })
//!     })
//!     .collect();
//! for reader in readers {
//!     assert_eq!(reader.join().unwrap(), 60);
//! }
//! ```
//!
//! The architecture, its layers and invariants are described in `DESIGN.md`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations)]

mod arena;
mod checkpoint;
mod error;
mod group;
mod identity;
mod paged;
mod pool;
mod retain;
mod stack;
mod sync;
mod tensor;
mod thread;

pub use arena::{ArenaConfig, ArenaError, Key, SlotArena, SlotPhase};
pub use checkpoint::CheckpointNode;
pub use crossbeam_epoch::{Collector, Guard, LocalHandle};
pub use error::{Error, ErrorPhase, Result};
pub use group::{AllocationGroup, DescriptorSlot, GroupError, TensorValue, TensorWrite};
/// The `half` crate, whose `f16` and `bf16` are this crate's 16-bit float elements.
pub use half;
pub use pool::{
    BlockInfo, BufferPool, ClassStats, MemoryTag, OutOfMemory, PoolAllocator, PoolBuffer,
    PoolConfig, PoolError, PoolEvent, PoolEventKind, PoolStats, TagScope,
};
pub use retain::{RetainedInputMap, RetainedValue, RetentionContainer};
pub use tensor::{
    DType, Element, ExternalPayload, Layout, RawView, Tensor, TensorError, TensorRead, UninitTensor,
};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
