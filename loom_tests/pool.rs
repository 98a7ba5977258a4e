//! Loom models of the `BufferPool` protocol: the lock-free class lists under cross-thread
//! frees, allocations and trims.
//!
//! The first models run with thread caches off (`thread_cache_bytes: 0`), so every free goes
//! to the shared class list and every allocation tries it first: that is the shared
//! protocol. The thread-cache path itself is single-threaded by construction (one owner per
//! cache); what a cache shares is its retirement at thread exit, which the last two models
//! cover. They retire the cache with `BufferPool::flush_thread_caches`, the code thread exit
//! runs, because loom runs a thread's thread-local destructors after `join` returns, outside
//! the explored order.
//!
//! The pool's system allocations go through loom's tracking allocator here, so any model
//! that ends with a block neither in use nor returned to the system fails ("Allocation
//! leaked"). Each model names the property it checks and the bug planted with
//! `--cfg ferropool_planted="…"` that it catches (`scripts/loom.sh --planted`).
#![cfg(loom)]

mod common;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use ferropool::{BufferPool, PoolConfig, PoolStats};

/// A trim visits every class list (280 of them), each a load and a compare-exchange.
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

/// A pool whose threads cache freed blocks.
fn caching_pool() -> BufferPool {
    BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 1 << 20,
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

/// **cross-thread free racing an allocation of the same class**: one thread frees a buffer
/// while another allocates the same class (and may take that very block). No block is handed
/// out twice, every block is returned exactly once, and the counters add up; a final trim
/// returns every block to the system.
///
/// Planted bug caught: `stack_push_store` (a list push that loads the head and stores the new
/// one without compare-exchange loses a block freed concurrently).
#[test]
fn cross_thread_free_racing_alloc() {
    model(|| {
        let pool = pool();
        let a = pool.alloc(100).unwrap();
        let b = pool.alloc(100).unwrap();
        let held = pool.alloc(100).unwrap();
        drop(held); // on the list: the allocation below can pop it while the frees push
        let freer = thread::spawn(move || drop(a));
        let other = {
            let pool = pool.clone();
            thread::spawn(move || {
                let c = pool.alloc(100).unwrap();
                drop(b);
                c
            })
        };
        freer.join().unwrap();
        let c = other.join().unwrap();
        assert_ne!(c.as_ptr(), std::ptr::null());
        drop(c);
        assert_quiescent(&pool.stats(), 4);
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

/// **thread-exit flush racing a stats reader**: a worker allocates and frees a buffer (into
/// its cache), raises a flag, and retires the cache (as at thread exit) while the main thread
/// reads the stats. Once the flag is seen, the worker's allocation is in every snapshot:
/// departing counters never vanish from a reader's view. Afterwards the flushed block is on
/// the shared list, where the next allocation of its class takes it instead of the system,
/// the counters add up, and a trim returns every block.
///
/// Planted bug caught: `retire_unlocked` (folding the departing thread's counters into the
/// pool's after releasing the registry lock, so a reader in between misses them).
#[test]
fn thread_exit_flush_racing_stats() {
    model(|| {
        let pool = caching_pool();
        let allocated = Arc::new(AtomicBool::new(false));
        let worker = {
            let (pool, allocated) = (pool.clone(), Arc::clone(&allocated));
            thread::spawn(move || {
                drop(pool.alloc(100).unwrap()); // into this thread's cache
                allocated.store(true, Ordering::Release);
                BufferPool::flush_thread_caches()
            })
        };
        if allocated.load(Ordering::Acquire) {
            let stats = pool.stats();
            assert_eq!(
                stats.allocations, 1,
                "the worker's count vanished: {stats:?}"
            );
        }
        let moved = worker.join().unwrap();
        assert_eq!(moved, BufferPool::class_size_for(100).unwrap() as u64);
        drop(pool.alloc(100).unwrap());
        assert_eq!(
            pool.stats().system_allocations,
            1,
            "the flushed block was not reused"
        );
        BufferPool::flush_thread_caches();
        assert_quiescent(&pool.stats(), 2);
        trim_releases_everything(&pool);
        assert_eq!(pool.stats().system_frees, 1);
    });
}

/// **thread-exit flush racing the pool's close**: a worker drops its pool handle and retires
/// its cache (as at thread exit) while the main thread drops the last handle, closing the
/// pool. The cached block goes back to the system whichever comes first, never stranded on
/// the list of a pool nobody can reach; loom's leak check fails the model otherwise.
///
/// Planted bug caught: `close_unchecked` (a give-back that checks `closed` before pushing
/// instead of after, so a close in between empties the lists before the block arrives).
#[test]
fn thread_exit_flush_racing_close() {
    model(|| {
        let pool = caching_pool();
        let worker = {
            let pool = pool.clone();
            thread::spawn(move || {
                drop(pool.alloc(100).unwrap()); // into this thread's cache
                drop(pool);
                BufferPool::flush_thread_caches();
            })
        };
        drop(pool);
        worker.join().unwrap();
    });
}
