//! `PoolAllocator` over mimalloc, with the smallest threshold: 4 KiB and more from the pool
//! (so blocks under the page layer's 32 KiB, which are heap blocks of their own, too), the
//! rest from mimalloc.

use ferropool::PoolAllocator;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: PoolAllocator<MiMalloc> =
    PoolAllocator::with_fallback(MiMalloc, PoolAllocator::MIN_THRESHOLD);

ferropool_release_check::patterns!();

fn main() {
    patterns::run("pool over mimalloc", true);
}
