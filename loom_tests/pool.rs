//! Loom models of the `BufferPool` protocol: the lock-free class lists under cross-thread
//! frees, allocations and trims.
//!
//! The models run with thread caches off (`thread_cache_bytes: 0`), so every free goes to the
//! shared class list and every allocation tries it first: that is the shared protocol. The
//! thread-cache path is single-threaded by construction (one owner per cache). Each model
//! names the property it checks and the bug planted with `--cfg ferropool_planted="…"` that
//! it catches (`scripts/loom.sh --planted`).
#![cfg(loom)]

mod common;

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

fn assert_quiescent(stats: &PoolStats, allocations: u64) {
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.allocations, allocations);
    assert_eq!(stats.frees, allocations);
    assert_eq!(
        stats.in_use_bytes + stats.cached_bytes,
        stats.reserved_bytes
    );
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
        pool.trim();
        let stats = pool.stats();
        assert_eq!(stats.reserved_bytes, 0, "a block was lost: {stats:?}");
        assert_eq!(stats.system_allocations, stats.system_frees);
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
        pool.trim();
        let stats = pool.stats();
        assert_eq!(stats.reserved_bytes, 0, "a block was lost: {stats:?}");
        assert_eq!(stats.system_frees, 2);
    });
}
