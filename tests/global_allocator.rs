//! `PoolAllocator` installed as the global allocator: a multi-threaded, `Vec`-heavy and re-entrant
//! workload on 8 threads, after which the pool has served the large allocations and holds nothing
//! more than before; budget refusals are served by the fallback and counted in the pool's
//! statistics. (No test harness: the pool is configured before anything allocates.)

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashMap;
use std::sync::Arc;

use ferropool::{BufferPool, MemoryTag, PoolAllocator, PoolConfig, SlotArena, Tensor};

#[global_allocator]
static ALLOCATOR: PoolAllocator = PoolAllocator::new();

const BUDGET: u64 = 1 << 30;

fn main() {
    // A trace ring this large comes from the system allocator directly, not from the pool
    // being configured.
    BufferPool::configure_global(PoolConfig {
        budget: Some(BUDGET),
        trace_capacity: 8192,
        ..PoolConfig::default()
    })
    .expect("configured before first use");
    let pool = PoolAllocator::pool();
    let before = pool.stats();

    workload();

    // Everything the workload allocated went back to the pool.
    let after = pool.stats();
    assert!(
        after.allocations - before.allocations > 1000,
        "the pool served the large allocations: {after}"
    );
    assert_eq!(after.in_use_bytes, before.in_use_bytes, "{after}");
    assert_eq!(
        after.frees - before.frees,
        after.allocations - before.allocations
    );

    // A request the budget refuses is served by the fallback (never a null return, which
    // would abort the program), counted as a budget failure and as a fallback allocation.
    let too_big = Layout::from_size_align(BUDGET as usize, 64).unwrap();
    let fallbacks = PoolAllocator::fallback_allocations();
    // SAFETY: a non-zero size; the result is checked before use and freed with its layout.
    let refused = unsafe { ALLOCATOR.alloc(too_big) };
    assert!(
        !refused.is_null(),
        "the fallback serves what the budget refuses"
    );
    let stats = pool.stats();
    assert_eq!(stats.budget_failures, after.budget_failures + 1);
    assert_eq!(PoolAllocator::fallback_allocations(), fallbacks + 1);
    assert!(stats.reserved_bytes <= BUDGET, "{stats}");
    // SAFETY: from `alloc` with this layout.
    unsafe { ALLOCATOR.dealloc(refused, too_big) };
    // Above the largest class, and more than the system has: null.
    let huge = Layout::from_size_align(1 << 62, 64).unwrap();
    // SAFETY: as above.
    assert!(unsafe { ALLOCATOR.alloc(huge) }.is_null());
    assert_eq!(
        PoolAllocator::fallback_allocations(),
        fallbacks + 1,
        "a request nobody served is no fallback allocation"
    );

    // realloc across the threshold, both ways, keeps the bytes.
    let mut v: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    v.reserve(200_000); // into the pool
    assert_eq!(v[999], (999u32 % 256) as u8);
    v.truncate(500);
    v.shrink_to_fit(); // back to System
    assert_eq!(v[499], (499u32 % 256) as u8);
    drop(v);
    assert_eq!(pool.stats().in_use_bytes, before.in_use_bytes);

    // Alignments up to 4096 are served by the pool, and honoured.
    for align in [8usize, 64, 256, 4096] {
        let layout = Layout::from_size_align(1 << 20, align).unwrap();
        // SAFETY: non-zero size; freed below with the same layout.
        let p = unsafe { ALLOCATOR.alloc_zeroed(layout) };
        assert!(!p.is_null());
        assert_eq!(p as usize % align, 0);
        // SAFETY: `p` holds `1 << 20` zeroed bytes.
        assert!(unsafe { std::slice::from_raw_parts(p, 1 << 20) }
            .iter()
            .all(|&b| b == 0));
        // SAFETY: from `alloc_zeroed` with this layout.
        unsafe { ALLOCATOR.dealloc(p, layout) };
    }
    trace_of_the_global_pool(pool);
    println!(
        "global_allocator: ok ({} allocations served by the pool)",
        after.allocations
    );
}

/// The global pool traced, and its trace read: reading it allocates (through this very
/// pool), which must not happen under the trace's own lock. A deadlock fails the check
/// after ten seconds instead of hanging the run.
fn trace_of_the_global_pool(pool: &'static BufferPool) {
    assert_eq!(pool.config().trace_capacity, 8192);
    assert!(!pool.enable_trace(8192), "traced since `configure_global`");
    let mut held = Vec::new();
    for _ in 0..3000 {
        held.push(vec![1u8; 100 << 10]); // through the pool, each one traced
        if held.len() > 8 {
            held.remove(0);
        }
    }
    drop(held);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let events = pool.trace_events();
        let json = pool.trace_json();
        done.send((events.len(), json.len())).unwrap();
    });
    let (events, json) = finished
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading the global pool's trace deadlocked");
    assert!(events > 4096, "the ring kept the events: {events}");
    assert!(json > events * 100);
}

/// Each of 8 threads: vectors of mixed sizes grown by pushes (so reallocated across the
/// threshold), hash maps, strings, tensors (pool-in-pool: a `BufferPool`'s blocks come from
/// the global allocator), an arena, memory tags, and short-lived threads of its own.
fn workload() {
    let shared: Arc<SlotArena<Vec<f32>>> = Arc::new(SlotArena::new());
    std::thread::scope(|scope| {
        for t in 0..8usize {
            let shared = Arc::clone(&shared);
            scope.spawn(move || {
                let tag = MemoryTag::new(&format!("worker {t}"));
                let _scope = tag.enter();
                let local_pool = BufferPool::new();
                let mut rng = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for round in 0..200 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let n = 1 + (rng % 300_000) as usize;
                    let mut v: Vec<f32> = Vec::new();
                    for i in 0..n {
                        v.push(i as f32);
                    }
                    assert_eq!(v[n - 1], (n - 1) as f32);
                    let mut map: HashMap<usize, String> = HashMap::new();
                    for i in 0..(n % 2000) {
                        map.insert(i, format!("{i}:{round}"));
                    }
                    let tensor =
                        Tensor::from_slice_in(&local_pool, &v[..n.min(50_000)], &[n.min(50_000)])
                            .unwrap();
                    assert_eq!(tensor.numel(), n.min(50_000));
                    let key = shared.insert(v).unwrap();
                    let guard = shared.pin();
                    assert_eq!(shared.get(key, &guard).unwrap().len(), n);
                    shared.remove(key, &guard).unwrap();
                    drop(guard);
                    if round % 50 == 0 {
                        std::thread::spawn(move || {
                            let burst: Vec<Vec<u8>> =
                                (0..16).map(|i| vec![i as u8; 100_000 + i]).collect();
                            assert_eq!(burst[15][99_999], 15);
                        })
                        .join()
                        .unwrap();
                    }
                }
            });
        }
    });
    // Removed vectors still waiting in the arena: dropping it drops them.
    drop(shared);
}
