//! Formatting the pool's errors and statistics allocates nothing: a message may be written while
//! the pool is the global allocator and short of budget. This binary counts every allocation of the
//! process, so it holds one test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use ferropool::{BufferPool, PoolError};

/// Counts allocations, passing them to the system.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to `System` unchanged; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on (the block came from `System.alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A `fmt::Write` into a fixed buffer, so that the test's own writing allocates nothing.
struct Fixed {
    bytes: [u8; 1024],
    len: usize,
}

impl Write for Fixed {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(std::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[test]
fn writing_pool_errors_and_stats_allocates_nothing() {
    let pool = BufferPool::new();
    pool.set_budget(Some(1 << 20));
    let budget = pool.alloc(3 << 20).expect_err("over the budget");
    assert!(matches!(budget, PoolError::BudgetExceeded(_)));
    let too_large = pool.alloc(usize::MAX).expect_err("no class that large");
    let stats = pool.stats();
    let shown: [&dyn std::fmt::Display; 3] = [&budget, &too_large, &stats];
    for item in shown {
        let mut out = Fixed {
            bytes: [0; 1024],
            len: 0,
        };
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        write!(out, "{item}").unwrap();
        let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;
        let text = std::str::from_utf8(&out.bytes[..out.len]).unwrap();
        assert!(text.contains("iB") || text.contains(" B"), "{text}");
        assert_eq!(allocations, 0, "formatting {text:?} allocated");
    }
}
