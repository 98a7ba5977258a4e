//! Loom models of evictable retained values: eviction (a request the budget refuses) racing a
//! read, a recompute, a clone and a drop.
//!
//! The pool's thread caches are off (as in the retain model: a cache made on a spawned loom
//! thread is torn down after `join`, which loom takes for non-determinism); the shared lists
//! carry every free. A block is 64 bytes (16 f32) and the budget is two blocks, so that a
//! second buffer beside a resident value fits and a third request must evict it.
#![cfg(loom)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;

use ferropool::{BufferPool, PoolConfig, Recompute, RetainedValue, Tensor};

const ELEMENTS: usize = 16;
const BLOCK: usize = ELEMENTS * 4;

/// The suite's preemption bound.
fn model(f: impl Fn() + Send + Sync + 'static) {
    common::model(50_000, f);
}

/// [`model`] at preemption bound 0 (threads switch only where one yields or blocks), for the
/// model with requests the budget refuses, which release every cache and evict: at bound 1
/// it ran past 10 minutes. Its race needs no preemption: the reader yields while it holds
/// its guard.
fn model_unpreempted(f: impl Fn() + Send + Sync + 'static) {
    common::model_within(0, 50_000, f);
}

fn pool() -> BufferPool {
    BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 0,
        budget: Some(2 * BLOCK as u64),
        ..PoolConfig::default()
    })
    .unwrap()
}

/// An evictable value of sevens; `calls` counts its recomputes.
fn sevens(pool: &BufferPool, calls: &Arc<AtomicUsize>) -> RetainedValue {
    let make = |pool: &BufferPool| Tensor::from_slice_in(pool, &[7.0f32; ELEMENTS], &[ELEMENTS]);
    let recompute = {
        let (pool, calls) = (pool.clone(), Arc::clone(calls));
        Recompute::new([], move |_| {
            calls.fetch_add(1, Ordering::Relaxed);
            Ok(make(&pool)?)
        })
    };
    RetainedValue::evictable(pool, make(pool).unwrap(), recompute).unwrap()
}

/// Reads `value` through a guard; if the read succeeds, the bytes are sevens even after
/// other threads ran (a scheduling point while the guard lives). A read may fail only for
/// the budget (another thread holds both blocks while this one recomputes).
fn read_sevens(value: &RetainedValue) {
    match value.read() {
        Ok(guard) => {
            thread::yield_now();
            let elements = guard.tensor().to_vec::<f32>().unwrap();
            assert_eq!(
                elements, [7.0; ELEMENTS],
                "a read saw another buffer's bytes"
            );
        }
        Err(error) => assert!(error.to_string().contains("budget"), "{error}"),
    }
}

/// **eviction racing a read, a clone and a drop**: one thread reads the value through a
/// clone (recomputing it if it was evicted) while the main thread drops its own handle, then
/// fills the budget with two buffers (the second evicts the value unless a read pins it) and
/// writes into them. Every successful read sees the value's bytes, a value is never evicted
/// while read, and every block is back in the pool at the end.
///
/// Planted bug caught: `evict_pinned` (eviction ignores the readers' pins, in what it
/// counts as evictable, in its choice and in its take: the request takes the block a reader
/// is still reading and overwrites it). Ignoring them in the choice and the take alone is
/// no longer reachable here: the request then could not fit with every unpinned value
/// evicted, and evicts nothing.
#[test]
fn eviction_racing_a_read_a_clone_and_a_drop() {
    model_unpreempted(|| {
        let pool = pool();
        let calls = Arc::new(AtomicUsize::new(0));
        let value = sevens(&pool, &calls);
        let reader = {
            let mine = value.clone();
            thread::spawn(move || read_sevens(&mine))
        };
        drop(value);
        thread::yield_now(); // the reader may pin the value now, or after the requests
        let first = pool.alloc(BLOCK);
        let second = pool.alloc(BLOCK);
        for buffer in [first, second].into_iter().flatten() {
            let mut buffer = buffer;
            buffer.fill(0xff);
        }
        reader.join().unwrap();
        let stats = pool.stats();
        assert_eq!(stats.in_use_bytes, 0, "every block is back");
        assert!(stats.peak_reserved_bytes <= 2 * BLOCK as u64);
        assert!(calls.load(Ordering::Relaxed) <= 1);
    });
}

/// **two readers of one evicted value**: both read it at once; it is recomputed exactly once,
/// and both see its bytes.
///
/// Planted bug caught: `claim_twice` (a recompute is claimed without checking that nobody
/// claimed it first: both readers recompute).
#[test]
fn two_readers_of_an_evicted_value_recompute_it_once() {
    model(|| {
        let pool = pool();
        let calls = Arc::new(AtomicUsize::new(0));
        let value = sevens(&pool, &calls);
        assert!(value.evict());
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let mine = value.clone();
                thread::spawn(move || {
                    let guard = mine.read().expect("one block is enough for the recompute");
                    assert_eq!(guard.tensor().to_vec::<f32>().unwrap(), [7.0; ELEMENTS]);
                })
            })
            .collect();
        for reader in readers {
            reader.join().unwrap();
        }
        assert_eq!(calls.load(Ordering::Relaxed), 1, "recomputed once");
        drop(value);
        assert_eq!(pool.stats().in_use_bytes, 0);
    });
}
