//! The system allocator refuses on the N-th large request: every public API that needs
//! memory from the system returns a typed error, and the pool stays consistent and usable.
//!
//! Only requests of 1 MiB or more are refused: those are the pool's buffers. Small requests
//! go to Rust's infallible collections, which abort the process on failure instead of
//! unwinding, so refusing them would test std rather than ferropool.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ferropool::{BufferPool, DType, PoolError, Tensor, TensorError};

struct Refusing;
static ARMED: AtomicBool = AtomicBool::new(false);
/// Large requests left before the one that is refused.
static COUNTDOWN: AtomicUsize = AtomicUsize::new(0);
const LARGE: usize = 1 << 20;

// SAFETY: forwards to `System`, except that it may return null, which `alloc` permits.
unsafe impl GlobalAlloc for Refusing {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if refuse(layout) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if refuse(layout) {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn refuse(layout: Layout) -> bool {
    ARMED.load(Ordering::SeqCst)
        && layout.size() >= LARGE
        && COUNTDOWN.fetch_sub(1, Ordering::SeqCst) == 1
}

#[global_allocator]
static GLOBAL: Refusing = Refusing;

/// Refuse the `n`-th large request from now on (1 = the next one).
fn arm(n: usize) {
    COUNTDOWN.store(n, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
}

fn disarm() {
    ARMED.store(false, Ordering::SeqCst);
}

// One test function: the allocator's switch is process-wide, so the steps must not overlap.
#[test]
fn refused_system_allocations_are_typed_and_leave_the_pool_consistent() {
    let pool = BufferPool::new();

    // 1. A refused block is a typed error naming what was asked; nothing is counted.
    arm(1);
    let err = pool.alloc(2 * LARGE).unwrap_err();
    disarm();
    assert_eq!(
        err,
        PoolError::SystemAllocFailed {
            size: BufferPool::class_size_for(2 * LARGE).unwrap(),
            align: 64
        }
    );
    let stats = pool.stats();
    assert_eq!(
        (
            stats.allocations,
            stats.reserved_bytes,
            stats.system_allocations
        ),
        (0, 0, 0)
    );

    // 2. The N-th of a run of allocations fails; the others are intact and usable.
    for n in 1..=5 {
        pool.trim(); // every request below must reach the system
        arm(n);
        let results: Vec<_> = (0..5).map(|i| pool.alloc((3 + i) * LARGE)).collect();
        disarm();
        assert_eq!(
            results.iter().filter(|r| r.is_err()).count(),
            1,
            "round {n}"
        );
        for (i, result) in results.iter().enumerate() {
            match result {
                Ok(buffer) => assert_eq!(buffer.len(), (3 + i) * LARGE),
                Err(e) => {
                    assert_eq!(i + 1, n, "only the {n}-th request is refused");
                    assert!(matches!(e, PoolError::SystemAllocFailed { .. }));
                }
            }
        }
        common::assert_pool_consistent(&pool.stats());
        drop(results);
        let stats = pool.stats();
        assert_eq!(stats.in_use_bytes, 0);
        common::assert_pool_consistent(&stats);
    }

    // 3. Tensors surface the pool's error through their own typed error.
    pool.trim();
    arm(1);
    let err = Tensor::zeros_in(&pool, DType::F32, &[1024, 1024]).unwrap_err();
    disarm();
    assert!(
        matches!(err, TensorError::Pool(PoolError::SystemAllocFailed { .. })),
        "{err}"
    );

    // 4. The pool is still fully usable, and everything goes back.
    let t = Tensor::zeros_in(&pool, DType::F32, &[1024, 1024]).unwrap();
    assert_eq!(t.as_slice::<f32>().unwrap().len(), 1 << 20);
    drop(t);
    let cached = pool.stats().cached_bytes;
    assert!(cached > 0);
    assert_eq!(pool.trim(), cached, "trim releases exactly what was cached");
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes, 0);
    assert_eq!(stats.system_allocations, stats.system_frees);
}
