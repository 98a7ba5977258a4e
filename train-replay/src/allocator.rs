//! The process's global allocator, chosen when the process starts (see `ferropool-choice`):
//! ferropool's [`PoolAllocator`] over mimalloc (the default), the system allocator (glibc),
//! or mimalloc. `compare` runs the same training in three child processes, one per
//! allocator, through the environment variable [`VARIABLE`]; one binary, so `cargo run`
//! builds everything it needs.
//!
//! The pool's front end composes: requests below its 4 KiB threshold (the GEMM's per-call
//! flag vectors, the retention's small nodes) go to mimalloc under it, so no call of a
//! steady-state step reaches glibc.
//!
//! It also counts the calls that reach glibc and those that reach mimalloc: every call of the
//! process for those two choices, and for the pool the calls below its threshold (the pool
//! counts its own calls to the system in its statistics).

use ferropool::PoolAllocator;
pub use ferropool_choice::Choice;
use ferropool_choice::ChosenAllocator;

/// The environment variable that picks the allocator: `pool-mimalloc` (the default),
/// `glibc` or `mimalloc` (`pool`, the pool over glibc, is there too).
pub const VARIABLE: &str = "TRAIN_REPLAY_ALLOCATOR";

/// The main job's global allocator: `main.rs` makes a reference to it the
/// `#[global_allocator]`. The pool serves requests of 4 KiB and more (GEMM packing buffers
/// and the training's temporaries all come from it).
// SAFETY: `main.rs` makes it the global allocator, so its first use is the process's first
// allocation, before any thread can change the environment. (In the library's tests it is
// not the global allocator; nothing in this package changes the environment.)
pub static ALLOCATOR: ChosenAllocator = unsafe {
    ChosenAllocator::new(
        c"TRAIN_REPLAY_ALLOCATOR",
        Choice::PoolMimalloc,
        PoolAllocator::MIN_THRESHOLD,
        true,
    )
};

/// What `compare` runs, in turn: the pool, then the two `Vec` baselines.
pub const COMPARED: [Choice; 3] = [Choice::PoolMimalloc, Choice::Glibc, Choice::Mimalloc];

/// The allocator this process uses.
pub fn choice() -> Choice {
    ALLOCATOR.choice()
}

/// Gives what the process-wide pool caches back to the system (with the pool as the global
/// allocator; nothing otherwise): after a one-off large allocation, such as a weights file
/// read whole, which the pool would otherwise keep for the run.
pub fn give_back_cached() {
    if choice().is_pool() {
        ferropool::BufferPool::global().trim();
    }
}

/// Calls that reached glibc so far.
pub fn glibc_calls() -> u64 {
    ALLOCATOR.glibc_calls()
}

/// Calls that reached mimalloc so far (for the pool: its small requests).
pub fn mimalloc_calls() -> u64 {
    ALLOCATOR.mimalloc_calls()
}
