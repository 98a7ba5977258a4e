//! Loom models of evictable retained values: eviction (asked for, or made by a request the
//! budget refuses) racing a pin, a query, a recompute, a failed recompute and the drop of
//! the value and of its input's group.
//!
//! The pool's thread caches are off (as in the retain model: a cache made on a spawned loom
//! thread is torn down after `join`, which loom takes for non-determinism); the shared lists
//! carry every free (the page layer, in the window model, whose blocks are 256 KiB). A block
//! is 64 bytes (16 f32). Where a model needs the budget, it is two
//! blocks: a buffer beside a resident value fits, and a third request must evict the value.
//!
//! Each model keeps to the few steps its race needs, so that every one runs at the suite's
//! preemption bound (2): a refused request walks the whole allocation path (the caches, the
//! reservation, the registry), and a model that also recomputes through it did not finish
//! within 10 minutes at bound 1.
#![cfg(loom)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;

use ferropool::{AllocationGroup, BufferPool, Error, PoolConfig, Recompute, RetainedValue, Tensor};

const ELEMENTS: usize = 16;
const BLOCK: usize = ELEMENTS * 4;

/// The suite's preemption bound.
fn model(f: impl Fn() + Send + Sync + 'static) {
    common::model(50_000, f);
}

/// A pool without thread caches; a budget of `blocks` blocks, if any.
fn pool(blocks: Option<u64>) -> BufferPool {
    BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 0,
        budget: blocks.map(|blocks| blocks * BLOCK as u64),
        ..PoolConfig::default()
    })
    .unwrap()
}

fn sevens_in(pool: &BufferPool) -> ferropool::Result<Tensor> {
    Ok(Tensor::from_slice_in(
        pool,
        &[7.0f32; ELEMENTS],
        &[ELEMENTS],
    )?)
}

/// An evictable value of sevens, recomputed by `compute` (which `calls` counts).
fn evictable(
    pool: &BufferPool,
    calls: &Arc<AtomicUsize>,
    inputs: Vec<RetainedValue>,
    compute: impl Fn(&BufferPool, usize, &[ferropool::TensorRead<'_>]) -> ferropool::Result<Tensor>
        + Send
        + Sync
        + 'static,
) -> RetainedValue {
    let recompute = {
        let (pool, calls) = (pool.clone(), Arc::clone(calls));
        Recompute::new(inputs, move |reads| {
            let call = calls.fetch_add(1, Ordering::Relaxed);
            compute(&pool, call, reads)
        })
    };
    RetainedValue::evictable(pool, sevens_in(pool).unwrap(), recompute).unwrap()
}

/// An evictable value of sevens whose recompute makes them again.
fn sevens(pool: &BufferPool, calls: &Arc<AtomicUsize>) -> RetainedValue {
    evictable(pool, calls, Vec::new(), |pool, _, _| sevens_in(pool))
}

/// A recompute that could not run (for a model whose reader must not allocate).
fn unavailable() -> Error {
    Error::runtime_state(
        "loom model",
        ferropool::ErrorPhase::Execution,
        "the recompute is not available here",
    )
}

/// Reads `value` through a guard, yielding while the guard lives (other threads run while
/// it pins the value); a successful read sees sevens. Whether it read.
fn read_sevens(value: &RetainedValue) -> ferropool::Result<()> {
    let guard = value.read()?;
    thread::yield_now();
    let elements = guard.tensor().to_vec::<f32>().unwrap();
    assert_eq!(
        elements, [7.0; ELEMENTS],
        "a read saw another buffer's bytes"
    );
    Ok(())
}

/// Overwrites a buffer, as a new owner of a block would.
fn scribble(buffer: ferropool::PoolBuffer) {
    let mut buffer = buffer;
    buffer.fill(0xff);
}

/// **an eviction asked for racing a pin**: one thread reads the value through a clone while
/// the main thread evicts it and writes into a new block (the evicted block, if the eviction
/// happened). A read sees the value's bytes however the two interleave; the value is
/// evicted only while no read pins it; every block is back at the end.
///
/// Planted bug caught: `evict_pinned` (eviction ignores the readers' pins: the main thread
/// takes the block a reader is still reading and overwrites it).
#[test]
fn an_eviction_asked_for_racing_a_pin() {
    model(|| {
        let pool = pool(None);
        let calls = Arc::new(AtomicUsize::new(0));
        let value = sevens(&pool, &calls);
        let reader = {
            let mine = value.clone();
            thread::spawn(move || read_sevens(&mine).expect("without a budget a read succeeds"))
        };
        if value.evict() {
            scribble(pool.alloc(BLOCK).unwrap());
        }
        reader.join().unwrap();
        assert!(calls.load(Ordering::Relaxed) <= 1);
        drop(value);
        assert_eq!(pool.stats().in_use_bytes, 0, "every block is back");
    });
}

/// **an eviction for a refused request racing a pin**: one thread reads the value through a
/// clone (its recompute is unavailable, so a read after the eviction fails without
/// allocating) while the main thread holds one block and asks for another that only fits
/// once the value is evicted, then writes into it. Either the read pinned the value first
/// and the request is refused, or the request evicted it and the read fails; every read
/// that succeeds sees the value's bytes, and the budget is never passed.
///
/// Planted bug caught: `evict_pinned` (the pins are not looked at in what counts as
/// evictable, in the choice or in the take: the request takes the block a reader is still
/// reading and overwrites it).
#[test]
fn an_eviction_for_a_refused_request_racing_a_pin() {
    model(|| {
        let pool = pool(Some(2));
        let calls = Arc::new(AtomicUsize::new(0));
        let value = evictable(&pool, &calls, Vec::new(), |_, _, _| Err(unavailable()));
        let reader = {
            let mine = value.clone();
            thread::spawn(move || {
                if let Err(error) = read_sevens(&mine) {
                    assert!(error.to_string().contains("not available"), "{error}");
                }
            })
        };
        let held = pool.alloc(BLOCK).unwrap();
        match pool.alloc(BLOCK) {
            Ok(buffer) => scribble(buffer),
            Err(error) => assert!(error.to_string().contains("budget"), "{error}"),
        }
        reader.join().unwrap();
        drop(held);
        let stats = pool.stats();
        assert!(stats.peak_reserved_bytes <= 2 * BLOCK as u64);
        drop(value);
        assert_eq!(pool.stats().in_use_bytes, 0, "every block is back");
    });
}

/// **a window eviction racing a pin**: blocks of 256 KiB, which under a budget go straight
/// back to the page layer (where the others of this file go to the shared lists). Two
/// evictable values, `a` and `b`, lie end to end in one segment (carved from a 1 MiB block
/// given back first), and a plain buffer holds the rest; a 512 KiB request (a class of its
/// own) finds the budget full, and its eviction's window step picks the two values, whose
/// pages together make its range, while one thread reads `b`. Either the read pinned `b`
/// first and the window is not taken (whole or not at all: DTR's step then evicts `a`
/// alone, and the request is refused), or the window took both and the read fails; every
/// read that succeeds sees `b`'s bytes, and the budget is never passed.
///
/// Planted bug caught: `evict_pinned` (its window hunks: the window's look and its check
/// before the take ignore the pins, and so does the take).
#[test]
fn a_window_eviction_racing_a_pin() {
    const LARGE: usize = 256 << 10;
    let large_sevens = |pool: &BufferPool| -> ferropool::Result<Tensor> {
        Ok(Tensor::from_iter_in(
            pool,
            std::iter::repeat_n(7.0f32, LARGE / 4),
            &[LARGE / 4],
        )?)
    };
    model(move || {
        let pool = BufferPool::with_config(PoolConfig {
            thread_cache_bytes: 0,
            budget: Some(4 * LARGE as u64),
            ..PoolConfig::default()
        })
        .unwrap();
        drop(pool.alloc(4 * LARGE).unwrap()); // one segment of 1 MiB, free and resident
        let value = || {
            let recompute = Recompute::new([], |_| Err(unavailable()));
            RetainedValue::evictable(&pool, large_sevens(&pool).unwrap(), recompute).unwrap()
        };
        let (a, b) = (value(), value());
        let held = pool.alloc(2 * LARGE).unwrap();
        let reader = {
            let mine = b.clone();
            thread::spawn(move || match mine.read() {
                Ok(guard) => {
                    thread::yield_now();
                    let elements = guard.tensor().as_slice::<f32>().unwrap();
                    assert!(
                        elements.iter().all(|&x| x == 7.0),
                        "a read saw another buffer's bytes"
                    );
                }
                Err(error) => assert!(error.to_string().contains("not available"), "{error}"),
            })
        };
        match pool.alloc(2 * LARGE) {
            Ok(buffer) => {
                assert!(!b.is_resident(), "served while `b` was resident");
                scribble(buffer);
            }
            Err(error) => assert!(error.to_string().contains("budget"), "{error}"),
        }
        reader.join().unwrap();
        drop(held);
        assert!(pool.stats().peak_reserved_bytes <= 4 * LARGE as u64);
        drop((a, b));
        assert_eq!(pool.stats().in_use_bytes, 0, "every block is back");
    });
}

/// **queries racing an eviction for a refused request**: two threads ask whether the value
/// is resident while the main thread holds one block and asks for another that only fits
/// once the value is evicted. No reader pins the value, so the request is served however the
/// queries interleave with it: a query never makes an allocation fail.
///
/// Planted bug caught: `query_pins` (a query pins the value while it looks, as a read does:
/// a request that looks meanwhile finds nothing it may evict and fails). The bug this crate
/// had, a query holding the value's lock while the eviction skipped values whose lock was
/// busy, is beyond loom's exploration (it orders lock acquisitions, not how long a lock is
/// held, so it never runs a failed `try_lock`); the querying stress test in `tests/evict.rs`
/// catches that one.
#[test]
fn queries_racing_an_eviction_never_refuse_the_request() {
    model(|| {
        let pool = pool(Some(2));
        let calls = Arc::new(AtomicUsize::new(0));
        let value = sevens(&pool, &calls);
        let queries: Vec<_> = (0..2)
            .map(|_| {
                let mine = value.clone();
                thread::spawn(move || mine.is_resident())
            })
            .collect();
        let held = pool.alloc(BLOCK).unwrap();
        let served = pool.alloc(BLOCK);
        assert!(served.is_ok(), "a query made a request fail: {served:?}");
        assert!(!value.is_resident());
        for query in queries {
            query.join().unwrap();
        }
        drop((held, served));
        drop(value);
        assert_eq!(pool.stats().in_use_bytes, 0, "every block is back");
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
        let pool = pool(Some(2));
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

/// **a reader waiting for a recompute that fails**: two threads read an evicted value whose
/// first recompute fails. The reader that claimed it gets the error; the other, waiting for
/// it or coming after, takes the recompute over and reads the value. Two recomputes, one
/// error, one read, whichever thread claims first.
///
/// Planted bug caught: `abandon_without_waking` (a failed recompute does not wake the
/// threads waiting for it: the waiting reader waits for ever, which loom reports).
#[test]
fn a_reader_waiting_for_a_failed_recompute_takes_it_over() {
    model(|| {
        let pool = pool(None);
        let calls = Arc::new(AtomicUsize::new(0));
        let value = evictable(&pool, &calls, Vec::new(), |pool, call, _| match call {
            0 => Err(unavailable()),
            _ => sevens_in(pool),
        });
        assert!(value.evict());
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let mine = value.clone();
                thread::spawn(move || read_sevens(&mine).is_ok())
            })
            .collect();
        let reads = readers
            .into_iter()
            .map(|reader| reader.join().unwrap())
            .filter(|read| *read)
            .count();
        assert_eq!(reads, 1, "one reader got the error, the other the value");
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        drop(value);
        assert_eq!(pool.stats().in_use_bytes, 0);
    });
}

/// **a recompute racing an eviction and the drop of its value and of its input's group**:
/// the value is computed from a tensor held in an allocation group. One thread reads the
/// evicted value through a clone (recomputing it from the group's tensor) while another
/// drops the input's handle and the group, and the main thread asks to evict the value
/// again, then drops its handle.
/// An eviction asked for while the value is being recomputed does nothing (the value is not
/// resident); the read sees the value's bytes; the input's block and the value's go back
/// exactly once, on whichever thread drops last.
///
/// Planted bug caught: `evict_recomputing` (an eviction asked for looks at the pins but not
/// at the phase: it marks a value evicted while another thread recomputes it).
#[test]
fn a_recompute_racing_an_eviction_and_the_drops() {
    model(|| {
        let pool = pool(None);
        let calls = Arc::new(AtomicUsize::new(0));
        let (group, slots) = AllocationGroup::from_tensors([sevens_in(&pool).unwrap()]).unwrap();
        let input = RetainedValue::from_group(&group, slots[0]).unwrap();
        let value = evictable(&pool, &calls, vec![input.clone()], |pool, _, reads| {
            Ok(Tensor::from_slice_in(
                pool,
                reads[0].as_slice::<f32>()?,
                &[ELEMENTS],
            )?)
        });
        assert!(value.evict());
        let reader = {
            let mine = value.clone();
            thread::spawn(move || read_sevens(&mine).expect("without a budget a read succeeds"))
        };
        let dropper = thread::spawn(move || drop((input, group)));
        value.evict();
        drop(value);
        reader.join().unwrap();
        dropper.join().unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 1, "recomputed once");
        let stats = pool.stats();
        assert_eq!(stats.in_use_bytes, 0, "every block is back");
        assert_eq!(stats.frees, stats.allocations, "each block back once");
    });
}
