//! Where a pool is in its life ([`Lifecycle`]): the handles alive, the close, and the
//! buffers still out after it. The close protocol that uses it is in `close.rs`; the
//! fields are private to this file, and every step of the protocol is a method here.

use crate::sync::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

/// Where a pool is in its life: the handles alive, the close, and the buffers still out
/// after it (see the protocol in `close.rs`).
pub(in crate::pool) struct Lifecycle {
    /// `BufferPool` handles alive; the last one to drop closes the pool.
    handles: AtomicUsize,
    /// Set once, when the last handle drops (step 1).
    closed: AtomicBool,
    /// Live blocks after the close, less the frees since: whoever brings it to zero frees
    /// the control block.
    remaining: AtomicI64,
    /// Operations of threads that hold no thread index (their thread-locals are being
    /// destroyed) and so have no cache: they count here, with read-modify-writes, and the
    /// close waits for it to fall to zero as it waits for each cache's owner.
    cacheless_busy: AtomicUsize,
}

impl Lifecycle {
    /// A pool's life as it starts: one handle, open.
    pub(in crate::pool) fn new() -> Self {
        Self {
            handles: AtomicUsize::new(1),
            closed: AtomicBool::new(false),
            remaining: AtomicI64::new(0),
            cacheless_busy: AtomicUsize::new(0),
        }
    }

    /// The flag a thread cache's operation looks at as it begins (see `cache`).
    #[inline(always)]
    pub(in crate::pool) fn closed_flag(&self) -> &AtomicBool {
        &self.closed
    }

    /// Whether the pool is closed (an operation that sees it open may still meet the close:
    /// the thread cache's operation is what the close waits out).
    #[inline]
    pub(in crate::pool) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// One more handle, made from a live one (relaxed, like `Arc::clone`).
    pub(in crate::pool) fn add_handle(&self) {
        self.handles.fetch_add(1, Ordering::Relaxed);
    }

    /// One handle less; whether it was the last (the caller then runs [`close`]).
    pub(in crate::pool) fn drop_handle(&self) -> bool {
        if self.handles.fetch_sub(1, Ordering::Release) != 1 {
            return false;
        }
        crate::sync::fence(Ordering::Acquire);
        true
    }

    /// Starts an operation of a thread without a cache: true if the pool is open (the
    /// operation counted, so the close waits for it; the caller ends it with
    /// [`end_cacheless`](Self::end_cacheless)), false if it is closed.
    pub(in crate::pool) fn begin_cacheless(&self) -> bool {
        self.cacheless_busy.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.cacheless_busy.fetch_sub(1, Ordering::Release);
            return false;
        }
        true
    }

    /// Ends an operation begun by [`begin_cacheless`](Self::begin_cacheless).
    pub(in crate::pool) fn end_cacheless(&self) {
        self.cacheless_busy.fetch_sub(1, Ordering::Release);
    }

    /// Step 1 of the close: the pool is closed from here on (the caller then fences and
    /// waits out the operations that saw it open).
    pub(in crate::pool) fn mark_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Part of step 2 of the close: waits until no operation of a thread without a cache is
    /// in flight.
    pub(in crate::pool) fn wait_out_cacheless(&self) {
        while self.cacheless_busy.load(Ordering::Acquire) != 0 {
            crate::sync::yield_now();
        }
    }

    /// Step 4 of the close: `live` buffers are still out; whether none is (and none of the
    /// frees after the close is still to come), so that the close frees the control block.
    pub(in crate::pool) fn add_live(&self, live: i64) -> bool {
        self.remaining.fetch_add(live, Ordering::AcqRel) + live == 0
    }

    /// A buffer counted out after the close; whether it was the last one out (the caller
    /// then frees the control block).
    ///
    /// # Safety
    ///
    /// `life` points to the `Lifecycle` of a live pool, and the caller's buffer is one of
    /// those counted in `remaining`. Only the counter is referenced, and only for the
    /// decrement: from the decrement on, another thread may free the pool.
    pub(in crate::pool) unsafe fn drop_remaining(life: *const Self) -> bool {
        // SAFETY: the caller's contract; the reference is to the atomic alone.
        let remaining = unsafe { &*std::ptr::addr_of!((*life).remaining) };
        remaining.fetch_sub(1, Ordering::AcqRel) == 1
    }
}
