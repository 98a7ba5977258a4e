//! `PoolAllocator` over a process-wide pool with a budget far smaller than the program: the
//! pool's own bookkeeping (its trace ring, its exports) never comes from, nor counts
//! against, the pool it describes, and a request the budget refuses is served by the
//! fallback instead of aborting the process. (No test harness: the pool is configured
//! before anything allocates.)

use std::alloc::{GlobalAlloc, Layout};

use ferropool::{BufferPool, PoolAllocator, PoolConfig};

#[global_allocator]
static ALLOCATOR: PoolAllocator = PoolAllocator::new();

const BUDGET: u64 = 1 << 20;

fn main() {
    // 65,536 events of the ring are about 3 MiB: three times the budget. Before the ring
    // came from the system allocator, this configuration aborted the process.
    BufferPool::configure_global(PoolConfig {
        budget: Some(BUDGET),
        trace_capacity: 65_536,
        ..PoolConfig::default()
    })
    .expect("configured before first use");
    let pool = PoolAllocator::pool();
    assert_eq!(
        pool.stats().reserved_bytes,
        0,
        "the ring is not in the pool"
    );

    // Within the budget: from the pool.
    let small = vec![7u8; 256 << 10];
    assert!(pool.stats().in_use_bytes >= 256 << 10);
    // Past it: from the fallback, no abort.
    let fallbacks = PoolAllocator::fallback_allocations();
    let large = vec![9u8; 4 << 20];
    assert_eq!(large[(4 << 20) - 1], 9);
    assert!(PoolAllocator::fallback_allocations() > fallbacks);
    let stats = pool.stats();
    assert!(stats.reserved_bytes <= BUDGET, "{stats}");
    assert!(stats.budget_failures >= 1, "{stats}");

    // Exports of many events are larger than the budget, and leave every figure unchanged.
    for _ in 0..40_000 {
        pool.trace_mark(1);
    }
    let before = pool.stats();
    let events = pool.trace_events();
    let json = pool.trace_json();
    let snapshot = pool.snapshot();
    let after = pool.stats();
    assert!(events.len() >= 40_000 && json.len() > 1 << 20);
    assert!(!snapshot.is_empty());
    assert_eq!(
        (
            before.in_use_bytes,
            before.reserved_bytes,
            before.allocations
        ),
        (after.in_use_bytes, after.reserved_bytes, after.allocations),
        "an export moved the pool's figures"
    );
    assert_eq!(after.peak_in_use_bytes, before.peak_in_use_bytes);
    drop((events, json, snapshot));
    assert_eq!(pool.stats().in_use_bytes, before.in_use_bytes);

    // An in-place `realloc` moves `requested_bytes` with it.
    let layout = Layout::from_size_align(200_000, 8).unwrap();
    // SAFETY: a non-zero size; freed below with the layout `realloc` returned it under.
    unsafe {
        let p = ALLOCATOR.alloc(layout);
        assert!(!p.is_null());
        let asked = pool.stats().requested_bytes;
        let q = ALLOCATOR.realloc(p, layout, 210_000);
        assert_eq!(q, p, "the block holds 210,000 bytes: kept in place");
        assert_eq!(pool.stats().requested_bytes, asked + 10_000);
        ALLOCATOR.dealloc(q, Layout::from_size_align(210_000, 8).unwrap());
    }
    // The tag table is bookkeeping too: many names, none of their memory in the pool.
    let in_use = pool.stats().in_use_bytes;
    let made = (0..20_000)
        .map(|i| ferropool::MemoryTag::new(&format!("tag {i}")))
        .count(); // (no vector of them: 80 KB of tags would go to the pool, rightly)
    assert_eq!(made, 20_000);
    assert_eq!(
        pool.stats().in_use_bytes,
        in_use,
        "the tag table went into the pool"
    );

    drop((small, large));
    let end = pool.stats();
    assert_eq!(end.in_use_bytes, 0, "{end}");
    assert_eq!(end.requested_bytes, 0, "{end}");
    println!("global_budget: ok");
}
