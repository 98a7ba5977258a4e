//! The process's global allocator, chosen when the process starts by the environment variable
//! [`VARIABLE`] (see `ferropool-choice`, shared with the main job): glibc
//! (`std::alloc::System`), mimalloc, ferropool's [`PoolAllocator`] over glibc (its default
//! configuration), or the pool over mimalloc. One binary, so `--compare` runs the same
//! training under each allocator as child processes.

use ferropool::PoolAllocator;
pub use ferropool_choice::Choice;
use ferropool_choice::ChosenAllocator;

/// The environment variable that picks the allocator.
pub const VARIABLE: &str = "RUNTIME_BENCH_ALLOCATOR";

/// The binary's global allocator (`main.rs` makes a reference to it the
/// `#[global_allocator]`): unset means the pool over glibc, as `PoolAllocator::new()` makes
/// it (64 KiB and up from the pool). No call counting: its shared counters would be
/// contended at 2 threads.
// SAFETY: `main.rs` makes it the global allocator, so its first use is the process's first
// allocation, before any thread can change the environment.
pub static ALLOCATOR: ChosenAllocator = unsafe {
    ChosenAllocator::new(
        c"RUNTIME_BENCH_ALLOCATOR",
        Choice::Pool,
        PoolAllocator::DEFAULT_THRESHOLD,
        false,
    )
};

/// The allocator this process uses.
pub fn choice() -> Choice {
    ALLOCATOR.choice()
}
