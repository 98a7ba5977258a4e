//! The ways out: a buffer's block given back through the calling thread's cache (its bin of
//! the class, else the class's shared list, or the page layer for a block that merges on
//! free), the same through the shared lists alone for a thread without a cache, and a
//! change of a buffer's requested length.

use std::ptr::NonNull;

use super::blocks::Record;
use super::cache::{Entry, PoolThreadCache};
use super::close;
use super::inner::PoolInner;
use super::lists::CACHELESS_SHARD;
use crate::pool::class;
use crate::pool::observe::trace::PoolEventKind;

impl PoolInner {
    /// Returns a dropped buffer's block (of `class`, `requested` bytes asked for) to its pool.
    ///
    /// Out of line on purpose. With the free inlined into `Drop`, the drop glue grew too large
    /// for the compiler to inline into the caller; it then took the buffer by pointer, so the
    /// caller moved the buffer through memory first, storing it a word at a time and loading it
    /// back 16 bytes at a time, which the CPU cannot forward from its store buffer (some 40% of
    /// an alloc + free on AMD Zen 4). A call taking the fields by value keeps them in registers.
    ///
    /// It runs the free's hot path ([`PoolInner::free_cached`], which makes no call) and leaves
    /// everything else to the cold [`give_back_uncached`](Self::give_back_uncached), so that it
    /// saves few registers on the way in: an alloc + free of a cached 4 KiB block went from
    /// 16.5-16.7 to 14.6-14.8 ns on an AMD Zen 3 machine when the whole free stopped being this
    /// function's body (glibc's `Vec` took 24.3-25.1 ns in the same runs; `benches/README.md`).
    ///
    /// The pool and record come as raw pointers, not references, on purpose: when the pool was
    /// closed this call may free both, and a reference argument would outlive them.
    ///
    /// # Safety
    ///
    /// - `pool`, `record`, `class` and `requested` are one live buffer's own fields: the
    ///   block's record, the class it was handed out with (a wrong class would list the block
    ///   in a class of larger blocks) and the buffer's current length (the counters take it
    ///   back);
    /// - `zero` only if every byte of the block is zero;
    /// - that buffer is given back by this call alone, exactly once, and never used again;
    /// - the caller holds no reference into the pool or its records across the call (this call
    ///   may free the pool; see [`close::count_out`]).
    #[inline(never)]
    pub(in crate::pool) unsafe fn give_back(
        pool: NonNull<PoolInner>,
        record: NonNull<Record>,
        class: usize,
        requested: usize,
        zero: bool,
    ) {
        {
            // SAFETY: the caller's contract: the pool is alive until this buffer is given back.
            let inner = unsafe { pool.as_ref() };
            // SAFETY: the caller's contract; records live as long as their pool.
            let record = unsafe { record.as_ref() };
            if zero {
                // Before the block is listed or binned: the next taker reads it after.
                record.mark_zero(class, requested);
            }
            let cached = inner.free_cached(record, class, requested);
            if cached {
                return;
            }
        }
        // SAFETY: the caller's contract, passed on whole: `free_cached` changed nothing.
        unsafe { Self::give_back_uncached(pool, record, class, requested) }
    }

    /// What [`give_back`](Self::give_back) leaves to the pool's whole free: a block for the
    /// shared lists, a closed pool, a thread on another pool.
    ///
    /// # Safety
    ///
    /// As for [`give_back`](Self::give_back).
    #[cold]
    #[inline(never)]
    unsafe fn give_back_uncached(
        pool: NonNull<PoolInner>,
        record: NonNull<Record>,
        class: usize,
        requested: usize,
    ) {
        let closed = {
            // SAFETY: the caller's contract: the pool is alive until this buffer is given back.
            let inner = unsafe { pool.as_ref() };
            // SAFETY: the caller's contract; records live as long as their pool.
            let record = unsafe { record.as_ref() };
            inner.free(record, class, requested)
        };
        if closed {
            // SAFETY: the pool closed before this free, which released the block; the
            // buffer is still counted, so the pool is alive; the borrows above have ended, and
            // the caller holds none across this call (the contract's last clause).
            unsafe { close::count_out(pool) };
        }
    }

    /// Counts a change of a handed-out block's requested size from `old` to `new` bytes (an
    /// in-place reallocation), as a free of `old` requested bytes and an allocation of `new`
    /// would count them, without counting a block. After the pool's close nothing is
    /// counted (its counters are final).
    pub(in crate::pool) fn count_resize(&self, record: &Record, old: usize, new: usize) {
        record.set_requested(new);
        let Some((cache, thread, _)) = self.my_cache() else {
            if self.begin_cacheless() {
                self.books.count_cacheless_resize(&self.config, old, new);
                self.life.end_cacheless();
            }
            return;
        };
        if let Entry::Open { busy, .. } = cache.begin_operation(self.life.closed_flag()) {
            cache.count_resize(old, new);
            let writers = self.books.exact_writers(&self.config, thread);
            self.books
                .exact_resize(&self.config, old as u64, new as u64, writers);
            cache.end_operation(busy);
        }
    }

    /// The hot path of a free: caches the block in the calling thread's bin of `class` and
    /// counts the free, or returns false having changed nothing but the cache's operation
    /// count (a thread whose last pool operation was on another pool, a block another thread
    /// allocated, a class the caches skip, a closed pool, bins being drained, a full bin, a
    /// pool recording a trace). Then [`free`](Self::free) does it all.
    ///
    /// It makes no call, so that `give_back`, which runs it first, saves few registers on
    /// the way in.
    #[inline(always)]
    pub(in crate::pool) fn free_cached(
        &self,
        record: &Record,
        class: usize,
        requested: usize,
    ) -> bool {
        if !self.caches.keep(class) || self.books.ring().is_some() || self.memory.over_budget() {
            return false;
        }
        let Some((cache, thread, _)) = self.my_remembered_cache() else {
            return false;
        };
        if record.allocator() != thread {
            return false;
        }
        let class_bytes = class::class_size(class);
        let Entry::Open { cache_usable, busy } = cache.begin_operation(self.life.closed_flag())
        else {
            return false;
        };
        if !(cache_usable && self.bin(cache, class, class_bytes, record)) {
            cache.end_operation(busy);
            return false;
        }
        record.take_back();
        self.count_free(cache, thread, class_bytes, requested);
        cache.end_operation(busy);
        true
    }

    /// Caches `record`'s block in the bin of `class` of `cache` if the configured limits
    /// leave room (the owner, inside an operation with bins usable); whether it did.
    #[inline(always)]
    fn bin(
        &self,
        cache: &PoolThreadCache,
        class: usize,
        class_bytes: usize,
        record: &Record,
    ) -> bool {
        let config = &self.config;
        cache.push(
            class,
            class_bytes,
            record,
            config.thread_cache_blocks_per_class,
            config.thread_cache_bytes,
        )
    }

    /// Counts a free in the cache of the calling thread, `thread` (inside an operation), as
    /// [`count_alloc`](Self::count_alloc) counts an allocation.
    #[inline(always)]
    fn count_free(
        &self,
        cache: &PoolThreadCache,
        thread: u32,
        class_bytes: usize,
        requested: usize,
    ) {
        cache.count_free(class_bytes, requested);
        let writers = self.books.exact_writers(&self.config, thread);
        self.books
            .exact_free(&self.config, class_bytes as u64, requested as u64, writers);
    }

    /// Gives a buffer's block back (its `Drop`, through `give_back_uncached`, once
    /// [`free_cached`](Self::free_cached) declined). Returns whether the
    /// pool was closed: the block then went back to the system, and the caller must count
    /// the buffer out with `close::count_out` once no reference into the pool is left
    /// (this call's frame included), since the pool may be freed from then on.
    #[inline]
    pub(in crate::pool) fn free(&self, record: &Record, class: usize, requested: usize) -> bool {
        let class_bytes = class::class_size(class);
        let allocator = record.take_back();
        let Some((cache, thread, _)) = self.my_cache() else {
            return self.free_cacheless(record.index, class, requested);
        };
        match cache.begin_operation(self.life.closed_flag()) {
            Entry::Closed => {
                // SAFETY: the buffer being freed held the block (`take_back` above), and
                // the pool is closed: nothing else reaches it.
                unsafe { self.release_block(record.index, class) };
                true
            }
            Entry::Open { cache_usable, busy } => {
                // Over a lowered budget the block goes back too, not to a cache.
                let merge = self.merges_on_free(class_bytes) || self.memory.over_budget();
                let cached = !merge
                    && cache_usable
                    && allocator == thread
                    && self.caches.keep(class)
                    && self.bin(cache, class, class_bytes, record);
                if merge {
                    // SAFETY: the buffer being freed held the block, not cached or listed.
                    unsafe { self.release_block(record.index, class) };
                } else if !cached {
                    self.lists.push(cache.shard(), class, record);
                }
                self.count_free(cache, thread, class_bytes, requested);
                // Inside the operation: after `end_operation`, a closing thread may free the pool.
                self.books
                    .trace(PoolEventKind::Free, class_bytes as u64, class);
                cache.end_operation(busy);
                false
            }
        }
    }

    /// [`free`](Self::free) for a thread without a cache: to the shared list.
    #[cold]
    pub(in crate::pool) fn free_cacheless(
        &self,
        record: u32,
        class: usize,
        requested: usize,
    ) -> bool {
        if !self.begin_cacheless() {
            // SAFETY: the buffer being freed held the block, and the pool is closed.
            unsafe { self.release_block(record, class) };
            return true;
        }
        let class_bytes = class::class_size(class);
        // Over a lowered budget the block goes back, as `free` sends it.
        if self.merges_on_free(class_bytes) || self.memory.over_budget() {
            // SAFETY: the buffer being freed held the block, not cached or listed.
            unsafe { self.release_block(record, class) };
        } else {
            self.lists
                .push(CACHELESS_SHARD, class, self.memory.record(record));
        }
        self.books
            .count_cacheless(&self.config, class_bytes, requested, false);
        self.life.end_cacheless();
        false
    }
}
