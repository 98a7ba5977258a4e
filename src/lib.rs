//! # ferropool
//!
//! The memory layer of a multithreaded CPU training runtime: where tensor bytes come from,
//! who owns them, how many threads read saved tensors at once while a backward pass is
//! replayed, and how all of it goes back without a leak, a double drop or a page fault.
//!
//! - **buffers**: [`BufferPool`], [`PoolBuffer`], [`PoolConfig`], [`PoolStats`], [`PoolAllocator`]
//!   — size-classed blocks, per-thread caches the pool can always take back, a byte budget,
//!   PyTorch-grade statistics, a snapshot of live blocks by [`MemoryTag`], a Perfetto trace; a
//!   `#[global_allocator]` front end
//! - **tensors**: [`Tensor`], [`TensorRead`], [`Layout`], [`DType`], [`Element`] — typed, strided
//!   views over pooled bytes; `f16`/`bf16` from [`half`]; caller-owned payloads
//!   ([`ExternalPayload`])
//! - **descriptors**: [`SlotArena`], [`Key`], [`ArenaConfig`] — a lock-free arena of generational
//!   slots reclaimed with crossbeam-epoch
//! - **groups**: [`AllocationGroup`], [`DescriptorSlot`], [`TensorValue`] — one owner of buffers,
//!   many views; read-only while shared
//! - **retention**: [`RetainedValue`], [`RetentionContainer`], [`RetainedInputMap`] — handles that
//!   keep a group alive and read it from any thread without a lock
//! - **checkpoints**: [`CheckpointNode`] — chains of retained inputs, graphs and aliases
//!
//! ```
//! use ferropool::{AllocationGroup, BufferPool, RetainedValue, Tensor};
//!
//! let pool = BufferPool::new();
//! let x = Tensor::from_slice_in(&pool, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let (group, slots) = AllocationGroup::from_tensors([x])?;
//! let saved = RetainedValue::from_group(&group, slots[0])?;
//! drop(group); // the retained handle keeps the bytes
//! let readers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let saved = saved.clone();
//!         std::thread::spawn(move || {
//!             saved.tensor_read().unwrap().as_slice::<f32>().unwrap().iter().sum::<f32>()
//!         })
//!     })
//!     .collect();
//! for reader in readers {
//!     assert_eq!(reader.join().unwrap(), 10.0);
//! }
//! drop(saved);
//! assert_eq!(pool.stats().in_use_bytes, 0); // the buffer is back in the pool
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Guarantees
//!
//! - Sound under any sequence of safe calls: sizes, counts, offsets and strides are checked
//!   and fail with typed errors ([`Error`] and each layer's own).
//! - User code may panic or re-enter: a value's `Drop` that panics, or that allocates from
//!   the same pool or inserts into the same arena, leaves every structure consistent, and
//!   every value is dropped exactly once.
//! - Nothing is stranded: a pool's caches belong to the pool, and trimming, budget pressure
//!   or the pool's close take them back from idle threads too; a pool's control block is
//!   freed when its last handle and last buffer are gone.
//! - The concurrent protocols are model-checked with loom, each model shown able to fail by
//!   a planted bug; Miri, the sanitizers and a fuzzer run on demand.
//!
//! ## Features
//!
//! - `allocator-api2`: `Allocator` for [`BufferPool`], for collections under a pool's budget.
//! - `ndarray`: `TensorRead::to_ndarray` and `Tensor::to_ndarray`, zero-copy `ArrayViewD`s
//!   of any view; `TensorWrite::to_ndarray_mut` and `Tensor::to_ndarray_mut`, zero-copy
//!   `ArrayViewMutD`s of views whose indices reach distinct elements
//!   ([`Layout::check_unaliased`]); `Tensor::from_ndarray_in`, one copy into a pool buffer.
//! - `serde`: `Serialize`/`Deserialize` for the pool's configuration, statistics, snapshots,
//!   trace events, memory tags and [`MemoryByTag`] (an object from tag name to bytes).
//!
//! On docs.rs every item behind a feature carries the feature's label.
//!
//! ## A trace for Perfetto
//!
//! With tracing on ([`BufferPool::enable_trace`]) a pool keeps its newest events in a ring;
//! [`BufferPool::trace_span`] marks the caller's steps and phases on the thread's track.
//! [`BufferPool::trace_json`] (or [`BufferPool::write_trace_json`], streamed to a file)
//! gives the Chrome Trace Event JSON that <https://ui.perfetto.dev> opens, serialized with
//! `serde_json`: `B`/`E` spans and the allocations on each OS thread's track, every thread
//! named, and a counter track of the bytes in use, cached and reserved.
//!
//! ```
//! let pool = ferropool::BufferPool::new();
//! pool.enable_trace(1024);
//! {
//!     let _step = pool.trace_span("step");
//!     drop(pool.alloc(1 << 20)?);
//! }
//! let trace: serde_json::Value = serde_json::from_str(&pool.trace_json())?;
//! let phases: Vec<_> = trace["traceEvents"]
//!     .as_array()
//!     .unwrap()
//!     .iter()
//!     .map(|e| e["ph"].clone())
//!     .collect();
//! assert!(phases.contains(&"B".into()) && phases.contains(&"C".into()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The design, its layers, protocols and invariants: [`design`].

#![cfg_attr(docsrs, feature(doc_cfg))]

mod arena;
mod checkpoint;
mod collect;
mod error;
mod group;
mod handshake;
mod identity;
mod paged;
mod pool;
mod retain;
mod roster;
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
    BlockInfo, BufferPool, ClassStats, MemoryByTag, MemoryTag, OutOfMemory, PoolAllocator,
    PoolBuffer, PoolConfig, PoolError, PoolEvent, PoolEventKind, PoolStats, SpanGuard, TagScope,
};
pub use retain::{
    EvictableTensor, ReadGuard, Recompute, RetainedInputMap, RetainedValue, RetentionContainer,
};
pub use tensor::{
    DType, Element, ExternalPayload, Layout, RawView, Tensor, TensorError, TensorRead, UninitTensor,
};

pub mod design {
    //! The design document (`DESIGN.md`): the layers, the protocols and the invariants,
    //! each tested.
    #![doc = include_str!("../DESIGN.md")]
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
