//! A pool's memory is never stranded: closing it returns every cached block at once (idle
//! threads' caches included), buffers that outlive it go back to the system when they drop,
//! and its control block is freed when the last handle and the last buffer are gone.
//!
//! A counting global allocator sees every block (the pools here take their blocks from the
//! global allocator: `os_pages` off; `tests/os_pages.rs` shows the same of the pool's own
//! pages with the process's resident memory). One test function: the counter is
//! process-wide.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use ferropool::{BufferPool, PoolConfig};

struct Counting;
/// Bytes of large (block-sized) allocations now live.
static LIVE: AtomicUsize = AtomicUsize::new(0);
const LARGE: usize = 4096;

// SAFETY: forwards to `System`, counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE {
            LIVE.fetch_add(layout.size(), Ordering::SeqCst);
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= LARGE {
            LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        }
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A pool whose blocks come from the global allocator, one allocation each.
fn heap_pool() -> BufferPool {
    BufferPool::with_config(PoolConfig {
        os_pages: false,
        ..PoolConfig::default()
    })
    .unwrap()
}

fn live() -> usize {
    LIVE.load(Ordering::SeqCst)
}

#[test]
fn nothing_is_stranded() {
    // 1. An idle worker's cache goes back when the pool closes, without the worker.
    let baseline = live();
    let pools_before = BufferPool::pools_alive();
    let pool = heap_pool();
    let (go, wait) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<()>();
    let worker = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            drop(pool.alloc(1 << 20).unwrap()); // cached by this thread
            drop(pool); // the worker keeps no handle, only its (idle) cache
            done.send(()).unwrap();
            wait.recv().unwrap();
        })
    };
    finished.recv().unwrap();
    assert!(live() >= baseline + (1 << 20));
    drop(pool); // the last handle: the pool closes now, the worker still idle
    assert_eq!(
        live(),
        baseline,
        "the idle worker's cached block went back at once"
    );
    assert_eq!(
        BufferPool::pools_alive(),
        pools_before,
        "the control block was freed"
    );
    go.send(()).unwrap();
    worker.join().unwrap();

    // 2. Buffers outlive their pool: each goes back to the system when it drops, on any
    //    thread (even one new to the pool), and the last one frees the control block.
    let pool = heap_pool();
    let mut buffers: Vec<_> = (0..8).map(|i| pool.alloc((i + 1) << 16).unwrap()).collect();
    drop(pool);
    assert_eq!(
        BufferPool::pools_alive(),
        pools_before + 1,
        "kept for its buffers"
    );
    let rest = buffers.split_off(4);
    drop(buffers);
    assert_eq!(BufferPool::pools_alive(), pools_before + 1);
    std::thread::spawn(move || drop(rest)).join().unwrap();
    assert_eq!(live(), baseline);
    assert_eq!(
        BufferPool::pools_alive(),
        pools_before,
        "freed with its last buffer"
    );

    // 3. Many short-lived pools, each used by this thread and another, leave nothing.
    for i in 0..if cfg!(miri) { 20 } else { 10_000 } {
        let pool = BufferPool::with_config(PoolConfig {
            os_pages: false,
            thread_cache_bytes: if i % 2 == 0 { 1 << 20 } else { 0 },
            ..PoolConfig::default()
        })
        .unwrap();
        let a = pool.alloc(64 << 10).unwrap();
        drop(pool.alloc(4096).unwrap());
        let b = std::thread::scope(|s| s.spawn(|| pool.alloc(8192).unwrap()).join().unwrap());
        drop((a, pool, b));
    }
    assert_eq!(live(), baseline);
    assert_eq!(BufferPool::pools_alive(), pools_before);
}
