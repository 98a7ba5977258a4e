//! `BufferPool` behaviour through the public API.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_pool_consistent, scaled};
use ferropool::{BufferPool, PoolConfig, PoolError, PoolEventKind};

#[test]
fn pool_and_buffers_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<BufferPool>();
    assert_send_sync::<ferropool::PoolBuffer>();
}

#[test]
fn buffers_are_aligned_and_sized_by_class() {
    for alignment in [8usize, 64, 256, 4096] {
        let pool = BufferPool::with_config(PoolConfig {
            alignment,
            ..PoolConfig::default()
        })
        .unwrap();
        for size in [1usize, 7, 64, 65, 1000, 4096, 100_000, 3 << 20] {
            let buffer = pool.alloc(size).unwrap();
            assert_eq!(buffer.as_ptr() as usize % alignment, 0, "size {size}");
            assert_eq!(buffer.len(), size);
            assert!(buffer.capacity() >= size);
            assert_eq!(Some(buffer.capacity()), BufferPool::class_size_for(size));
            if size >= 64 {
                assert!(buffer.capacity() - size <= size / 8, "size {size}");
            }
        }
        assert_pool_consistent(&pool.stats());
    }
}

#[test]
fn freed_buffer_is_reused_from_the_thread_cache() {
    let pool = BufferPool::new();
    let first = pool.alloc(10_000).unwrap();
    let addr = first.as_ptr();
    drop(first);
    let second = pool.alloc(9_500).unwrap(); // same class (10_240)
    assert_eq!(second.as_ptr(), addr);
    let stats = pool.stats();
    assert_eq!(stats.allocations, 2);
    assert_eq!(stats.cache_hits, 1);
    assert_eq!(stats.system_allocations, 1);
    assert_eq!(stats.in_use_bytes, 10_240);
    assert_eq!(stats.requested_bytes, 9_500);
    assert_eq!(stats.rounding_waste_bytes(), 740);
    assert_pool_consistent(&stats);
}

#[test]
fn alloc_zeroed_never_shows_old_bytes() {
    let pool = BufferPool::new();
    let mut dirty = pool.alloc(4096).unwrap();
    assert!(
        dirty.as_bytes().is_none(),
        "fresh bytes are not readable before a write"
    );
    dirty.fill(0xAB);
    assert!(dirty.as_bytes().unwrap().iter().all(|&b| b == 0xAB));
    let addr = dirty.as_ptr();
    drop(dirty);
    let clean = pool.alloc_zeroed(4096).unwrap();
    assert_eq!(clean.as_ptr(), addr, "the block was reused");
    assert!(clean.as_bytes().unwrap().iter().all(|&b| b == 0));
}

#[test]
fn budget_failure_is_typed_and_leaves_the_pool_usable() {
    let pool = BufferPool::with_config(PoolConfig {
        budget: Some(1 << 20),
        ..PoolConfig::default()
    })
    .unwrap();
    let held = pool.alloc(600 << 10).unwrap();
    let err = pool.alloc(600 << 10).unwrap_err();
    match &err {
        PoolError::BudgetExceeded(report) => {
            assert_eq!(report.requested, 600 << 10);
            assert_eq!(
                report.block_bytes,
                BufferPool::class_size_for(600 << 10).unwrap()
            );
            assert_eq!(report.budget, Some(1 << 20));
            assert_eq!(report.in_use, held.capacity() as u64);
            assert_eq!(report.cached_in_threads + report.cached_in_lists, 0);
            assert_eq!(report.reserved, held.capacity() as u64);
        }
        other => panic!("expected BudgetExceeded, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("raise PoolConfig::budget"), "{message}");
    assert!(message.contains("cannot allocate 600.00 KiB"), "{message}");
    assert!(message.contains("budget of 1.00 MiB"), "{message}");
    let before = pool.stats();
    assert_eq!(before.budget_failures, 1);
    assert_eq!(
        before.alloc_retries, 1,
        "one retry after releasing the caches"
    );
    assert_eq!(before.allocations, 1, "a failed allocation is not counted");
    assert_pool_consistent(&before);
    drop(held);
    // A different class: the cached 600 KiB block must be released to make room.
    let again = pool.alloc(900 << 10).unwrap();
    assert_eq!(again.len(), 900 << 10);
    let after = pool.stats();
    assert!(after.reserved_bytes <= 1 << 20);
    assert_eq!(
        after.system_frees, 1,
        "the cached block was released for the budget"
    );
    assert_pool_consistent(&after);
}

#[test]
fn buffers_come_back_from_other_threads() {
    let pool = BufferPool::new();
    let buffers: Vec<_> = (0..16).map(|_| pool.alloc(64 << 10).unwrap()).collect();
    let reserved = pool.stats().reserved_bytes;
    // Another thread frees them all: they go to the shared lists, not its own cache.
    std::thread::spawn(move || drop(buffers)).join().unwrap();
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.frees, 16);
    assert_eq!(stats.cached_bytes, reserved);
    assert_eq!(stats.cached_in_lists_bytes, reserved);
    assert_pool_consistent(&stats);
    // This thread reuses them without asking the system.
    let again: Vec<_> = (0..16).map(|_| pool.alloc(64 << 10).unwrap()).collect();
    let stats = pool.stats();
    assert_eq!(stats.system_allocations, 16);
    assert_eq!(stats.reserved_bytes, reserved);
    drop(again);
}

#[test]
fn flushed_thread_cache_serves_other_threads() {
    let pool = BufferPool::new();
    let class = BufferPool::class_size_for(10_000).unwrap() as u64;
    let moved = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                drop(pool.alloc(10_000).unwrap());
                drop(pool.alloc(10_000).unwrap()); // the same block, from the cache
                let moved = pool.flush_thread_cache();
                assert_eq!(pool.flush_thread_cache(), 0, "already flushed");
                moved
            })
            .join()
            .unwrap()
    });
    assert_eq!(moved, class);
    let stats = pool.stats();
    assert_eq!(stats.cached_bytes, class);
    assert_eq!(
        (stats.allocations, stats.frees, stats.cache_hits),
        (2, 2, 1)
    );
    let again = pool.alloc(10_000).unwrap(); // from the shared list, not the system
    assert_eq!(pool.stats().system_allocations, 1);
    drop(again);
    assert_pool_consistent(&pool.stats());
}

#[test]
fn trim_idle_releases_only_classes_left_undrawn() {
    let pool = BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 0, // frees go to the shared lists, allocations draw from them
        idle_rounds: 2,
        ..PoolConfig::default()
    })
    .unwrap();
    let small = BufferPool::class_size_for(4096).unwrap() as u64;
    let large = BufferPool::class_size_for(1 << 20).unwrap() as u64;
    drop((pool.alloc(4096).unwrap(), pool.alloc(1 << 20).unwrap()));
    assert_eq!(pool.stats().cached_bytes, small + large);
    // The large class was last drawn before the first call: it is kept through two calls
    // (idle_rounds) and released by the third. The small class is drawn every round.
    let mut released = Vec::new();
    for _ in 0..4 {
        drop(pool.alloc(4096).unwrap());
        released.push(pool.trim_idle());
    }
    assert_eq!(released, [0, 0, large, 0]);
    let stats = pool.stats();
    assert_eq!(stats.cached_bytes, small);
    assert_eq!((stats.system_allocations, stats.system_frees), (2, 1));
    assert_eq!(stats.trims, 0, "an idle trim is not a full trim");
    assert_pool_consistent(&stats);
}

#[test]
fn trim_idle_takes_the_caches_of_idle_threads_only() {
    let pool = BufferPool::with_config(PoolConfig {
        idle_rounds: 0,
        ..PoolConfig::default()
    })
    .unwrap();
    drop(pool.alloc(4096).unwrap()); // in this thread's cache, not on a list
    assert_eq!(
        pool.trim_idle(),
        0,
        "this thread was active since the last round"
    );
    let again = pool.alloc(4096).unwrap();
    assert_eq!(
        pool.stats().cache_hits,
        1,
        "the cached block survived the idle trim"
    );
    drop(again);
    pool.trim_idle(); // a round with this thread active
    assert_eq!(
        pool.trim_idle(),
        4096,
        "no operation for a whole round: released"
    );
    assert_eq!(pool.stats().cached_bytes, 0);
}

#[test]
fn trim_releases_cached_memory() {
    let pool = BufferPool::new();
    let buffers: Vec<_> = (1..=20).map(|i| pool.alloc(i * 10_000).unwrap()).collect();
    drop(buffers);
    let before = pool.stats();
    assert!(before.reserved_bytes > 0);
    assert_eq!(before.cached_bytes, before.reserved_bytes);
    let released = pool.trim();
    assert_eq!(released, before.reserved_bytes);
    let after = pool.stats();
    assert_eq!(after.reserved_bytes, 0);
    assert_eq!(after.cached_bytes, 0);
    assert_eq!(after.system_frees, 20);
    assert_eq!(after.trims, 1);
}

#[test]
fn trim_takes_an_idle_threads_cache_at_once() {
    let pool = BufferPool::new();
    let (go, wait) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<()>();
    let p = pool.clone();
    let worker = std::thread::spawn(move || {
        drop(p.alloc(100_000).unwrap()); // cached in this thread
        done.send(()).unwrap();
        wait.recv().unwrap(); // idle: it never touches the pool again
    });
    finished.recv().unwrap();
    let cached = pool.stats().cached_in_threads_bytes;
    assert!(cached >= 100_000);
    assert_eq!(
        pool.trim(),
        cached,
        "the idle thread's cache went back at once"
    );
    let stats = pool.stats();
    assert_eq!((stats.cached_bytes, stats.reserved_bytes), (0, 0));
    assert_pool_consistent(&stats);
    go.send(()).unwrap();
    worker.join().unwrap();
}

/// Under budget pressure, blocks cached by other (idle) threads are reclaimed before a request
/// is refused.
#[test]
fn budget_pressure_reclaims_other_threads_caches() {
    let pool = BufferPool::with_config(PoolConfig {
        budget: Some(1 << 20),
        ..PoolConfig::default()
    })
    .unwrap();
    let (go, wait) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<()>();
    let p = pool.clone();
    let worker = std::thread::spawn(move || {
        drop(p.alloc(1 << 20).unwrap()); // 1 MiB, cached by this thread
        done.send(()).unwrap();
        wait.recv().unwrap();
    });
    finished.recv().unwrap();
    assert_eq!(pool.stats().cached_in_threads_bytes, 1 << 20);
    let mine = pool
        .alloc(1 << 20)
        .expect("the worker's cached block made room");
    let stats = pool.stats();
    assert_eq!(stats.alloc_retries, 1);
    assert_eq!(stats.budget_failures, 0);
    assert_eq!(stats.reserved_bytes, 1 << 20);
    drop(mine);
    go.send(()).unwrap();
    worker.join().unwrap();
}

#[test]
fn counters_add_up_after_multithreaded_stress() {
    let pool = BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 1 << 20,
        thread_cache_blocks_per_class: 4,
        ..PoolConfig::default()
    })
    .unwrap();
    let rounds = scaled(2_000);
    let (tx, rx) = mpsc::sync_channel::<ferropool::PoolBuffer>(64);
    let rx = Arc::new(std::sync::Mutex::new(rx));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (pool, tx, rx) = (pool.clone(), tx.clone(), Arc::clone(&rx));
            std::thread::spawn(move || {
                let mut rng = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut mine = Vec::new();
                for _ in 0..rounds {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let size = 1 + (rng % 300_000) as usize;
                    let mut buffer = pool.alloc(size).unwrap();
                    buffer.fill(t as u8);
                    match rng % 4 {
                        0 => {
                            // Hand it to whichever thread receives next (a cross-thread free).
                            if tx.try_send(buffer).is_err() {
                                // full: drop it here
                            }
                        }
                        1 => mine.push(buffer),
                        _ => drop(buffer),
                    }
                    if let Ok(foreign) = rx.lock().unwrap().try_recv() {
                        let bytes = foreign.as_bytes().unwrap();
                        let first = bytes[0];
                        assert_eq!(
                            (bytes[bytes.len() / 2], bytes[bytes.len() - 1]),
                            (first, first)
                        );
                        drop(foreign);
                    }
                    if mine.len() > 8 {
                        mine.clear();
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for thread in threads {
        thread.join().unwrap();
    }
    drop(rx); // drops any buffer still in flight
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats:#?}");
    assert_eq!(stats.requested_bytes, 0);
    assert_eq!(stats.allocations, stats.frees);
    assert_eq!(stats.allocations, 8 * rounds as u64);
    assert_pool_consistent(&stats);
    assert!(stats.peak_reserved_bytes >= stats.reserved_bytes);
    // Memory is still reserved exactly when some block has not gone back to the system.
    assert_eq!(
        stats.reserved_bytes == 0,
        stats.system_allocations == stats.system_frees
    );
    pool.trim();
    let trimmed = pool.stats();
    assert_eq!(trimmed.reserved_bytes, 0);
    assert_eq!(trimmed.system_allocations, trimmed.system_frees);
}

#[test]
fn trace_records_a_bounded_ring() {
    let pool = BufferPool::with_config(PoolConfig {
        trace_capacity: 8,
        ..PoolConfig::default()
    })
    .unwrap();
    for _ in 0..3 {
        drop(pool.alloc(1000).unwrap());
    }
    let events = pool.trace_events();
    let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            PoolEventKind::SystemAlloc,
            PoolEventKind::Alloc,
            PoolEventKind::Free,
            PoolEventKind::Alloc,
            PoolEventKind::Free,
            PoolEventKind::Alloc,
            PoolEventKind::Free,
        ]
    );
    assert!(events.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
    assert!(events.iter().all(|e| e.bytes == 1024));
    assert_eq!(events.last().unwrap().in_use_after, 0);
    assert_eq!(events.last().unwrap().reserved_after, 1024);
    for _ in 0..10 {
        drop(pool.alloc(64).unwrap());
    }
    assert_eq!(pool.trace_events().len(), 8, "the ring keeps the newest 8");
    let json: serde_json::Value = serde_json::from_str(&pool.trace_json()).unwrap();
    let records = json["traceEvents"].as_array().unwrap();
    let phase = |ph: &str| records.iter().filter(|e| e["ph"] == ph).count();
    assert_eq!(phase("i"), 8, "an instant per event kept: {json}");
    assert_eq!(phase("C"), 8, "and a counter sample: {json}");
    assert!(
        BufferPool::new().trace_events().is_empty(),
        "off by default"
    );
}

/// `trace_events` is oldest first when threads record at once: each event's time is taken
/// under the ring's lock. (Taken before it, a thread preempted between reading the clock and
/// taking the lock pushes its event after newer ones. With two CPUs the first round shows
/// it; with one, a preemption must land in that window, which the first round or two of
/// 65,536 events show here, so rounds repeat on fresh pools for up to a second.)
#[test]
fn concurrent_trace_events_are_oldest_first() {
    const THREADS: usize = 4;
    const CAPACITY: usize = 65_536;
    let per_thread = scaled(CAPACITY / THREADS);
    let budget = if cfg!(miri) {
        Duration::ZERO
    } else {
        Duration::from_secs(1)
    };
    let started = Instant::now();
    let mut rounds = 0;
    loop {
        let pool = BufferPool::new();
        assert!(pool.enable_trace(CAPACITY));
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let pool = &pool;
                scope.spawn(move || {
                    // No yields: on one CPU only an involuntary preemption (a thread that
                    // used up its time slice) can land between the clock and the lock.
                    for i in 0..per_thread {
                        pool.trace_mark((t * per_thread + i) as u64);
                    }
                });
            }
        });
        let events = pool.trace_events();
        assert_eq!(
            events.len(),
            THREADS * per_thread,
            "the ring kept every event"
        );
        rounds += 1;
        if let Some(at) = events.windows(2).position(|w| w[0].at_ns > w[1].at_ns) {
            panic!(
                "round {rounds}: event {at} at {} ns before event {} at {} ns",
                events[at].at_ns,
                at + 1,
                events[at + 1].at_ns
            );
        }
        if started.elapsed() >= budget {
            break;
        }
    }
}

#[test]
fn bad_input_is_typed() {
    let bad = BufferPool::with_config(PoolConfig {
        alignment: 48,
        ..PoolConfig::default()
    });
    assert!(matches!(
        bad,
        Err(PoolError::InvalidConfig {
            field: "alignment",
            value: 48,
            ..
        })
    ));
    // A ring is allocated in full when tracing starts, so its size is bounded.
    let huge_trace = BufferPool::with_config(PoolConfig {
        trace_capacity: usize::MAX,
        ..PoolConfig::default()
    });
    assert!(matches!(
        huge_trace,
        Err(PoolError::InvalidConfig {
            field: "trace_capacity",
            ..
        })
    ));
    let pool = BufferPool::new();
    assert!(
        pool.enable_trace(usize::MAX),
        "cut to the maximum, not refused"
    );
    assert!(matches!(
        pool.alloc(usize::MAX),
        Err(PoolError::TooLarge { .. })
    ));
    let mut buffer = pool.alloc(4).unwrap();
    assert_eq!(
        buffer.copy_from_slice(&[1, 2, 3]),
        Err(PoolError::LengthMismatch {
            expected: 4,
            found: 3
        })
    );
    assert!(buffer.as_bytes().is_none(), "a refused copy writes nothing");
    buffer.copy_from_slice(&[1, 2, 3, 4]).unwrap();
    assert_eq!(buffer.as_bytes().unwrap(), &[1, 2, 3, 4]);
    assert_eq!(pool.stats().allocations, 1);
}

#[test]
fn free_from_a_thread_local_destructor_does_not_panic() {
    let pool = BufferPool::new();
    let p = pool.clone();
    std::thread::spawn(move || {
        let buffer = p.alloc(5000).unwrap();
        drop(p.alloc(10).unwrap()); // this thread's cache first
        common::drop_at_thread_exit(buffer);
    })
    .join()
    .unwrap();
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.frees, 2);
    assert_pool_consistent(&stats);
}

/// A free from a thread without an index (its thread-locals being destroyed) honours a
/// budget lowered below what the pool holds, as the other free paths do: the block goes back
/// to the system, not to the shared lists, so the pool's free memory stays within the budget.
#[test]
fn a_free_without_an_index_honours_a_lowered_budget() {
    let pool = BufferPool::new();
    let late = pool.alloc(100 << 10).unwrap(); // below the blocks that merge on their free
    pool.set_budget(Some(0));
    let other = BufferPool::new();
    std::thread::spawn(move || {
        // Held before the thread claims its index (its first pool operation, on another
        // pool), so dropped after the index is given back: the free has no cache.
        common::drop_at_thread_exit(late);
        drop(other.alloc(64).unwrap());
    })
    .join()
    .unwrap();
    let stats = pool.stats();
    assert_eq!(stats.frees, 1, "{stats}");
    assert_eq!(
        stats.reserved_bytes, 0,
        "the block stayed cached over the budget: {stats}"
    );
    assert_pool_consistent(&stats);
}

#[test]
fn global_pool_is_shared() {
    let a = BufferPool::global();
    let b = BufferPool::global();
    let buffer = a.alloc(123).unwrap();
    assert!(b.stats().in_use_bytes >= 128);
    drop(buffer);
}

/// A buffer allocated by a thread without a slot (in a thread-local destructor, after the
/// thread gave its index back) and freed by a thread with one: the exact counters count it
/// in and out like any other.
#[test]
fn exact_peaks_count_a_slotless_allocation() {
    use std::cell::RefCell;
    struct AllocOnExit(BufferPool, std::sync::mpsc::Sender<ferropool::PoolBuffer>);
    impl Drop for AllocOnExit {
        fn drop(&mut self) {
            self.1.send(self.0.alloc(1000).unwrap()).unwrap();
        }
    }
    thread_local! {
        static ON_EXIT: RefCell<Option<AllocOnExit>> = const { RefCell::new(None) };
    }
    let pool = BufferPool::with_config(PoolConfig {
        exact_peaks: true,
        ..PoolConfig::default()
    })
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = pool.clone();
    std::thread::spawn(move || {
        // Registered before the thread's first pool operation, so destroyed after the
        // thread's index is given back: the allocation in it has no slot.
        ON_EXIT.with(|slot| *slot.borrow_mut() = Some(AllocOnExit(worker.clone(), tx)));
        drop(worker.alloc(8).unwrap());
    })
    .join()
    .unwrap();
    let slotless = rx.recv().unwrap();
    assert!(pool.snapshot().iter().any(|b| b.thread == u32::MAX - 1));
    assert_eq!(
        pool.stats().peak_in_use_bytes,
        1024,
        "the slotless block counted in"
    );
    drop(slotless);
    assert_eq!(pool.stats().in_use_bytes, 0);
    // Counted out again: a small allocation now must not find the exact count below zero
    // (it wrapped to about 2^64 and became the peak).
    let held = pool.alloc(100).unwrap();
    assert_eq!(pool.stats().peak_in_use_bytes, 1024);
    drop(held);
}

/// A request the budget refuses releases listed blocks, largest first, only until it fits:
/// the smaller cached block stays for the requests that come next (every cached block went
/// back before, and the next step faulted it in again). Blocks from the heap (`os_pages`
/// off): under a budget, the page layer's blocks of 256 KiB and more are not listed at all,
/// they go back to it when freed.
#[test]
fn a_refused_request_releases_only_what_it_needs() {
    const MIB: usize = 1 << 20;
    let class = |size| BufferPool::class_size_for(size).unwrap();
    let (small, large, asked) = (class(MIB), class(2 * MIB), class(3 * MIB / 2));
    assert!(
        small < asked && asked < large,
        "three classes: {small} {asked} {large}"
    );
    let pool = BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 0,                // every free goes to the shared lists
        budget: Some((large + asked) as u64), // room for `asked` beside `small` once `large` goes
        os_pages: false,
        ..PoolConfig::default()
    })
    .unwrap();
    drop((pool.alloc(MIB).unwrap(), pool.alloc(2 * MIB).unwrap()));
    let before = pool.stats();
    assert_eq!(before.cached_bytes, (small + large) as u64);
    let served = pool.alloc(3 * MIB / 2).unwrap();
    let after = pool.stats();
    assert_eq!(
        (after.system_frees - before.system_frees, after.cached_bytes),
        (1, small as u64),
        "the large block only: {after:?}"
    );
    drop(served);
}

/// Blocks from the heap (`os_pages` off), listed as the page layer's large blocks are not
/// under a budget (see above).
#[test]
fn trim_and_a_refused_request_reach_blocks_another_thread_listed() {
    const MIB: usize = 1 << 20;
    let pool = BufferPool::with_config(PoolConfig {
        budget: Some(8 * MIB as u64),
        os_pages: false,
        ..PoolConfig::default()
    })
    .unwrap();
    // Blocks freed by another thread go to that thread's shard of the shared lists.
    let free_elsewhere = |buffers: Vec<ferropool::PoolBuffer>| {
        std::thread::spawn(move || drop(buffers)).join().unwrap();
    };
    free_elsewhere((0..4).map(|_| pool.alloc(2 * MIB).unwrap()).collect());
    assert_eq!(pool.stats().cached_in_lists_bytes, 8 * MIB as u64);
    // A request of another class that the budget refuses releases two of them, no more.
    let served = pool.alloc(4 * MIB).unwrap();
    let stats = pool.stats();
    assert_eq!(
        (stats.system_frees, stats.cached_in_lists_bytes),
        (2, 4 * MIB as u64),
        "{stats:?}"
    );
    free_elsewhere(vec![served]);
    assert_eq!(pool.trim(), 8 * MIB as u64);
    let stats = pool.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.cached_bytes),
        (0, 0),
        "{stats:?}"
    );
    assert_pool_consistent(&stats);
}

/// A pool whose frees go straight to the shared lists (no thread caches).
fn uncached(larger_blocks: bool) -> BufferPool {
    BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 0,
        larger_blocks,
        ..PoolConfig::default()
    })
    .unwrap()
}

#[test]
fn a_request_takes_a_listed_block_at_most_a_quarter_larger() {
    const MIB: usize = 1 << 20;
    let pool = uncached(true);
    let one = BufferPool::class_size_for(MIB).unwrap();
    let next = BufferPool::class_size_for(one + 1).unwrap(); // 1.125 MiB
    let list_two = |pool: &BufferPool, size| {
        let (a, b) = (pool.alloc(size).unwrap(), pool.alloc(size).unwrap());
        drop((a, b));
    };
    // A lone listed block is left to its own class.
    drop(pool.alloc(next).unwrap());
    let own = pool.alloc(MIB).unwrap();
    assert_eq!(own.capacity(), one, "the larger class's only block stays");
    drop(own);
    let pool = uncached(true);
    list_two(&pool, next);
    let borrowed = pool.alloc(MIB).unwrap();
    assert_eq!(borrowed.capacity(), next, "served by a spare larger block");
    assert_eq!(borrowed.len(), MIB);
    let stats = pool.stats();
    assert_eq!(stats.system_allocations, 2);
    assert_eq!(
        stats.in_use_bytes, next as u64,
        "counted as the block it is"
    );
    drop(borrowed);
    // The block went back to its own class: two requests of that class find both.
    list_two(&pool, next);
    assert_eq!(pool.stats().system_allocations, 2);
    assert_pool_consistent(&pool.stats());

    // More than a quarter larger: not taken.
    let pool = uncached(true);
    list_two(&pool, MIB + MIB / 2);
    let own = pool.alloc(MIB).unwrap();
    assert_eq!(own.capacity(), one);
    assert_eq!(pool.stats().system_allocations, 3);
    drop(own);
    assert_pool_consistent(&pool.stats());
}

#[test]
fn larger_blocks_off_keeps_every_request_in_its_class() {
    const MIB: usize = 1 << 20;
    let pool = uncached(false);
    let one = BufferPool::class_size_for(MIB).unwrap();
    let (a, b) = (pool.alloc(one + 1).unwrap(), pool.alloc(one + 1).unwrap());
    drop((a, b));
    let own = pool.alloc(MIB).unwrap();
    assert_eq!(own.capacity(), one);
    assert_eq!(pool.stats().system_allocations, 3);
}

#[test]
fn a_thread_cache_keeps_its_blocks_for_their_own_class() {
    let pool = BufferPool::new();
    let small = BufferPool::class_size_for(64 << 10).unwrap();
    let larger = BufferPool::class_size_for(small + 1).unwrap();
    let (a, b) = (pool.alloc(larger).unwrap(), pool.alloc(larger).unwrap());
    drop((a, b)); // cached in this thread's bin
    let buffer = pool.alloc(small).unwrap();
    assert_eq!(buffer.capacity(), small);
    assert_eq!(pool.stats().system_allocations, 3);
}

#[test]
fn a_budgeted_pool_keeps_each_request_to_its_own_class() {
    // Borrowing here would leave the 1.25 MiB class short, and its next block would not fit
    // the budget, though every request fits with each class served by its own blocks.
    const MIB: usize = 1 << 20;
    let larger = MIB + MIB / 4;
    let pool = BufferPool::with_config(PoolConfig {
        budget: Some((2 * larger + MIB) as u64),
        thread_cache_bytes: 0, // every class on the shared lists alone
        ..PoolConfig::default()
    })
    .unwrap();
    drop((pool.alloc(larger).unwrap(), pool.alloc(larger).unwrap()));
    let own = pool.alloc(MIB).unwrap();
    assert_eq!(own.capacity(), MIB, "no block lent under a budget");
    let both = (pool.alloc(larger).unwrap(), pool.alloc(larger).unwrap());
    drop((own, both));
    assert_pool_consistent(&pool.stats());
}

#[test]
fn a_cached_class_never_borrows_blocks_the_caches_skip() {
    const MIB: usize = 1 << 20; // the largest class the thread caches keep, by default
    let pool = BufferPool::new();
    let uncached = BufferPool::class_size_for(MIB + 1).unwrap();
    let listed: Vec<_> = (0..3).map(|_| pool.alloc(uncached).unwrap()).collect();
    drop(listed);
    for _ in 0..10 {
        let buffer = pool.alloc(MIB).unwrap();
        assert_eq!(buffer.capacity(), MIB);
    }
    let stats = pool.stats();
    assert_eq!(
        stats.cache_hits, 9,
        "the 1 MiB class is served by its bin: {stats:?}"
    );
}
