//! The trace's table of thread names is bookkeeping: it never takes a block from the pool it
//! describes, not even when a thread's exit moves its name there while the thread's
//! thread-locals are being destroyed (where no bookkeeping scope can be opened).

use ferropool::{BufferPool, PoolAllocator};

#[global_allocator]
static ALLOCATOR: PoolAllocator = PoolAllocator::with_threshold(PoolAllocator::MIN_THRESHOLD);

/// Runs `count` named threads one after the other; each allocates, begins a span (which
/// enters its name in the table) and exits (which moves the name to the exited ones).
fn named_threads(count: usize) {
    for i in 0..count {
        std::thread::Builder::new()
            .name(format!("named {i}"))
            .spawn(|| {
                let pool = BufferPool::global();
                drop(pool.alloc(64)); // a pool operation: the thread has an index
                drop(pool.trace_span("work"));
            })
            .expect("a thread starts")
            .join()
            .expect("the thread ends");
    }
}

#[test]
fn exited_thread_names_take_nothing_from_the_pool() {
    let pool = BufferPool::global();
    assert!(pool.enable_trace(64), "tracing on");
    named_threads(8); // the threads' own first allocations, whatever they are
    let before = pool.stats();
    // Enough exits for the exited names' queue to pass the front end's 4 KiB threshold (the
    // main job's)
    // (24 bytes an entry): it grew in the pool, from the exiting threads.
    named_threads(600);
    let after = pool.stats();
    assert_eq!(
        after.in_use_bytes, before.in_use_bytes,
        "blocks held after the threads exited: {before:?}\n{after:?}"
    );
}
