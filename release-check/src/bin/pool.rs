//! `PoolAllocator` as the README installs it: 64 KiB and more from the process-wide pool,
//! the rest from the system allocator.

use ferropool::PoolAllocator;

#[global_allocator]
static GLOBAL: PoolAllocator = PoolAllocator::new();

ferropool_release_check::patterns!();

fn main() {
    patterns::run("pool", true);
}
