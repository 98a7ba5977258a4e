//! The system allocator refuses on the N-th large request: every public API that needs
//! memory from the system returns a typed error, and the pool stays consistent and usable.
//! The pool takes its blocks from the global allocator here (`os_pages` off), which is what
//! refuses; `tests/os_refusal.rs` has the OS refuse the pool's own pages.
//!
//! Only requests of 1 MiB or more are refused: those are the pool's buffers. Small requests
//! go to Rust's infallible collections, which abort the process on failure instead of
//! unwinding, so refusing them would test std rather than ferropool.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ferropool::{BufferPool, DType, PoolConfig, PoolError, Tensor, TensorError};

struct Refusing;
static ARMED: AtomicBool = AtomicBool::new(false);
/// Whether only one request is refused (else every one from the countdown's end on).
static ONCE: AtomicBool = AtomicBool::new(true);
/// Large requests left before the first one that is refused.
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
    if !ARMED.load(Ordering::SeqCst) || layout.size() < LARGE {
        return false;
    }
    let left = COUNTDOWN.load(Ordering::SeqCst);
    if left > 1 {
        COUNTDOWN.store(left - 1, Ordering::SeqCst);
        return false;
    }
    if left == 1 && ONCE.load(Ordering::SeqCst) {
        COUNTDOWN.store(0, Ordering::SeqCst);
        return true;
    }
    left == 1
}

#[global_allocator]
static GLOBAL: Refusing = Refusing;

/// Refuse the `n`-th large request from now on (1 = the next one), and every later one.
fn arm(n: usize) {
    ONCE.store(false, Ordering::SeqCst);
    COUNTDOWN.store(n, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
}

/// Refuse only the `n`-th large request from now on.
fn arm_once(n: usize) {
    ONCE.store(true, Ordering::SeqCst);
    COUNTDOWN.store(n, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
}

fn disarm() {
    ARMED.store(false, Ordering::SeqCst);
}

// One test function: the allocator's switch is process-wide, so the steps must not overlap.
#[test]
fn refused_system_allocations_are_typed_and_leave_the_pool_consistent() {
    let pool = BufferPool::with_config(PoolConfig {
        os_pages: false,
        ..PoolConfig::default()
    })
    .unwrap();

    // 1. A refused block is a typed error naming what was asked; nothing is counted.
    arm(1);
    let err = pool.alloc(2 * LARGE).unwrap_err();
    disarm();
    let PoolError::SystemAllocFailed(report) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(report.requested, 2 * LARGE);
    assert_eq!(
        report.block_bytes,
        BufferPool::class_size_for(2 * LARGE).unwrap()
    );
    assert!(
        err.to_string().contains("cannot allocate 2.00 MiB"),
        "{err}"
    );
    let stats = pool.stats();
    assert_eq!(
        (
            stats.allocations,
            stats.reserved_bytes,
            stats.system_allocations,
            stats.alloc_retries
        ),
        (0, 0, 0, 1),
        "nothing counted but the retry"
    );
    // Nor is the refused block in the peak: the pool never held it (it read 2 MiB here when
    // the reservation raised the peak before the system was asked).
    assert_eq!(stats.peak_reserved_bytes, 0, "{stats:?}");
    let held = pool.alloc(LARGE).unwrap();
    arm(1);
    assert!(pool.alloc(4 * LARGE).is_err());
    disarm();
    let stats = pool.stats();
    let one_block = BufferPool::class_size_for(LARGE).unwrap() as u64;
    assert_eq!(
        (stats.reserved_bytes, stats.peak_reserved_bytes),
        (one_block, one_block),
        "{stats:?}"
    );
    drop(held);
    pool.trim();

    // 2. From the N-th of a run of allocations on, the system refuses: the earlier ones are
    //    intact and usable, the later ones typed errors.
    for n in 1..=5 {
        pool.trim(); // every request below must reach the system
        arm(n);
        let results: Vec<_> = (0..5).map(|i| pool.alloc((3 + i) * LARGE)).collect();
        disarm();
        for (i, result) in results.iter().enumerate() {
            match result {
                Ok(buffer) => {
                    assert!(i + 1 < n, "request {i} of round {n} succeeded");
                    assert_eq!(buffer.len(), (3 + i) * LARGE);
                }
                Err(e) => {
                    assert!(i + 1 >= n, "request {i} of round {n} was refused");
                    assert!(matches!(e, PoolError::SystemAllocFailed(_)));
                }
            }
        }
        common::assert_pool_consistent(&pool.stats());
        drop(results);
        let stats = pool.stats();
        assert_eq!(stats.in_use_bytes, 0);
        common::assert_pool_consistent(&stats);
    }

    // 2b. A refusal while blocks are cached: the pool gives them back and tries again.
    drop(pool.alloc(5 * LARGE).unwrap()); // cached now
    arm_once(1);
    let buffer = pool.alloc(7 * LARGE).unwrap();
    disarm();
    let stats = pool.stats();
    assert_eq!(stats.cached_bytes, 0, "the cached block went back first");
    assert_eq!(stats.in_use_bytes, buffer.capacity() as u64);
    drop(buffer);

    // 3. Tensors surface the pool's error through their own typed error.
    pool.trim();
    arm(1);
    let err = Tensor::zeros_in(&pool, DType::F32, &[1024, 1024]).unwrap_err();
    disarm();
    assert!(
        matches!(err, TensorError::Pool(PoolError::SystemAllocFailed(_))),
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
