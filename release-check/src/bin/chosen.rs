//! The allocator the main job and `runtime-bench` install: a reference to a
//! `ChosenAllocator`, which picks glibc, mimalloc or the pool over either from
//! `RELEASE_CHECK_ALLOCATOR` when the process first allocates (the pool by default), with
//! 64 KiB and more from the pool.

use ferropool::PoolAllocator;
use ferropool_choice::{Choice, ChosenAllocator};

// SAFETY: the global allocator: its first use is the process's first allocation, before
// any thread can change the environment; nothing here changes it.
static ALLOCATOR: ChosenAllocator = unsafe {
    ChosenAllocator::new(
        c"RELEASE_CHECK_ALLOCATOR",
        Choice::Pool,
        PoolAllocator::DEFAULT_THRESHOLD,
        true,
    )
};

#[global_allocator]
static GLOBAL: &ChosenAllocator = &ALLOCATOR;

ferropool_release_check::patterns!();

fn main() {
    if let Some(error) = ALLOCATOR.unknown_value_error() {
        eprintln!("error: {error}");
        std::process::exit(2);
    }
    let choice = ALLOCATOR.choice();
    patterns::run(choice.name(), choice.is_pool());
}
