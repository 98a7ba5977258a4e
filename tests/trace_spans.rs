//! A span allocates nothing once its thread has made one: with tracing off (one atomic
//! load) and with it on (two ring events in the ring allocated when tracing started). The
//! global allocator counts the allocations of the thread that is measured.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ferropool::BufferPool;

struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted, and how many there were.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = COUNT.try_with(|count| count.set(count.get() + 1));
    }
}

// SAFETY: forwards every call to `System` unchanged; counting touches only thread-locals
// without destructors, which allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING_ALLOCATOR: Counting = Counting;

/// The allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> usize {
    COUNT.set(0);
    COUNTING.set(true);
    f();
    COUNTING.set(false);
    COUNT.get()
}

#[test]
fn a_span_allocates_nothing_with_tracing_off_or_on() {
    // The counter sees this thread's allocations (else the zeros below prove nothing).
    let boxed = allocations(|| drop(std::hint::black_box(Box::new(1u64))));
    assert_eq!(boxed, 1, "the counting allocator counts");
    let pool = BufferPool::new();
    let off = allocations(|| {
        for _ in 0..1000 {
            let _span = pool.trace_span("off");
        }
    });
    assert_eq!(off, 0, "spans with tracing off");
    assert!(pool.enable_trace(4096));
    drop(pool.trace_span("first")); // the thread's first span stores its name
    let on = allocations(|| {
        for _ in 0..1000 {
            let _step = pool.trace_span("step");
            let _forward = pool.trace_span("forward");
        }
    });
    assert_eq!(on, 0, "spans with tracing on");
    assert_eq!(pool.trace_events().len(), 4002, "each span recorded");
}
