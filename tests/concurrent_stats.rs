//! What `stats()` promises while other threads allocate, free and trim: no read raises a
//! peak past what was really in use, `peak_reserved_bytes` never goes down nor below a
//! `reserved_bytes` once reported, the default peaks are exact for "reset, run, read", the
//! idle policy counts its rounds, and live threads are never reported as threads without an
//! index. Each test but one fails on a one-CPU machine when its bug is present: the races
//! they provoke need only a preemption, which a single core gives as often as two (the
//! exception, "reset, run, read" under a reader, has a loom model that schedules its race).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferropool::{BufferPool, PoolConfig};

mod common;

/// Sets its flag when dropped, so that threads racing a failed assertion stop too (the test
/// then fails instead of waiting for them).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// How long each racing test provokes its race.
fn race_for() -> Duration {
    Duration::from_millis(if cfg!(miri) { 50 } else { 1500 })
}

#[test]
fn reading_stats_never_raises_a_peak_past_what_was_in_use() {
    let pool = BufferPool::new();
    let stop = AtomicBool::new(false);
    let (to_freer, handed) = mpsc::sync_channel(0);
    let (to_allocator, freed) = mpsc::sync_channel(0);
    let (ready, go) = mpsc::sync_channel(0);
    let (pool, stop) = (&pool, &stop);
    std::thread::scope(|scope| {
        // One thread allocates 4 KiB blocks, another frees each one before the next is
        // allocated: at most 4 KiB is ever in use. The freeing thread uses the pool first,
        // so a read visits its counters before the allocating thread's.
        scope.spawn(move || {
            drop(pool.alloc(4096).unwrap());
            ready.send(()).unwrap();
            while let Ok(buffer) = handed.recv() {
                drop(buffer);
                if to_allocator.send(()).is_err() {
                    break;
                }
            }
        });
        scope.spawn(move || {
            go.recv().unwrap();
            while !stop.load(Ordering::Relaxed) {
                to_freer.send(pool.alloc(4096).unwrap()).unwrap();
                freed.recv().unwrap();
            }
            // Dropping `to_freer` ends the other thread.
        });
        let _stop = StopOnDrop(stop);
        let start = Instant::now();
        let mut reads = 0u64;
        while start.elapsed() < race_for() {
            let stats = pool.stats();
            reads += 1;
            assert!(
                stats.peak_in_use_bytes <= 4096 && stats.in_use_bytes <= 4096,
                "read {reads} reports more than was ever in use:\n{stats}"
            );
            assert!(stats.peak_requested_bytes <= 4096, "{stats}");
        }
        stop.store(true, Ordering::Relaxed);
    });
    let stats = pool.stats();
    assert_eq!(stats.peak_in_use_bytes, 4096, "{stats}");
    assert_eq!(stats.in_use_bytes, 0);
}

#[test]
fn peak_reserved_never_decreases_nor_falls_below_a_reported_reservation() {
    // Round after round on a fresh pool: a block cached on the shared list, one thread
    // reserving a block of another class from the system (huge-page advice: a system call
    // after the reservation), another trimming the cached block away, and this thread
    // reading the statistics. The first time a pool's reservations add up to their most,
    // the peak must follow, whatever the trim does meanwhile.
    let start = Instant::now();
    let mut rounds = 0u64;
    while start.elapsed() < race_for() {
        rounds += 1;
        let pool = BufferPool::with_config(PoolConfig {
            thread_cache_bytes: 0, // frees go to the shared lists, where trim finds them
            ..PoolConfig::default()
        })
        .unwrap();
        drop(pool.alloc(4 << 20).unwrap());
        let go = std::sync::Barrier::new(3);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                go.wait();
                drop(pool.alloc(8 << 20).unwrap());
            });
            scope.spawn(|| {
                go.wait();
                pool.trim();
            });
            go.wait();
            let (mut last_peak, mut highest_reserved) = (0u64, 0u64);
            for _ in 0..64 {
                let stats = pool.stats();
                assert!(
                    stats.peak_reserved_bytes >= last_peak,
                    "round {rounds}: the peak went down from {last_peak} to {}",
                    stats.peak_reserved_bytes
                );
                highest_reserved = highest_reserved.max(stats.reserved_bytes);
                assert!(
                    stats.peak_reserved_bytes >= highest_reserved,
                    "round {rounds}: a reservation of {highest_reserved} was reported, the peak says {}",
                    stats.peak_reserved_bytes
                );
                last_peak = stats.peak_reserved_bytes;
            }
        });
    }
}

#[test]
fn reset_then_run_then_read_gives_the_true_peak() {
    let pool = BufferPool::new();
    drop((pool.alloc(8 << 20).unwrap(), pool.alloc(8 << 20).unwrap())); // now cached
    pool.reset_peak_stats();
    assert_eq!(pool.stats().peak_in_use_bytes, 0);
    let step = (pool.alloc(8 << 20).unwrap(), pool.alloc(8 << 20).unwrap()); // from the cache
    assert_eq!(pool.stats().system_allocations, 2, "served by the cache");
    drop(step);
    let stats = pool.stats();
    assert_eq!(stats.peak_in_use_bytes, 16 << 20, "{stats}");
    assert_eq!(stats.peak_reserved_bytes, 16 << 20, "{stats}");
    assert_eq!(stats.peak_requested_bytes, 0, "not tracked by default");

    // With the requested bytes counted exactly too, their peak is as true.
    let pool = BufferPool::with_config(PoolConfig {
        exact_requested: true,
        ..PoolConfig::default()
    })
    .unwrap();
    drop(pool.alloc(8 << 20).unwrap());
    pool.reset_peak_stats();
    let step = (pool.alloc(8 << 20).unwrap(), pool.alloc(1000).unwrap());
    drop(step);
    assert_eq!(pool.stats().peak_requested_bytes, (8 << 20) + 1000);
}

/// "Reset, run, read" while another thread reads the statistics in a loop (each read raises
/// the peak with the bytes in use it read): steps of 1 to 4 blocks of 64 KiB, 3,000 of them
/// at least and for `race_for`; each read of the peak after a step is that step's high-water mark. (A read that loaded the
/// bytes in use between an allocation's add and its raise once raised the peak after the
/// next reset, with the step before's figure: about 1 run in 100 reported it. Put back, this
/// test failed 2 runs in 3 on two cores; on one core the race needs the allocating thread
/// preempted between its add and its raise, which the loom model
/// `the_peak_since_a_reset_is_exact_under_a_reader` schedules on any machine.)
#[test]
fn reset_run_read_is_exact_while_another_thread_reads() {
    let pool = BufferPool::new();
    let stop = AtomicBool::new(false);
    let (pool, stop) = (&pool, &stop);
    let block = BufferPool::class_size_for(64 << 10).unwrap() as u64;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::hint::black_box(pool.stats());
            }
        });
        let _stop = StopOnDrop(stop);
        let started = Instant::now();
        for round in 0.. {
            if round >= 3_000 && started.elapsed() > race_for() {
                break;
            }
            let blocks = 1 + round % 4;
            pool.reset_peak_stats();
            let step: Vec<_> = (0..blocks).map(|_| pool.alloc(64 << 10).unwrap()).collect();
            drop(step);
            let peak = pool.stats().peak_in_use_bytes;
            assert_eq!(
                peak,
                blocks as u64 * block,
                "round {round}: a step of {blocks} blocks read a peak of {peak}"
            );
        }
    });
}

#[test]
fn an_idle_thread_keeps_its_cache_for_idle_rounds_calls() {
    let pool = BufferPool::with_config(PoolConfig {
        idle_rounds: 4,
        ..PoolConfig::default()
    })
    .unwrap();
    // A worker caches 64 KiB and goes idle (its cache stays in the pool after it exits).
    std::thread::scope(|scope| {
        scope.spawn(|| drop(pool.alloc(64 << 10).unwrap()));
    });
    assert_eq!(pool.stats().cached_in_threads_bytes, 64 << 10);
    let released: Vec<u64> = (0..6).map(|_| pool.trim_idle()).collect();
    // The first call sees the worker's operations; the next four are idle rounds; the
    // fourth of them releases the cache.
    assert_eq!(released, [0, 0, 0, 0, 64 << 10, 0]);
    assert_eq!(pool.stats().cached_in_threads_bytes, 0);
}

#[test]
fn live_threads_are_never_reported_without_an_index() {
    const WITHOUT_INDEX: u32 = u32::MAX - 1;
    let pool = BufferPool::new();
    pool.enable_trace(1 << 16);
    let mut held = Vec::new();
    let start = Instant::now();
    while start.elapsed() < race_for() {
        // Threads claim their index (their first pool operation) while the threads of the
        // round before exit and give theirs back, under the same lock.
        let (sent, blocks) = mpsc::channel();
        for _ in 0..32 {
            let (pool, sent) = (pool.clone(), sent.clone());
            std::thread::spawn(move || sent.send(pool.alloc(64).unwrap()).unwrap());
        }
        drop(sent);
        held.extend(blocks.iter());
        let snapshot = pool.snapshot();
        assert!(
            snapshot.iter().all(|block| block.thread != WITHOUT_INDEX),
            "a live thread's block is reported as a thread without an index"
        );
        held.clear();
    }
    assert!(pool
        .trace_events()
        .iter()
        .all(|event| event.thread != WITHOUT_INDEX));
}

#[test]
fn a_read_never_counts_more_frees_than_allocations() {
    // The allocating thread uses the pool first, so a read visits its counters before the
    // freeing thread's: a read that took each thread's counters in one pass counted frees of
    // blocks whose allocation it had not seen.
    let pool = BufferPool::new();
    let stop = AtomicBool::new(false);
    let (to_freer, handed) = mpsc::sync_channel::<ferropool::PoolBuffer>(0);
    let (pool, stop) = (&pool, &stop);
    std::thread::scope(|scope| {
        let (ready, go) = mpsc::sync_channel(0);
        scope.spawn(move || {
            drop(pool.alloc(4096).unwrap());
            ready.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                to_freer.send(pool.alloc(4096).unwrap()).unwrap();
            }
        });
        go.recv().unwrap();
        scope.spawn(move || handed.iter().for_each(drop));
        let _stop = StopOnDrop(stop);
        let start = Instant::now();
        while start.elapsed() < race_for() {
            let stats = pool.stats();
            assert!(
                stats.frees <= stats.allocations
                    && stats.freed_bytes_total <= stats.allocated_bytes_total,
                "more frees than allocations:\n{stats}"
            );
        }
    });
}

/// A pool's first user counts alone (plain stores); the exact counts carry over when a
/// second thread starts counting, and the first user's later counts add to theirs.
#[test]
fn exact_counts_carry_over_when_a_second_thread_starts_counting() {
    let pool = BufferPool::with_config(PoolConfig {
        exact_requested: true,
        ..PoolConfig::default()
    })
    .unwrap();
    let class = |size| BufferPool::class_size_for(size).unwrap() as u64;
    let first = pool.alloc(4096).unwrap(); // the sole writer from here on
    let second = pool.alloc(1000).unwrap();
    let kept = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let stats = pool.stats();
                assert_eq!(stats.in_use_bytes, class(4096) + class(1000), "{stats}");
                let kept = pool.alloc(100_000).unwrap(); // shares the counters
                drop(pool.alloc(64).unwrap());
                kept
            })
            .join()
            .unwrap()
    });
    let stats = pool.stats();
    let held = class(4096) + class(1000) + class(100_000);
    assert_eq!(stats.in_use_bytes, held, "{stats}");
    assert_eq!(stats.peak_in_use_bytes, held + class(64), "{stats}");
    assert_eq!(stats.requested_bytes, 4096 + 1000 + 100_000, "{stats}");
    drop(first); // counted by the first user, now with read-modify-writes
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, held - class(4096), "{stats}");

    drop((kept, second));
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats}");
    assert_eq!(stats.requested_bytes, 0, "{stats}");
    assert_eq!(stats.peak_in_use_bytes, held + class(64), "{stats}");
}

/// A thread whose thread-locals are being destroyed (it holds no thread index any more)
/// frees a block of a pool whose sole writer is another thread: it counts without a cache,
/// after making the counters shared, and nothing is lost.
#[test]
fn a_free_without_a_cache_ends_the_sole_writers_counting() {
    let pool = BufferPool::new();
    let class = |size| BufferPool::class_size_for(size).unwrap() as u64;
    let late = pool.alloc(100_000).unwrap(); // this thread: the sole writer
    let kept = pool.alloc(4096).unwrap();
    let other = BufferPool::new();
    std::thread::spawn(move || {
        // Held before the thread claims its index, so dropped after the index is given
        // back: the free has no cache.
        common::drop_at_thread_exit(late);
        drop(other.alloc(64).unwrap());
    })
    .join() // (unlike a scope's end, `join` waits for the thread-local destructors)
    .unwrap();
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, class(4096), "{stats}");
    assert_eq!(stats.frees, 1, "{stats}");
    drop(kept); // counted with a read-modify-write now
    drop(pool.alloc(64).unwrap());
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "{stats}");
    assert_eq!(
        stats.peak_in_use_bytes,
        class(100_000) + class(4096),
        "{stats}"
    );
}
