//! Evictable retained values: a pool under a budget evicts them to serve a request, a read
//! recomputes them (inputs first), and every hostile turn (a recompute that panics, that
//! allocates past the budget, that reads itself, that returns the wrong tensor; values
//! dropped or read by other threads meanwhile) ends in a typed error with every block back
//! in the pool.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use ferropool::{
    BufferPool, DType, Error, PoolConfig, PoolError, PoolEventKind, Recompute, RetainedValue,
    RetentionContainer, Tensor, TensorError,
};

const KIB: usize = 1 << 10;

fn pool_with_budget(budget: usize) -> BufferPool {
    BufferPool::with_config(PoolConfig {
        budget: Some(budget as u64),
        // Every freed block goes to the shared lists: what a test counts does not depend on
        // which thread frees.
        thread_cache_bytes: 0,
        ..PoolConfig::default()
    })
    .unwrap()
}

/// `bytes` of f32 all equal to `value`, in `pool`.
fn filled(pool: &BufferPool, bytes: usize, value: f32) -> ferropool::Result<Tensor> {
    Ok(Tensor::from_iter_in(
        pool,
        std::iter::repeat_n(value, bytes / 4),
        &[bytes / 4],
    )?)
}

/// An evictable value of `bytes` filled with `value`, recomputed from nothing; `calls`
/// counts its recomputes.
fn leaf(pool: &BufferPool, bytes: usize, value: f32, calls: &Arc<AtomicUsize>) -> RetainedValue {
    let recompute = {
        let (pool, calls) = (pool.clone(), Arc::clone(calls));
        Recompute::new([], move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            filled(&pool, bytes, value)
        })
    };
    let first = when_room(|| filled(pool, bytes, value));
    RetainedValue::evictable(pool, first, recompute).unwrap()
}

/// Tries `attempt` again while the budget refuses it: under a budget that other threads'
/// blocks fill at that moment, the refusal is typed and lasts only while they hold them.
fn when_room<R>(mut attempt: impl FnMut() -> ferropool::Result<R>) -> R {
    for _ in 0..10_000 {
        match attempt() {
            Ok(done) => return done,
            Err(refused) => {
                assert!(
                    format!("{refused:?}").contains("BudgetExceeded"),
                    "{refused}"
                );
                std::thread::yield_now();
            }
        }
    }
    panic!("still refused after 10,000 tries");
}

/// `input + 1`, element-wise, as an evictable value over `input`.
fn plus_one(pool: &BufferPool, input: &RetainedValue, calls: &Arc<AtomicUsize>) -> RetainedValue {
    let compute = {
        let (pool, calls) = (pool.clone(), Arc::clone(calls));
        move |inputs: &[ferropool::TensorRead<'_>]| -> ferropool::Result<Tensor> {
            calls.fetch_add(1, Ordering::SeqCst);
            let x = inputs[0].as_slice::<f32>()?;
            Ok(Tensor::from_iter_in(
                &pool,
                x.iter().map(|v| v + 1.0),
                &[x.len()],
            )?)
        }
    };
    let first = compute(&[input.read().unwrap().tensor()]).unwrap();
    calls.fetch_sub(1, Ordering::SeqCst); // the first computation is not a recompute
    RetainedValue::evictable(pool, first, Recompute::new([input.clone()], compute)).unwrap()
}

fn first_element(value: &RetainedValue) -> f32 {
    value.read().unwrap().tensor().as_slice::<f32>().unwrap()[0]
}

#[test]
fn a_refused_request_evicts_a_value_and_a_read_recomputes_it() {
    let pool = pool_with_budget(256 * KIB);
    pool.enable_trace(1024);
    let calls = Arc::new(AtomicUsize::new(0));
    let saved = leaf(&pool, 128 * KIB, 3.0, &calls);
    let other = pool
        .alloc(192 * KIB)
        .expect("served once the value is evicted");
    assert!(!saved.is_resident());
    let stats = pool.stats();
    assert_eq!(
        (stats.evictions, stats.evicted_bytes),
        (1, 128 * KIB as u64)
    );
    assert!(stats.peak_reserved_bytes <= 256 * KIB as u64);
    drop(other);
    assert_eq!(first_element(&saved), 3.0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let stats = pool.stats();
    assert_eq!(
        (stats.recomputations, stats.recomputed_bytes),
        (1, 128 * KIB as u64)
    );
    let kinds: Vec<_> = pool
        .trace_events()
        .iter()
        .map(|e| (e.kind, e.name))
        .collect();
    assert!(kinds.contains(&(PoolEventKind::Evict, "")), "{kinds:?}");
    assert!(kinds.contains(&(PoolEventKind::SpanBegin, "recompute")));
    drop(saved);
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn a_pool_without_a_budget_never_evicts() {
    let pool = BufferPool::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let saved = leaf(&pool, 64 * KIB, 1.0, &calls);
    let many: Vec<_> = (0..64).map(|_| pool.alloc(64 * KIB).unwrap()).collect();
    assert!(saved.is_resident());
    assert_eq!(pool.stats().evictions, 0);
    drop(many);
}

#[test]
fn a_read_guard_pins_the_value_and_the_error_says_so() {
    let pool = pool_with_budget(256 * KIB);
    let calls = Arc::new(AtomicUsize::new(0));
    let saved = leaf(&pool, 128 * KIB, 2.0, &calls);
    let read = saved.read().unwrap();
    let Err(PoolError::BudgetExceeded(oom)) = pool.alloc(192 * KIB) else {
        panic!("a pinned value was evicted")
    };
    assert_eq!(oom.evictable_pinned, 128 * KIB as u64);
    assert_eq!(oom.evictable_unpinned, 0);
    assert!(oom.to_string().contains("pinned by reads"), "{oom}");
    assert_eq!(read.tensor().as_slice::<f32>().unwrap()[0], 2.0);
    drop(read);
    assert!(pool.alloc(192 * KIB).is_ok(), "unpinned: evicted now");
    assert_eq!(pool.stats().evictions, 1);
}

#[test]
fn tensor_read_pins_through_its_handle_until_the_handle_drops() {
    let pool = pool_with_budget(256 * KIB);
    let calls = Arc::new(AtomicUsize::new(0));
    let saved = leaf(&pool, 128 * KIB, 5.0, &calls);
    let reader = saved.clone();
    assert_eq!(
        reader.tensor_read().unwrap().as_slice::<f32>().unwrap()[0],
        5.0
    );
    assert!(!saved.evict(), "the reading handle pins it");
    assert!(pool.alloc(192 * KIB).is_err());
    drop(reader);
    assert!(saved.evict(), "the pin went with the handle");
    // A handle read twice (from two threads) holds one pin.
    let shared = Arc::new(saved.clone());
    std::thread::scope(|s| {
        for _ in 0..2 {
            let shared = Arc::clone(&shared);
            s.spawn(move || {
                assert_eq!(shared.tensor_read().unwrap().get::<f32>(&[0]).unwrap(), 5.0)
            });
        }
    });
    drop(shared);
    assert!(saved.evict(), "both reads' pins went with their one handle");
}

#[test]
fn eviction_prefers_the_class_the_request_needs() {
    // Two values: a stale 64 KiB one and a fresh 128 KiB one. A 128 KiB request evicts the
    // fresh 128 KiB value (its block serves the request), not the staler 64 KiB one.
    let pool = pool_with_budget(256 * KIB);
    let calls = Arc::new(AtomicUsize::new(0));
    let small = leaf(&pool, 64 * KIB, 1.0, &calls);
    let large = leaf(&pool, 128 * KIB, 2.0, &calls);
    let _ = first_element(&large); // `small` is the staler one
    let served = pool.alloc(128 * KIB).unwrap();
    assert!(small.is_resident());
    assert!(!large.is_resident());
    let stats = pool.stats();
    assert_eq!(
        (stats.evictions, stats.window_evictions),
        (1, 0),
        "one value, not a window"
    );
    assert_eq!(
        stats.reserved_bytes,
        192 * KIB as u64,
        "the block was reused, not reserved anew"
    );
    drop(served);
    // With no value of the class, the stalest cheapest value goes.
    let other = pool.alloc(200 * KIB).unwrap();
    assert!(!small.is_resident());
    drop(other);
}

#[test]
fn staleness_and_cost_choose_the_victim() {
    let pool = pool_with_budget(3 * 64 * KIB);
    let calls = Arc::new(AtomicUsize::new(0));
    let a = leaf(&pool, 64 * KIB, 1.0, &calls);
    let b = leaf(&pool, 64 * KIB, 2.0, &calls);
    let c = leaf(&pool, 64 * KIB, 3.0, &calls);
    for _ in 0..3 {
        let _ = (first_element(&c), first_element(&a)); // b is the stalest
    }
    let held = pool.alloc(64 * KIB).unwrap();
    assert!(a.is_resident() && !b.is_resident() && c.is_resident());
    drop(held);
}

#[test]
fn a_large_request_evicts_neighbours_whose_pages_make_its_range() {
    // Four 1 MiB values fill the pool's first 4 MiB of pages, end to end: a, b, c, d. A and c
    // are the stalest, so DTR's score alone would evict them, and their two free MiB, apart,
    // could not hold a 2 MiB block: the pool would map new pages and purge the freed ones.
    // The window step evicts two neighbours instead, whose pages make the request's range.
    const MIB: usize = 1 << 20;
    let pool = pool_with_budget(4 * MIB);
    let calls = Arc::new(AtomicUsize::new(0));
    let values: Vec<RetainedValue> = (0..4).map(|k| leaf(&pool, MIB, k as f32, &calls)).collect();
    let mapped = pool.stats().mapped_bytes;
    assert_eq!(pool.stats().reserved_bytes, 4 * MIB as u64);
    for _ in 0..3 {
        let _ = (first_element(&values[1]), first_element(&values[3]));
    }
    let served = pool.alloc(2 * MIB).unwrap();
    let evicted: Vec<usize> = (0..4).filter(|&k| !values[k].is_resident()).collect();
    assert_eq!(evicted.len(), 2, "evicted {evicted:?}");
    assert_eq!(evicted[1], evicted[0] + 1, "not neighbours: {evicted:?}");
    let stats = pool.stats();
    assert_eq!(stats.mapped_bytes, mapped, "new pages were mapped");
    assert_eq!(stats.purged_bytes, 0, "freed pages were purged");
    assert_eq!(stats.reserved_bytes, 4 * MIB as u64);
    // The statistics say so: two window evictions, both of the 1 MiB class.
    assert_eq!((stats.evictions, stats.window_evictions), (2, 2));
    let classes = pool.class_stats();
    let mib = classes.iter().find(|c| c.block_bytes == MIB).unwrap();
    assert_eq!((mib.evicted_blocks, mib.in_use_blocks), (2, 2));
    assert!(classes
        .iter()
        .all(|c| c.block_bytes == MIB || c.evicted_blocks == 0));
    drop(served);
    // The evicted ones recompute with their contents.
    for (k, value) in values.iter().enumerate() {
        assert_eq!(first_element(value), k as f32);
    }
}

#[test]
fn a_chain_of_evicted_values_is_recomputed_without_recursion() {
    // 2,000 values, each its predecessor plus one, all evicted: a read of the last one
    // recomputes every one, on a thread with a small stack (recursion would overflow it).
    let pool = pool_with_budget(64 << 20);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut chain = vec![leaf(&pool, 4 * KIB, 0.0, &calls)];
    for _ in 0..2_000 {
        let next = plus_one(&pool, chain.last().unwrap(), &calls);
        chain.push(next);
    }
    for value in &chain {
        assert!(value.evict());
    }
    assert_eq!(pool.stats().in_use_bytes, 0);
    let last = chain.last().unwrap().clone();
    let value = std::thread::Builder::new()
        .stack_size(128 << 10)
        .spawn(move || first_element(&last))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(value, 2_000.0);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2_001,
        "each value recomputed once"
    );
    assert_eq!(pool.stats().recomputations, 2_001);
    // Under a budget of three blocks, the chain is recomputed anyway: each step needs only
    // its input and its output.
    for value in &chain {
        value.evict();
    }
    pool.set_budget(Some(3 * 4 * KIB as u64));
    assert_eq!(first_element(chain.last().unwrap()), 2_000.0);
    assert!(pool.stats().peak_reserved_bytes <= 64 << 20);
    drop(chain);
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn two_threads_reading_one_evicted_value_recompute_it_once() {
    let pool = pool_with_budget(1 << 20);
    let calls = Arc::new(AtomicUsize::new(0));
    let (entered, inside) = mpsc::channel::<()>();
    let entered = std::sync::Mutex::new(entered);
    let recompute = {
        let (pool, calls) = (pool.clone(), Arc::clone(&calls));
        Recompute::new([], move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            let _ = entered.lock().unwrap().send(());
            std::thread::sleep(Duration::from_millis(50)); // the second reader arrives
            filled(&pool, 64 * KIB, 9.0)
        })
    };
    let saved =
        RetainedValue::evictable(&pool, filled(&pool, 64 * KIB, 9.0).unwrap(), recompute).unwrap();
    assert!(saved.evict());
    std::thread::scope(|s| {
        let first = s.spawn(|| first_element(&saved));
        inside.recv().unwrap(); // the first reader is recomputing
        let second = s.spawn(|| first_element(&saved));
        assert_eq!(first.join().unwrap(), 9.0);
        assert_eq!(second.join().unwrap(), 9.0);
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_recompute_that_panics_is_a_typed_error_and_the_next_read_tries_again() {
    let pool = pool_with_budget(1 << 20);
    let fail = Arc::new(AtomicUsize::new(1));
    let recompute = {
        let (pool, fail) = (pool.clone(), Arc::clone(&fail));
        Recompute::new([], move |_| {
            let scratch = pool.alloc(32 * KIB)?; // goes back during the unwind
            if fail.fetch_sub(1, Ordering::SeqCst) == 1 {
                panic!("boom");
            }
            drop(scratch);
            filled(&pool, 64 * KIB, 4.0)
        })
    };
    let saved =
        RetainedValue::evictable(&pool, filled(&pool, 64 * KIB, 4.0).unwrap(), recompute).unwrap();
    assert!(saved.evict());
    let error = saved.read().unwrap_err();
    assert!(
        matches!(&error, Error::RuntimeState { message, .. } if message.contains("panicked: boom")),
        "{error}"
    );
    assert!(!saved.is_resident());
    assert_eq!(pool.stats().in_use_bytes, 0, "the scratch block went back");
    assert_eq!(first_element(&saved), 4.0);
}

#[test]
fn a_recompute_past_the_budget_fails_with_the_budget_error() {
    let pool = pool_with_budget(256 * KIB);
    let calls = Arc::new(AtomicUsize::new(0));
    let saved = leaf(&pool, 128 * KIB, 1.0, &calls);
    assert!(saved.evict());
    let hog = pool.alloc(192 * KIB).unwrap();
    let error = saved.read().unwrap_err();
    assert!(
        matches!(
            error,
            Error::Tensor(TensorError::Pool(PoolError::BudgetExceeded(_)))
        ),
        "{error}"
    );
    assert_eq!(pool.stats().in_use_bytes, 192 * KIB as u64);
    drop(hog);
    assert_eq!(first_element(&saved), 1.0);
}

#[test]
fn a_recompute_that_returns_the_wrong_tensor_is_refused() {
    let pool = pool_with_budget(1 << 20);
    let elsewhere = BufferPool::new();
    for wrong in 0..3 {
        let recompute = {
            let (pool, elsewhere) = (pool.clone(), elsewhere.clone());
            Recompute::new([], move |_| match wrong {
                0 => filled(&pool, 8 * KIB, 1.0), // another shape
                1 => Ok(Tensor::zeros_in(&pool, DType::I32, &[4 * KIB / 4])?), // another dtype
                _ => filled(&elsewhere, 4 * KIB, 1.0), // another pool
            })
        };
        let saved =
            RetainedValue::evictable(&pool, filled(&pool, 4 * KIB, 1.0).unwrap(), recompute)
                .unwrap();
        assert!(saved.evict());
        assert!(matches!(saved.read(), Err(Error::RuntimeState { .. })));
        assert!(!saved.is_resident());
    }
    assert_eq!(pool.stats().in_use_bytes, 0);
    assert_eq!(elsewhere.stats().in_use_bytes, 0);
    // A tensor of another pool, or a caller-owned payload, is refused up front.
    let recompute = Recompute::new([], |_| unreachable!());
    let foreign = filled(&elsewhere, 4 * KIB, 1.0).unwrap();
    assert!(RetainedValue::evictable(&pool, foreign, recompute).is_err());
}

#[test]
fn a_recompute_that_reads_its_own_value_is_an_error_not_a_deadlock() {
    let pool = pool_with_budget(1 << 20);
    let me: Arc<OnceLock<RetainedValue>> = Arc::new(OnceLock::new());
    let recompute = {
        let me = Arc::clone(&me);
        Recompute::new([], move |_| {
            let me = me.get().expect("set");
            let read = me.read()?; // itself, being recomputed
            Ok(Tensor::from_slice(read.tensor().as_slice::<f32>()?, &[1])?)
        })
    };
    let saved = RetainedValue::evictable(&pool, filled(&pool, 4, 1.0).unwrap(), recompute).unwrap();
    me.set(saved.clone()).unwrap();
    assert!(saved.evict());
    let error = saved.read().unwrap_err();
    assert!(
        error.to_string().contains("the value it recomputes"),
        "{error}"
    );
    assert!(!saved.is_resident());
    // The cycle (the value holds a handle to itself) is the caller's; break it.
    drop(Arc::into_inner(me));
}

#[test]
fn values_dropped_and_read_while_other_threads_evict() {
    // Threads allocate past the budget (evicting), read and drop values at once: every read
    // sees its value's bytes, and every block is back at the end. A thread's hog is the whole
    // budget, so a hog granted evicts every value, and the read beside it is refused with a
    // typed error (the recompute has no room); so can be an allocation while other threads
    // hold blocks. Each is tried again once this thread holds no hog, and must then succeed.
    let pool = pool_with_budget(1 << 20);
    let calls = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..4 {
            let (pool, calls) = (pool.clone(), Arc::clone(&calls));
            s.spawn(move || {
                let read_when_room = |value: &RetainedValue| {
                    when_room(|| {
                        value
                            .read()
                            .map(|read| read.tensor().as_slice::<f32>().unwrap()[0])
                    })
                };
                for round in 0..200 {
                    let value = (t * 1000 + round) as f32;
                    let saved = leaf(&pool, 128 * KIB, value, &calls);
                    let clone = saved.clone();
                    // The whole budget: granted, it evicts every value, this thread's too.
                    let hog = pool.alloc(1 << 20);
                    // Once only while the hog is held: threads retrying with their hogs held
                    // could wait on each other for ever.
                    let read = clone
                        .read()
                        .map(|read| read.tensor().as_slice::<f32>().unwrap()[0]);
                    drop(hog);
                    match read {
                        Ok(first) => assert_eq!(first, value),
                        Err(refused) => {
                            assert!(
                                format!("{refused:?}").contains("BudgetExceeded"),
                                "{refused}"
                            );
                            assert_eq!(read_when_room(&clone), value);
                        }
                    }
                    if round % 2 == 0 {
                        drop(saved);
                        assert_eq!(read_when_room(&clone), value);
                    }
                }
            });
        }
    });
    assert_eq!(pool.stats().in_use_bytes, 0);
    assert!(pool.stats().peak_reserved_bytes <= 1 << 20);
    assert!(calls.load(Ordering::SeqCst) > 0, "no value was recomputed");
}

#[test]
fn a_zero_budget_refuses_with_a_typed_error() {
    let pool = pool_with_budget(0);
    assert!(matches!(
        filled(&pool, 4 * KIB, 1.0),
        Err(Error::Tensor(TensorError::Pool(PoolError::BudgetExceeded(
            _
        ))))
    ));
    let small = pool_with_budget(8 * KIB);
    let saved = leaf(&small, 4 * KIB, 1.0, &Arc::default());
    assert!(
        matches!(saved.container(), RetentionContainer::Evictable(held) if held.bytes() == 4096)
    );
}

#[test]
fn a_long_chain_dropped_from_its_last_handle_unlinks_without_recursion() {
    // 20,000 links, each holding the one before through its recompute: dropped link by link
    // from one handle, the chain overflowed a small stack.
    let outcome = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let pool = BufferPool::new();
            let calls = Arc::new(AtomicUsize::new(0));
            let mut last = leaf(&pool, 4, 0.0, &calls);
            for _ in 0..20_000 {
                last = plus_one(&pool, &last, &calls);
            }
            assert_eq!(first_element(&last), 20_000.0);
            drop(last);
            assert_eq!(pool.stats().in_use_bytes, 0, "every block back");
        })
        .unwrap()
        .join();
    assert!(outcome.is_ok(), "the drop failed");
}

#[test]
fn a_request_that_cannot_fit_evicts_nothing() {
    let pool = pool_with_budget(1 << 20);
    let calls = Arc::new(AtomicUsize::new(0));
    let values: Vec<_> = (0..4)
        .map(|i| leaf(&pool, 128 * KIB, i as f32, &calls))
        .collect();
    let Err(PoolError::BudgetExceeded(oom)) = pool.alloc(2 << 20) else {
        panic!("more than the budget")
    };
    assert_eq!(
        pool.stats().evictions,
        0,
        "evicted for a request that could not fit"
    );
    // The report says the pool chose not to evict, and by how much the request was short
    // (it said the pool "could not take" the values).
    assert_eq!(oom.evictable_unpinned, 512 * KIB as u64);
    assert_eq!(oom.short_with_every_eviction, 1 << 20);
    let text = oom.to_string();
    assert!(text.contains("would not have made room"), "{text}");
    assert!(text.contains("would still lack 1.00 MiB"), "{text}");
    assert!(!text.contains("could not take"), "{text}");
    assert!(values.iter().all(RetainedValue::is_resident));
    // One that fits once a value goes still evicts.
    let served = pool.alloc(600 * KIB).unwrap();
    assert!(pool.stats().evictions > 0);
    drop((served, values));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// An external payload whose drop panics.
#[derive(Debug)]
struct Bomb;

impl ferropool::ExternalPayload for Bomb {
    fn tag(&self) -> u32 {
        7
    }
    fn shape(&self) -> &[usize] {
        &[1]
    }
}

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a payload's drop panicked");
    }
}

#[test]
fn a_recompute_whose_wrong_result_panics_as_it_drops_leaves_the_value_readable() {
    let pool = pool_with_budget(1 << 20);
    let recompute = Recompute::new([], |_| Ok(Tensor::external(Bomb)?));
    let saved =
        RetainedValue::evictable(&pool, filled(&pool, 64 * KIB, 1.0).unwrap(), recompute).unwrap();
    assert!(saved.evict());
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| saved.read().map(drop)));
    let error = read.expect("no panic out of the read").unwrap_err();
    assert!(error.to_string().contains("panicked"), "{error}");
    assert!(!saved.is_resident());
    // Another thread's read does not wait for a recompute nobody runs.
    let (done, finished) = mpsc::channel();
    let other = saved.clone();
    std::thread::spawn(move || {
        let _ = done.send(other.read().map(drop).is_err());
    });
    let failed_again = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the second read returned");
    assert!(failed_again, "the recompute still fails");
    drop(saved);
    assert_eq!(pool.stats().in_use_bytes, 0);
}

/// A chain whose recomputes' closures panic as they drop (two of them, and the last
/// handle's own): every closure is dropped exactly once, every block goes back, and the
/// first panic reaches the caller. (The chain's drop let the first panic unwind through
/// the links still pending, whose own panicking drop then aborted the process.)
#[test]
fn a_chain_whose_closures_panic_as_they_drop_drops_every_one_once() {
    struct PanicOnDrop(Arc<AtomicUsize>);
    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("a recompute's closure panicked as it dropped");
        }
    }
    let pool = BufferPool::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let link = |input: Option<&RetainedValue>| {
        let guard = PanicOnDrop(Arc::clone(&drops));
        let pool2 = pool.clone();
        let recompute = Recompute::new(input.cloned(), move |_| {
            let _held = &guard;
            filled(&pool2, 64, 1.0)
        });
        RetainedValue::evictable(&pool, filled(&pool, 64, 1.0).unwrap(), recompute).unwrap()
    };
    let first = link(None);
    let second = link(Some(&first));
    let third = link(Some(&second));
    drop((first, second));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(third)));
    assert!(outcome.is_err(), "the first panic is resumed");
    assert_eq!(
        drops.load(Ordering::SeqCst),
        3,
        "every closure dropped once"
    );
    assert_eq!(pool.stats().in_use_bytes, 0, "every block back");
}

/// A recompute may get a block of a larger class (borrowed from a neighbour's list while
/// the pool has no budget): the value's bytes are then that block's, for the eviction
/// policy's weights and the pinned bytes a refusal reports (they stayed the first block's).
#[test]
fn a_recompute_into_a_larger_block_counts_that_block() {
    let pool = BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 0,
        ..PoolConfig::default()
    })
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let saved = leaf(&pool, 64 * KIB, 1.0, &calls);
    assert!(saved.evict());
    let own_class = pool.alloc(64 * KIB).unwrap(); // the evicted block: its list is empty now
    drop(
        (0..2)
            .map(|_| pool.alloc(80 * KIB).unwrap())
            .collect::<Vec<_>>(),
    ); // one to lend
    assert_eq!(first_element(&saved), 1.0);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "recomputed");
    let RetentionContainer::Evictable(held) = saved.container() else {
        panic!("an evictable value");
    };
    assert_eq!(held.bytes(), 80 * KIB as u64, "the lent block's bytes");
    drop(own_class);
}

/// A plain buffer no eviction can free counts against a request: one that could not fit with
/// every value evicted evicts none (the value was evicted all the same, and its next read
/// paid a recompute for nothing, when the check counted pinned bytes and the request only).
#[test]
fn a_request_that_plain_buffers_keep_from_fitting_evicts_nothing() {
    let pool = pool_with_budget(1 << 20);
    let calls = Arc::new(AtomicUsize::new(0));
    let plain = pool.alloc(768 * KIB).unwrap();
    let value = leaf(&pool, 128 * KIB, 1.0, &calls);
    let Err(PoolError::BudgetExceeded(oom)) = pool.alloc(512 * KIB) else {
        panic!("768 + 512 KiB within 1 MiB")
    };
    assert!(
        value.is_resident(),
        "evicted for a request that could not fit"
    );
    assert_eq!(pool.stats().evictions, 0);
    assert_eq!(oom.short_with_every_eviction, 256 * KIB as u64);
    // One that fits once the value goes still evicts it.
    let served = pool.alloc(256 * KIB).unwrap();
    assert!(!value.is_resident());
    drop((served, plain));
    assert_eq!(first_element(&value), 1.0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Threads that query a value (`is_resident`) in a loop never make a request that eviction
/// can serve fail: a query held the value's lock, the eviction skipped a value whose lock was
/// busy, and 5 of every 81-218 requests were refused when a querying thread was preempted
/// with the lock held.
#[test]
fn queries_on_other_threads_never_make_a_request_fail() {
    let pool = pool_with_budget(1 << 20);
    let calls = Arc::new(AtomicUsize::new(0));
    let value = Arc::new(leaf(&pool, 512 * KIB, 3.0, &calls));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let queries: Vec<_> = (0..6)
        .map(|_| {
            let (value, stop) = (Arc::clone(&value), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut resident = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    resident += u64::from(value.is_resident());
                }
                resident
            })
        })
        .collect();
    let rounds = if cfg!(miri) { 3 } else { 400 };
    let mut refused = 0;
    for _ in 0..rounds {
        match pool.alloc(768 * KIB) {
            Ok(buffer) => drop(buffer),
            Err(_) => refused += 1,
        }
        assert_eq!(first_element(&value), 3.0);
    }
    stop.store(true, Ordering::Relaxed);
    for query in queries {
        query.join().unwrap();
    }
    assert_eq!(refused, 0, "{refused} of {rounds} requests refused");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        rounds,
        "one recompute a round"
    );
}

/// The `Allocator` implementation is a door of the pool like `alloc`: a collection's request
/// that the budget refuses evicts a value (it was refused where `pool.alloc` of the same size
/// evicted and succeeded).
#[cfg(feature = "allocator-api2")]
#[test]
fn a_collection_in_the_pool_evicts_as_alloc_does() {
    let pool = pool_with_budget(1 << 20);
    let calls = Arc::new(AtomicUsize::new(0));
    let value = leaf(&pool, 512 * KIB, 5.0, &calls);
    let mut bytes = allocator_api2::vec::Vec::<u8, &BufferPool>::new_in(&pool);
    bytes
        .try_reserve_exact(768 * KIB)
        .expect("served by evicting the value");
    assert!(!value.is_resident());
    drop(bytes);
    assert_eq!(first_element(&value), 5.0);
}
