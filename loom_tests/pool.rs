//! Loom models of the `BufferPool` protocols: the lock-free class lists under cross-thread
//! frees, allocations and trims; a thread's cache drained by another thread while its owner
//! works (the asymmetric handshake, with both fences `SeqCst` under loom); frees that reach
//! the thread that allocated; and the pool's close and the freeing of its control block.
//!
//! Where a model races the main thread against a spawned one, the main thread yields first:
//! loom starts from the schedule in which the spawning thread runs on, and within a bound of
//! two preemptions it would otherwise never let the worker get ahead far enough for the race
//! (a planted bug went uncaught without the yield).
//!
//! The pool's blocks, pages and control block go through loom's tracking allocator here, so
//! any model that ends with one neither in use nor returned fails ("Allocation leaked"), and
//! a double release fails too. Each model names the property it checks and the bug it
//! catches: a patch in `loom_tests/planted/` that `scripts/loom.sh --planted` applies to a
//! scratch copy of the crate.
#![cfg(loom)]

mod common;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use ferropool::{BufferPool, PoolConfig, PoolStats};

/// A trim visits every class list (280 classes in each of the 2 shards under loom), each a
/// load and a compare-exchange.
fn model(f: impl Fn() + Send + Sync + 'static) {
    common::model(20_000, f);
}

fn pool() -> BufferPool {
    BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 0,
        ..PoolConfig::default()
    })
    .unwrap()
}

/// A pool whose threads cache freed blocks. Its requests keep to their own class: a miss
/// that also looked at the neighbouring classes' lists (several more atomic loads, each a
/// point where loom switches threads) multiplied the executions of the handshake's model by
/// 13 and checked nothing more there; `racing_spare_pops_leave_a_block_listed` models it.
fn caching_pool() -> BufferPool {
    BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 1 << 20,
        larger_blocks: false,
        ..PoolConfig::default()
    })
    .unwrap()
}

fn assert_quiescent(stats: &PoolStats, allocations: u64) {
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.allocations, allocations);
    assert_eq!(stats.frees, allocations);
}

/// Trims from the only thread left and checks that the trim released exactly what the stats
/// called cached and that nothing stays reserved: no block was lost or counted twice.
fn trim_releases_everything(pool: &BufferPool) {
    let cached = pool.stats().cached_bytes;
    assert_eq!(
        pool.trim(),
        cached,
        "the trim released other than the cached bytes"
    );
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes, 0, "a block was lost: {stats:?}");
    assert_eq!(stats.system_allocations, stats.system_frees);
}

/// **cross-thread free racing an allocation and another free of the same class, on one
/// list**: the main thread frees a buffer while a worker allocates the same class (and may
/// take that very block) and frees another, both on the same shard of the shared lists. No
/// block is handed out twice, every block is returned exactly once, and the counters add
/// up; a final trim returns every block to the system.
///
/// Planted bug caught: `stack_push_store` (a list push that loads the head and stores the new
/// one without compare-exchange loses a block freed concurrently).
#[test]
fn cross_thread_free_racing_alloc() {
    model(|| {
        let pool = pool();
        // The main thread is the pool's cache number 0 (shard 0 of the 2 under loom); a
        // first worker claims number 1 (shard 1) and exits; the worker below gets number 2,
        // shard 0: its free and the main thread's push on one list head. (Its allocation
        // may take the first worker's block from shard 1.)
        let a = pool.alloc(100).unwrap();
        let b = pool.alloc(100).unwrap();
        let first = pool.clone();
        thread::spawn(move || drop(first.alloc(100).unwrap()))
            .join()
            .unwrap();
        let other = {
            let pool = pool.clone();
            thread::spawn(move || {
                let c = pool.alloc(100).unwrap();
                drop(b);
                c
            })
        };
        drop(a); // racing the worker's allocation and free on shard 0
        let c = other.join().unwrap();
        assert_ne!(c.as_ptr(), std::ptr::null());
        drop(c);
        assert_quiescent(&pool.stats(), 4);
        trim_releases_everything(&pool);
    });
}

/// **two requests racing for a neighbouring class's spare block**: two 112-byte blocks are
/// listed; the main thread and a worker each ask for 100 bytes (the 104-byte class, none
/// listed), so each may take a spare 112-byte block, but only one its list does not end
/// with. Exactly one takes one, the other's block comes from the system, and the 112-byte
/// list still holds a block for its own class's next request.
///
/// Planted bug caught: `spare_look_then_pop` (a spare pop that first looks at the list, then
/// pops: two racing requests both see a spare and empty the list).
#[test]
fn racing_spare_pops_leave_a_block_listed() {
    model(|| {
        let pool = pool();
        let (x, y) = (pool.alloc(112).unwrap(), pool.alloc(112).unwrap());
        drop((x, y)); // both listed, on the main thread's shard
        let worker = {
            let pool = pool.clone();
            thread::spawn(move || pool.alloc(100).unwrap())
        };
        thread::yield_now();
        let mine = pool.alloc(100).unwrap();
        let theirs = worker.join().unwrap();
        let spares = [&mine, &theirs]
            .iter()
            .filter(|buffer| buffer.capacity() == 112)
            .count();
        assert_eq!(spares, 1, "exactly one request takes the spare block");
        let own = pool.alloc(112).unwrap();
        assert_eq!(
            pool.stats().system_allocations,
            3,
            "the list's last block left"
        );
        drop((mine, theirs, own));
        assert_quiescent(&pool.stats(), 5);
        trim_releases_everything(&pool);
    });
}

/// **cross-thread free racing a trim**: one thread frees while another trims. Every block
/// ends either released by the trim or on the list, never both and never neither; a final
/// trim leaves nothing reserved.
///
/// Planted bug caught: `take_all_store` (a trim that reads the list and then stores it empty
/// without compare-exchange drops a block pushed in between).
#[test]
fn cross_thread_free_racing_trim() {
    model(|| {
        let pool = pool();
        let a = pool.alloc(100).unwrap();
        let b = pool.alloc(100).unwrap();
        drop(b); // on the list for the trim to take
        let freer = thread::spawn(move || drop(a));
        let released = pool.trim();
        freer.join().unwrap();
        let block = BufferPool::class_size_for(100).unwrap() as u64;
        assert!(
            released == block || released == 2 * block,
            "released {released}"
        );
        assert_quiescent(&pool.stats(), 2);
        trim_releases_everything(&pool);
        assert_eq!(pool.stats().system_frees, 2);
    });
}

/// **an owner's operations racing a drain of its cache**: a worker allocates and frees the
/// same class twice (the second allocation is served by its cache) while the main thread
/// trims, which takes the worker's cache from under it. Every block is released exactly once
/// (by the trim, or by the final trim), none is handed out twice, and the counters add up.
///
/// Planted bugs caught: `drain_unfenced` (the drainer takes the bins without the handshake:
/// no heavy fence and no wait for the owner's operation in flight) and `enter_relaxed` (the
/// owner marks an operation begun with a relaxed store: a drainer that waited for it may
/// still see the bins as they were before the previous operation).
#[test]
fn owner_racing_a_drain_of_its_cache() {
    model(|| {
        let pool = caching_pool();
        let worker = {
            let pool = pool.clone();
            thread::spawn(move || {
                drop(pool.alloc(100).unwrap()); // into this thread's cache
                let again = pool.alloc(100).unwrap(); // from the cache, or anew if drained
                drop(again);
                // Once more, so that a drain that found the cache holding a block can meet
                // the owner's next operation in flight.
                let third = pool.alloc(100).unwrap();
                drop(third);
            })
        };
        thread::yield_now();
        pool.trim();
        worker.join().unwrap();
        assert_quiescent(&pool.stats(), 3);
        trim_releases_everything(&pool);
    });
}

/// **a free reaches the thread that allocated**: the main thread allocates a buffer and hands
/// it to a worker, which frees it while the main thread allocates the same class again. The
/// freed block goes where the allocating thread finds it (the shared list, not the worker's
/// cache), so one block serves both allocations whenever the free comes first, and never
/// two at once.
///
/// Planted bug caught: `free_to_own_cache` (every free goes to the freeing thread's cache,
/// where the allocating thread never finds it).
#[test]
fn a_free_reaches_the_thread_that_allocated() {
    model(|| {
        let pool = caching_pool();
        let buffer = pool.alloc(100).unwrap();
        let freed = Arc::new(AtomicBool::new(false));
        let worker = {
            let freed = Arc::clone(&freed);
            thread::spawn(move || {
                drop(buffer);
                freed.store(true, Ordering::Release);
            })
        };
        thread::yield_now();
        let was_freed = freed.load(Ordering::Acquire);
        let again = pool.alloc(100).unwrap();
        if was_freed {
            assert_eq!(
                pool.stats().system_allocations,
                1,
                "the freed block was not found"
            );
        }
        drop(again);
        worker.join().unwrap();
        assert_quiescent(&pool.stats(), 2);
        trim_releases_everything(&pool);
    });
}

/// **a zero mark never outlives a write**: a worker gives back a zeroed buffer nobody wrote,
/// marking its block zero, while the main thread may take that block for a plain request,
/// write it and give it back; every zeroed request after that still reads zeros. The mark
/// is stored before the block is listed, and the next taker's `hand_out` clears it.
///
/// Planted bug caught: `mark_zero_after_free` (the mark is stored after the block is back
/// on a list, where the main thread may already have taken and written it).
#[test]
fn a_zero_mark_never_outlives_a_write() {
    model(|| {
        const SIZE: usize = 64;
        let pool = caching_pool();
        let unwritten = pool.alloc_zeroed(SIZE).unwrap();
        let worker = thread::spawn(move || drop(unwritten));
        let mut plain = pool.alloc(SIZE).unwrap();
        plain.fill(7);
        drop(plain);
        worker.join().unwrap();
        let zeroed = [
            pool.alloc_zeroed(SIZE).unwrap(),
            pool.alloc_zeroed(SIZE).unwrap(),
        ];
        for buffer in &zeroed {
            assert!(
                buffer.as_bytes().unwrap().iter().all(|&b| b == 0),
                "a written block was taken as zero"
            );
        }
        drop(zeroed);
        assert_quiescent(&pool.stats(), 4);
        trim_releases_everything(&pool);
    });
}

/// **a second thread ends the sole writer's counting**: the main thread, the pool's first
/// user, counts its allocations and frees in the exact counters with plain loads and stores
/// (it is their sole writer); a worker's first allocation makes them shared, while the main
/// thread frees. No count is lost: the bytes in use end at zero, and the peak
/// lies between the most one thread held and what both held at once.
///
/// Planted bug caught: `join_without_waiting_out` (the worker makes the counters shared
/// without waiting out the main thread's operation in flight, whose store then overwrites
/// the worker's add).
#[test]
fn a_second_thread_ends_the_sole_writers_counting() {
    model(|| {
        let pool = pool();
        let a = pool.alloc(100).unwrap(); // the sole writer from here on
        let worker = {
            let pool = pool.clone();
            thread::spawn(move || {
                let b = pool.alloc(200).unwrap();
                drop(b);
            })
        };
        thread::yield_now();
        drop(a);
        worker.join().unwrap();
        let stats = pool.stats();
        assert_eq!(stats.in_use_bytes, 0, "a count was lost: {stats:?}");
        let class = |size| BufferPool::class_size_for(size).unwrap() as u64;
        let (most, both) = (class(200), class(100) + class(200));
        assert!(
            (most..=both).contains(&stats.peak_in_use_bytes),
            "the peak is no value the bytes in use took: {stats:?}"
        );
        assert_quiescent(&stats, 2);
        trim_releases_everything(&pool);
    });
}

/// **the peak since a reset, under a reader**: the main thread allocates a block while a
/// worker reads the statistics (which raise the peak with the bytes in use they read, here
/// perhaps between the allocation's add and its own raise), then frees both of its blocks,
/// starts the peaks again and allocates one block. The peak it then reads is that one
/// block's bytes: a figure the worker read before the reset never lands in the new peak,
/// however late the worker's raise comes.
///
/// Planted bug caught: `raise_across_a_reset` (a raise lands whatever reset came between
/// its read and its write, as a plain `fetch_max` did: the worker's two blocks of before the
/// reset become the new peak).
#[test]
fn the_peak_since_a_reset_is_exact_under_a_reader() {
    model(|| {
        let pool = pool();
        let a = pool.alloc(100).unwrap();
        let reader = {
            let pool = pool.clone();
            thread::spawn(move || {
                let _ = pool.stats();
            })
        };
        let b = pool.alloc(100).unwrap();
        drop((a, b));
        pool.reset_peak_stats();
        let c = pool.alloc(100).unwrap();
        reader.join().unwrap();
        let stats = pool.stats();
        drop(c);
        let block = BufferPool::class_size_for(100).unwrap() as u64;
        assert_eq!(
            stats.peak_in_use_bytes, block,
            "the peak since the reset is not the one block's: {stats:?}"
        );
        trim_releases_everything(&pool);
    });
}

/// **the close racing a free in flight**: a worker drops a buffer (allocated on the main
/// thread) while the main thread drops the pool's last handle. Whichever comes first, the
/// block goes back to the system and the pool's control block is freed exactly once, by the
/// close or by that last free (loom's allocator checks both).
///
/// Planted bug caught: `close_without_wait` (the close counts live buffers without waiting
/// for an operation in flight, which it then misses: nobody frees the pool).
#[test]
fn close_racing_a_free_in_flight() {
    model(|| {
        let pool = caching_pool();
        let buffer = pool.alloc(100).unwrap();
        let worker = thread::spawn(move || drop(buffer));
        thread::yield_now();
        drop(pool);
        worker.join().unwrap();
    });
}

/// **buffers that outlive their pool, dropped on two threads**: the pool is closed with two
/// buffers alive; two threads drop them at once. Each block goes back to the system, and
/// exactly one of the two frees the control block.
///
/// Planted bug caught: `remaining_load_store` (the count of live buffers after the close is
/// decremented with a load and a store, so both frees may see themselves last, or neither).
#[test]
fn last_buffers_dropped_on_two_threads() {
    model(|| {
        let pool = caching_pool();
        let (a, b) = (pool.alloc(100).unwrap(), pool.alloc(200).unwrap());
        drop(pool);
        let worker = thread::spawn(move || drop(a));
        thread::yield_now();
        drop(b);
        worker.join().unwrap();
    });
}

/// **the reserved peak while a reservation races a trim**: a worker reserves a block from
/// the system while the main thread reads the statistics, trims a cached block away and
/// reads them again. The second read's `peak_reserved_bytes` is never below the first's,
/// nor below the `reserved_bytes` the first reported. The race needs one preemption (the
/// worker's, between its reservation and the rest of its system allocation); the model
/// runs at bound 1, which its two trims (560 class lists each, 2 shards) can afford.
///
/// Planted bug caught: `peak_reserved_late` (the peak is raised only after the system call,
/// from the counter as it is then: the trim lowers it first, and the reservation the first
/// read reported never reaches the peak).
#[test]
fn peak_reserved_while_a_reservation_races_a_trim() {
    common::model_within(1, 20_000, || {
        let pool = pool();
        drop(pool.alloc(64).unwrap()); // cached on the list: the trim's to release
        let grower = {
            let pool = pool.clone();
            thread::spawn(move || drop(pool.alloc(256).unwrap()))
        };
        thread::yield_now();
        let first = pool.stats();
        pool.trim();
        let second = pool.stats();
        assert!(
            second.peak_reserved_bytes >= first.peak_reserved_bytes
                && second.peak_reserved_bytes >= first.reserved_bytes,
            "the peak went down: {first:?} then {second:?}"
        );
        grower.join().unwrap();
        trim_releases_everything(&pool);
    });
}

/// **a reservation the system refuses, racing a statistics read**: a worker asks for 1 TiB
/// (the budget allows it, the system refuses it) while the main thread reads the statistics.
/// Neither that read nor one after it reports the refused bytes: `peak_reserved_bytes` stays
/// what the pool held, a 64-byte block, and `reserved_bytes` at most that. (The race needs one
/// preemption: the worker's, between its reservation and the system's answer.)
///
/// Planted bug caught: `peak_before_grant` (the reservation raises the peak before the
/// system is asked, as the pool did: the peak then reads 1 TiB and 64 bytes for good).
#[test]
fn a_reservation_the_system_refuses_never_reaches_the_figures() {
    model(|| {
        let pool = pool();
        drop(pool.alloc(64).unwrap()); // cached on the list: 64 bytes held
        let asker = {
            let pool = pool.clone();
            thread::spawn(move || assert!(pool.alloc(1 << 40).is_err()))
        };
        let during = pool.stats();
        asker.join().unwrap();
        let after = pool.stats();
        for stats in [&during, &after] {
            // The refusal releases the cached block first: reserved is 64 or 0.
            assert!(
                stats.reserved_bytes <= 64 && stats.peak_reserved_bytes == 64,
                "a refused block in the figures: {stats:?}"
            );
        }
        trim_releases_everything(&pool);
    });
}

/// **a statistics read while a buffer crosses threads**: one thread allocates a buffer and
/// hands it to another, which frees it, while a third reads the statistics. The read never
/// counts the free without the allocation: `frees <= allocations` and `freed <= allocated`
/// bytes, whatever the read saw of each thread's counters. Both threads have counted an
/// operation before the read starts, so the read visits both sets of counters.
///
/// Planted bugs caught: `totals_cache_by_cache` (each cache's allocations and frees read
/// together, cache by cache: the allocating thread's counters are read before the
/// allocation, the freeing thread's after the free), and `frees_relaxed` (frees counted and
/// read with relaxed accesses: the read sees the free and a stale count of the allocation,
/// made on another thread; this was the shipped code until loom showed it).
#[test]
fn stats_never_count_a_free_before_its_allocation() {
    model(|| {
        let pool = pool();
        drop(pool.alloc(64).unwrap()); // this thread's counters: 1 and 1
        let handoff = Arc::new(loom::sync::Mutex::new(None));
        let ready = Arc::new(AtomicBool::new(false));
        let freer = {
            let (pool, handoff, ready) = (pool.clone(), handoff.clone(), ready.clone());
            thread::spawn(move || {
                drop(pool.alloc(64).unwrap()); // the freer's counters: 1 and 1
                ready.store(true, Ordering::Release);
                loop {
                    if let Some(buffer) = handoff.lock().unwrap().take() {
                        drop(buffer);
                        break;
                    }
                    thread::yield_now();
                }
            })
        };
        while !ready.load(Ordering::Acquire) {
            thread::yield_now();
        }
        let reader = {
            let pool = pool.clone();
            thread::spawn(move || {
                let s = pool.stats();
                assert!(
                    s.frees <= s.allocations && s.freed_bytes_total <= s.allocated_bytes_total,
                    "a free counted before its allocation: {s:?}"
                );
            })
        };
        thread::yield_now();
        *handoff.lock().unwrap() = Some(pool.alloc(64).unwrap());
        freer.join().unwrap();
        reader.join().unwrap();
    });
}

/// **two carves from the page layer at once**: blocks of 32 KiB and more come from the pool's
/// own pages, carved out of free ranges under the page layer's lock. Two threads allocate
/// 32 KiB at once while one free range fits exactly (a released block between two held
/// ones) and another segment has room: each gets its own pages, the free ranges and the
/// blocks still cover every byte once (the final trim and drop return every segment, which
/// loom's allocator checks), and neither block overlaps another.
///
/// Planted bug caught: `pages_look_then_carve` (the best fit is looked up under the lock,
/// which is then let go and taken again to carve: both threads carve the same range).
#[test]
fn two_carves_from_the_page_layer_at_once() {
    model(|| {
        let pool = BufferPool::with_config(PoolConfig {
            thread_cache_bytes: 0,
            larger_blocks: false,
            ..PoolConfig::default()
        })
        .unwrap();
        const BLOCK: usize = 32 << 10;
        // The first segment (64 KiB under loom) holds two blocks, the second one more and
        // free pages; the released block leaves an exact fit between held pages.
        let held = pool.alloc(BLOCK).unwrap();
        let released = pool.alloc(BLOCK).unwrap();
        let other = pool.alloc(BLOCK).unwrap();
        drop(released);
        pool.trim();
        let worker = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut mine = pool.alloc_zeroed(BLOCK).unwrap();
                mine.as_bytes_mut().unwrap()[BLOCK - 1] = 1;
                mine
            })
        };
        thread::yield_now();
        let mut ours = pool.alloc_zeroed(BLOCK).unwrap();
        ours.as_bytes_mut().unwrap()[BLOCK - 1] = 2;
        let theirs = worker.join().unwrap();
        let span = |b: &ferropool::PoolBuffer| (b.as_ptr() as usize, b.as_ptr() as usize + BLOCK);
        let blocks = [span(&held), span(&other), span(&ours), span(&theirs)];
        for (i, a) in blocks.iter().enumerate() {
            for b in &blocks[i + 1..] {
                assert!(a.1 <= b.0 || b.1 <= a.0, "two blocks overlap: {blocks:x?}");
            }
        }
        assert_eq!(ours.as_bytes().unwrap()[BLOCK - 1], 2);
        assert_eq!(theirs.as_bytes().unwrap()[BLOCK - 1], 1);
        drop((held, other, ours, theirs));
        trim_releases_everything(&pool);
        assert_eq!(pool.stats().mapped_bytes, 0, "{:?}", pool.stats());
    });
}
