//! The shared state of one pool, [`PoolInner`] (what every handle, buffer and thread cache
//! of the pool points to), and a buffer's way out and back through it: `alloc` and `free`
//! through the calling thread's cache (its bins, then the class's shared list, then the
//! system), and the same through the shared lists alone for a thread that holds no thread
//! index (its thread-locals are being destroyed).
//!
//! `PoolInner` is a composition of parts that keep their own state: the lifecycle
//! (`life.rs`), the thread caches (`cache.rs`), the shared lists (`lists.rs`), the memory
//! (`memory.rs`: budget, block records, pages), the books (`observe/books.rs`) and the
//! evictable values (`evict/`). Its methods are here (the ways in and out) and in
//! `drain.rs` (what goes back, and the cold reads across the parts).

use std::fmt;
use std::ptr::NonNull;

use super::super::counters::{
    solo_value, Writers, CACHELESS, SOLO_NONE, SOLO_SHARED, SOLO_SWITCHING,
};
use super::super::evict::value::Evictor;
use super::super::observe::books::Books;
use super::super::PoolEventKind;
use super::super::{class, OutOfMemory, PoolBuffer, PoolConfig, PoolError};
use super::blocks::Record;
use super::cache::{Entry, PoolThreadCache, ThreadCaches};
use super::life::Lifecycle;
use super::lists::{SharedLists, CACHELESS_SHARD};
use super::memory::Memory;
use crate::sync::Ordering;
use crate::thread;

/// The shared state of one pool: the composition of its parts.
///
/// In declaration order (`repr(C)`): the fields every cached allocation and free reads
/// first, together, then the cold parts: left to the compiler's order, the pool's one-thread
/// alloc+free was about 5% slower (`benches/README.md`).
#[repr(C)]
pub(crate) struct PoolInner {
    /// The pool-wide counters, those of threads without a cache, and the event trace
    /// (`observe/books.rs`).
    pub(in crate::pool) books: Books,
    pub(in crate::pool) id: u64,
    /// The thread caches, the classes they keep and the drains' tokens (`cache.rs`).
    pub(in crate::pool) caches: ThreadCaches,
    /// The handles, the close, and the buffers still out after it (`life.rs`; the close
    /// protocol in `lifetime.rs` goes through its methods).
    pub(in crate::pool) life: Lifecycle,
    pub(in crate::pool) config: PoolConfig,
    /// The shared lists of blocks no thread cache holds, by class, and the idle policy's
    /// record of the classes drawn on (`lists.rs`, which keeps their invariant).
    pub(in crate::pool) lists: SharedLists,
    /// The budget, what the pool holds from the system, the block records and the pages
    /// (`memory.rs`, which keeps its books).
    pub(in crate::pool) memory: Memory,
    /// The evictable values of the pool and what their eviction counts (see `evict`).
    pub(in crate::pool) evictor: Evictor,
}

impl fmt::Debug for PoolInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolInner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A block just taken for a buffer: two words, so that a call returns it (or an `Option` of
/// it) in registers. A taken block's address is read from its record when needed. (With
/// the address and a separate flag byte in it, the value went through the stack, and the
/// flag's one-byte store then stalled an eight-byte load of the same word: a fifth of the
/// samples of an allocation past the thread cache, in `perf`.)
pub(in crate::pool) struct Taken<'p> {
    pub(in crate::pool) record: &'p Record,
    /// The block's class (the request's own, or a larger one: see
    /// [`PoolInner::pop_list_or_larger`]), with [`Taken::ZEROED`] set when its bytes are known
    /// to be zero.
    class_and_zeroed: usize,
}

impl<'p> Taken<'p> {
    /// Set in `class_and_zeroed` for a block known to be zero (classes are far below it).
    const ZEROED: usize = 1 << (usize::BITS - 1);

    /// The block of `record`, of `class`; `zeroed` when its bytes are known to be zero.
    #[inline(always)]
    pub(in crate::pool) fn new(record: &'p Record, class: usize, zeroed: bool) -> Self {
        debug_assert!(class < class::CLASSES);
        let flag = if zeroed { Self::ZEROED } else { 0 };
        Self {
            record,
            class_and_zeroed: class | flag,
        }
    }

    /// The block's class.
    #[inline(always)]
    pub(in crate::pool) fn class(&self) -> usize {
        self.class_and_zeroed & !Self::ZEROED
    }

    /// Whether the block's bytes are known to be zero.
    #[inline(always)]
    fn zeroed(&self) -> bool {
        self.class_and_zeroed & Self::ZEROED != 0
    }

    /// The buffer of `size` bytes over this block (whose class holds at least `size`
    /// bytes), zeroed first if `zeroed` asks and the block is not known to be zero.
    #[inline(always)]
    fn into_buffer(self, pool: NonNull<PoolInner>, size: usize, zeroed: bool) -> PoolBuffer {
        // SAFETY: a taken record holds its block (listed, binned or just given one), whose
        // address it keeps until the block is released.
        let addr = unsafe { self.record.addr() };
        if zeroed && !self.zeroed() {
            // SAFETY: the block holds `class_size(self.class()) >= size` bytes and is
            // exclusively ours (just taken).
            unsafe { addr.as_ptr().write_bytes(0, size) };
        }
        PoolBuffer::new(pool, addr, size, self.record, self.class(), zeroed)
    }
}

/// A request may take a listed block of a larger class holding at most `1 / LARGER_BLOCK_SLACK`
/// more bytes than its own class (with `PoolConfig::larger_blocks`).
pub(in crate::pool) const LARGER_BLOCK_SLACK: usize = 4;

/// See [`PoolInner::merges_on_free`].
const MERGE_MIN_BLOCK: usize = 256 << 10;

impl PoolInner {
    /// The calling thread's cache, index and memory tag: one thread-local read when this
    /// thread's last pool operation was on this pool. `None` if the thread holds no index.
    #[inline(always)]
    pub(in crate::pool) fn my_cache(&self) -> Option<(&PoolThreadCache, u32, u32)> {
        self.my_remembered_cache().or_else(|| self.my_cache_slow())
    }

    /// [`my_cache`](Self::my_cache) when this thread's last pool operation was on this pool
    /// (one thread-local read), else `None`. Under loom, which has no thread-local memo, the
    /// whole `my_cache`, so that the models run the hot paths that start with it.
    #[inline(always)]
    fn my_remembered_cache(&self) -> Option<(&PoolThreadCache, u32, u32)> {
        #[cfg(loom)]
        return self.my_cache_slow();
        #[cfg(not(loom))]
        {
            let (cache, thread, tag) = thread::remembered_pool_cache(self.id)?;
            // SAFETY: `my_cache_slow` cached this pointer from this pool's cache table (pool
            // identities are never reused), whose pages never move or free while the pool
            // lives; the caller keeps the pool alive.
            Some((unsafe { &*cache.cast::<PoolThreadCache>() }, thread, tag))
        }
    }

    /// The calling thread's cache if it has one already (a thread that never used the pool
    /// gets none, and no cache is made).
    pub(in crate::pool) fn my_existing_cache(&self) -> Option<&PoolThreadCache> {
        if let Some((cache, _, _)) = thread::remembered_pool_cache(self.id) {
            // SAFETY: as in `my_cache`.
            return Some(unsafe { &*cache.cast::<PoolThreadCache>() });
        }
        let thread = u32::try_from(thread::index()?).ok()?;
        self.caches.get(thread)
    }

    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn my_cache_slow(&self) -> Option<(&PoolThreadCache, u32, u32)> {
        let thread = u32::try_from(thread::index()?).ok()?;
        let cache = self.caches.get_or_make(thread)?;
        self.join_exact_counters(Some(thread));
        thread::remember_pool_cache(self.id, std::ptr::from_ref::<PoolThreadCache>(cache).cast());
        Some((cache, thread, thread::tag()))
    }

    /// Makes sure the calling thread (`thread`, with its cache claimed; `None` for a thread
    /// without a cache) may count in the exact counters (see the invariant on
    /// `LiveBytes::in_use`): the first thread with a cache becomes their sole writer; any
    /// other thread ends that, waiting out the sole writer's operation in flight. Outside
    /// any operation of the caller: it may wait for another thread's. Cheap when the
    /// counters are shared already, or the caller's.
    #[inline]
    pub(in crate::pool) fn join_exact_counters(&self, thread: Option<u32>) {
        if !self.config.exact_counters() {
            return;
        }
        let solo = self.books.counters.live.solo.load(Ordering::Acquire);
        if solo == SOLO_SHARED || thread.and_then(solo_value) == Some(solo) {
            return;
        }
        self.join_exact_counters_slow(thread);
    }

    #[cold]
    #[inline(never)]
    fn join_exact_counters_slow(&self, thread: Option<u32>) {
        let solo = &self.books.counters.live.solo;
        let mine = thread.and_then(solo_value);
        let mut current = solo.load(Ordering::Acquire);
        loop {
            let next = match current {
                SOLO_SHARED => return,
                // Another thread is waiting out the sole writer: after its wait, shared.
                SOLO_SWITCHING => {
                    crate::sync::yield_now();
                    current = solo.load(Ordering::Acquire);
                    continue;
                }
                SOLO_NONE => mine.unwrap_or(SOLO_SHARED),
                owner if Some(owner) == mine => return,
                _ => SOLO_SWITCHING,
            };
            match solo.compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if next == SOLO_SWITCHING => break,
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
        // `current` is the sole writer's value (its thread plus one), whose cache exists:
        // it claimed it before it joined. From its next operation on it sees the switch (its
        // light fence pairs with this heavy one); the one in flight, if any, is waited out.
        crate::sync::asymmetric::heavy();
        if let Some(cache) = self.caches.get(current - 1) {
            cache.wait_out();
        }
        solo.store(SOLO_SHARED, Ordering::Release);
    }

    /// Allocates a buffer from the pool at `this`: the pool's one allocation entry. From the
    /// calling thread's cache when it has a block of the class at hand, else through
    /// [`alloc_uncached`](Self::alloc_uncached). With `evict` (every door of a handle), a
    /// request the budget refuses evicts values to make room
    /// ([`alloc_evicting`](Self::alloc_evicting)); without (the global allocator's front
    /// end, which must not run the eviction inside the process's allocator, and a retry
    /// after an eviction), it fails.
    #[inline]
    pub(in crate::pool) fn alloc(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
        evict: bool,
    ) -> Result<PoolBuffer, PoolError> {
        match Self::alloc_cached(this, size, zeroed) {
            Some(buffer) => Ok(buffer),
            None => Self::alloc_uncached(this, size, zeroed, evict),
        }
    }

    /// The hot path: a buffer from the calling thread's bin of the class, or `None` (no
    /// cache, a class the caches skip, a closed pool, bins being drained, an empty bin, a
    /// request too large), having changed nothing but the cache's operation count.
    ///
    /// It returns an `Option` (a buffer's non-null pointers are its niche, so no tag is
    /// written) and leaves every error to the cold path: with the whole `Result` built here,
    /// the buffer went through memory on its way to the caller, stored a word at a time and
    /// loaded back 16 bytes at a time, which the CPU cannot forward from its store buffer.
    #[inline(always)]
    pub(in crate::pool) fn alloc_cached(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
    ) -> Option<PoolBuffer> {
        // SAFETY: the caller holds a handle or a live buffer of the pool, which keeps it alive.
        let inner = unsafe { this.as_ref() };
        let class = class::class_of(size)?;
        if !inner.caches.keep(class) {
            return None;
        }
        let class_bytes = class::class_size(class);
        let (cache, thread, tag) = inner.my_cache()?;
        let Entry::Open { cache_usable, busy } = cache.begin_operation(inner.life.closed_flag())
        else {
            return None;
        };
        let Some(record) = cache_usable
            .then(|| cache.pop(class, class_bytes))
            .flatten()
        else {
            cache.end_operation(busy);
            return None;
        };
        record.hand_out(thread, tag, class, size);
        inner.count_alloc(cache, thread, class_bytes, size, true);
        cache.end_operation(busy);
        inner
            .books
            .trace(PoolEventKind::Alloc, class_bytes as u64, class);
        Some(Taken::new(record, class, false).into_buffer(this, size, zeroed))
    }

    /// Everything [`alloc_cached`](Self::alloc_cached) leaves: the errors, a thread without
    /// a cache, and blocks from the shared lists or the system.
    #[cold]
    #[inline(never)]
    fn alloc_uncached(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
        evict: bool,
    ) -> Result<PoolBuffer, PoolError> {
        Self::serve_uncached(this, size, zeroed, evict)
    }

    /// A request the budget refused with `report`, from a door that evicts: the eviction's
    /// hook (`Evictor::make_room`) evicts values until the request may fit, and
    /// the request tries again (the thread's cache first: an evicted block of its class may
    /// be there), until it is served or no value is left to evict; then it fails with the
    /// last try's report, which says what the values still held.
    #[cold]
    #[inline(never)]
    fn alloc_evicting(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
        mut report: Box<OutOfMemory>,
    ) -> Result<PoolBuffer, PoolError> {
        // SAFETY: the caller holds a handle or a live buffer of the pool, which keeps it alive.
        let inner = unsafe { this.as_ref() };
        let class = class::class_of(size).expect("a request the budget refused has a class");
        let mut first = true;
        while inner.evictor.make_room(inner, class, &report, first) {
            first = false;
            match Self::alloc(this, size, zeroed, false) {
                Err(PoolError::BudgetExceeded(again)) => report = again,
                served => return served,
            }
        }
        Err(inner.evictor.refused(inner, report))
    }

    /// The body of [`alloc_uncached`](Self::alloc_uncached), inlined into each cold caller,
    /// so that the result is not returned through one more call: a caller that received it
    /// from a call and then returned it copied it through memory, 16 bytes at a time out of
    /// word-sized stores, a load the store buffer cannot forward. With `evict`, a request
    /// the budget refuses goes on to [`alloc_evicting`](Self::alloc_evicting) from where the
    /// refusal is met (a caller that matched the returned result instead copied it the same
    /// way).
    #[inline(always)]
    fn serve_uncached(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
        evict: bool,
    ) -> Result<PoolBuffer, PoolError> {
        // SAFETY: the caller holds a handle or a live buffer of the pool, which keeps it alive.
        let inner = unsafe { this.as_ref() };
        let class = class::class_of(size).ok_or(PoolError::TooLarge {
            requested: size,
            max: class::MAX_SIZE,
        })?;
        let class_bytes = class::class_size(class);
        let Some((cache, thread, tag)) = inner.my_cache() else {
            let tag = thread::tag();
            return match inner.alloc_cacheless(this, class, class_bytes, size, zeroed, tag) {
                Err(PoolError::BudgetExceeded(report)) if evict => {
                    Self::alloc_evicting(this, size, zeroed, report)
                }
                served => served,
            };
        };
        // A closed pool refuses before a block is taken (`alloc_slow` checks again, under
        // the cache's operation, for a close that comes meanwhile).
        if inner.life.is_closed() {
            return Err(PoolError::Closed);
        }
        let taken = match inner.alloc_slow(cache, class, class_bytes, size, zeroed, thread, tag) {
            Ok(taken) => taken,
            Err(PoolError::BudgetExceeded(report)) if evict => {
                return Self::alloc_evicting(this, size, zeroed, report);
            }
            Err(error) => return Err(error),
        };
        let block_bytes = class::class_size(taken.class());
        inner
            .books
            .trace(PoolEventKind::Alloc, block_bytes as u64, taken.class());
        Ok(taken.into_buffer(this, size, zeroed))
    }

    /// A block from the class's shared lists (or a slightly larger class's, see
    /// [`pop_list_or_larger`](Self::pop_list_or_larger)) or the system, handed out to
    /// `thread`.
    #[inline(always)] // into `serve_uncached`, its one caller: `Taken` is not returned by a call
    #[allow(clippy::too_many_arguments)] // the hot path's locals, passed on as they are
    pub(in crate::pool) fn alloc_slow(
        &self,
        cache: &PoolThreadCache,
        class: usize,
        class_bytes: usize,
        size: usize,
        zeroed: bool,
        thread: u32,
        tag: u32,
    ) -> Result<Taken<'_>, PoolError> {
        self.lists.note_drawn(class);
        let taken = match self.pop_list_or_larger(cache.shard, class) {
            Some(taken) => {
                self.note_lender_drawn(&taken, class);
                taken
            }
            None => self.system_alloc(class, class_bytes, size, zeroed)?,
        };
        match cache.begin_operation(self.life.closed_flag()) {
            Entry::Closed => {
                // Only a buffer's `alloc_sibling` allocates without a handle; the pool
                // closed meanwhile, and its lists are drained for good: release the block.
                // SAFETY: just taken for this request, of its class, never handed out.
                unsafe { self.release_block(taken.record.index, taken.class()) };
                Err(PoolError::Closed)
            }
            Entry::Open { busy, .. } => {
                let block_bytes = class::class_size(taken.class());
                taken.record.hand_out(thread, tag, taken.class(), size);
                self.count_alloc(cache, thread, block_bytes, size, false);
                cache.end_operation(busy);
                Ok(taken)
            }
        }
    }

    /// A block new from the system, within the budget: first the listed blocks the budget
    /// lacks are released (largest first), then everything cached, and the system is asked
    /// once more if it refuses.
    #[cold]
    pub(in crate::pool) fn system_alloc(
        &self,
        class: usize,
        class_bytes: usize,
        size: usize,
        zeroed: bool,
    ) -> Result<Taken<'_>, PoolError> {
        let mut released = None;
        let memory = &self.memory;
        let bytes = class_bytes as u64;
        let room =
            memory.reserve(bytes) || (self.release_listed_for(bytes) && memory.reserve(bytes));
        if !room {
            // Release every cached block, other threads' caches included, and try once more.
            released = Some(self.release_cached_for_retry());
            self.books.counters.retries.fetch_add(1, Ordering::Relaxed);
            if !memory.reserve(bytes) {
                self.books
                    .counters
                    .budget_failures
                    .fetch_add(1, Ordering::Relaxed);
                let report = self.out_of_memory(size, class_bytes, released);
                return Err(PoolError::BudgetExceeded(Box::new(report)));
            }
        }
        let mut obtained = memory.new_block(class, class_bytes, zeroed);
        if obtained.is_none() && released.is_none() {
            // The system is short: give it back what is cached, then try once more.
            released = Some(self.release_cached_for_retry());
            self.books.counters.retries.fetch_add(1, Ordering::Relaxed);
            obtained = memory.new_block(class, class_bytes, zeroed);
        }
        let record = match obtained {
            Some(Ok(record)) => record,
            Some(Err(error)) => {
                memory.unreserve(bytes);
                return Err(error);
            }
            None => {
                memory.unreserve(bytes);
                let report = self.out_of_memory(size, class_bytes, released);
                return Err(PoolError::SystemAllocFailed(Box::new(report)));
            }
        };
        self.books.trace(PoolEventKind::SystemAlloc, bytes, class);
        Ok(Taken::new(record, class, zeroed))
    }

    /// Returns a block's memory to the system and its record to the spare list.
    ///
    /// # Safety
    ///
    /// The caller owns the block of `record` (taken off a list or bin, or handed back:
    /// nothing else can reach it), of `class`, and nothing uses it afterwards.
    pub(in crate::pool) unsafe fn release_block(&self, record: u32, class: usize) {
        let class_bytes = class::class_size(class);
        // SAFETY: the caller's contract; `system_alloc` obtained the block with this class.
        unsafe { self.memory.release(record, class_bytes) };
        self.books
            .trace(PoolEventKind::SystemFree, class_bytes as u64, class);
    }

    /// Counts an allocation in the cache of the calling thread, `thread` (inside an
    /// operation).
    #[inline(always)]
    pub(in crate::pool) fn count_alloc(
        &self,
        cache: &PoolThreadCache,
        thread: u32,
        class_bytes: usize,
        requested: usize,
        hit: bool,
    ) {
        cache
            .counters
            .count_alloc(hit, class_bytes, requested, Writers::Owner);
        let writers = self.books.counters.exact_writers(&self.config, thread);
        self.books.counters.exact_alloc(
            &self.config,
            class_bytes as u64,
            requested as u64,
            writers,
        );
    }

    /// Counts a change of a handed-out block's requested size from `old` to `new` bytes (an
    /// in-place reallocation), as a free of `old` requested bytes and an allocation of `new`
    /// would count them, without counting a block. After the pool's close nothing is
    /// counted (its counters are final).
    pub(in crate::pool) fn count_resize(&self, record: &Record, old: usize, new: usize) {
        record.set_requested(new);
        let Some((cache, thread, _)) = self.my_cache() else {
            if self.begin_cacheless() {
                self.books.cacheless.count_resize(old, new, Writers::Shared);
                self.books.counters.exact_resize(
                    &self.config,
                    old as u64,
                    new as u64,
                    Writers::Shared,
                );
                self.life.end_cacheless();
            }
            return;
        };
        if let Entry::Open { busy, .. } = cache.begin_operation(self.life.closed_flag()) {
            cache.counters.count_resize(old, new, Writers::Owner);
            let writers = self.books.counters.exact_writers(&self.config, thread);
            self.books
                .counters
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
        cache
            .counters
            .count_free(class_bytes, requested, Writers::Owner);
        let writers = self.books.counters.exact_writers(&self.config, thread);
        self.books
            .counters
            .exact_free(&self.config, class_bytes as u64, requested as u64, writers);
    }

    /// Gives a buffer's block back (its `Drop`, through `give_back_uncached`, once
    /// [`free_cached`](Self::free_cached) declined). Returns whether the
    /// pool was closed: the block then went back to the system, and the caller must count
    /// the buffer out with `lifetime::count_out` once no reference into the pool is left
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
                    self.lists.push(cache.shard, class, record);
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

    /// Starts an operation of a thread without a cache: the pool's open (and the operation
    /// counted, so the close waits for it), or closed.
    pub(in crate::pool) fn begin_cacheless(&self) -> bool {
        self.join_exact_counters(None);
        self.life.begin_cacheless()
    }

    /// [`alloc`](Self::alloc) for a thread without a cache: from the shared lists or the
    /// system, counted in the pool's shared counters.
    #[cold]
    pub(in crate::pool) fn alloc_cacheless(
        &self,
        this: NonNull<PoolInner>,
        class: usize,
        class_bytes: usize,
        size: usize,
        zeroed: bool,
        tag: u32,
    ) -> Result<PoolBuffer, PoolError> {
        if !self.begin_cacheless() {
            return Err(PoolError::Closed);
        }
        self.lists.note_drawn(class);
        let taken = self
            .pop_list_or_larger(CACHELESS_SHARD, class)
            .inspect(|taken| self.note_lender_drawn(taken, class))
            .map_or_else(|| self.system_alloc(class, class_bytes, size, zeroed), Ok);
        let block_bytes = taken.as_ref().map_or(0, |t| class::class_size(t.class()));
        if let Ok(taken) = &taken {
            taken.record.hand_out(CACHELESS, tag, taken.class(), size);
            self.count_cacheless(block_bytes, size, true);
        }
        self.life.end_cacheless();
        let taken = taken?;
        self.books
            .trace(PoolEventKind::Alloc, block_bytes as u64, taken.class());
        Ok(taken.into_buffer(this, size, zeroed))
    }

    /// Counts an operation of a thread without a cache, in the shared counters and (with
    /// the configuration) the exact ones, as a cache's operation is counted.
    fn count_cacheless(&self, class_bytes: usize, requested: usize, allocation: bool) {
        if allocation {
            self.books
                .cacheless
                .count_alloc(false, class_bytes, requested, Writers::Shared);
        } else {
            self.books
                .cacheless
                .count_free(class_bytes, requested, Writers::Shared);
        }
        let (bytes, requested) = (class_bytes as u64, requested as u64);
        if allocation {
            self.books
                .counters
                .exact_alloc(&self.config, bytes, requested, Writers::Shared);
        } else {
            self.books
                .counters
                .exact_free(&self.config, bytes, requested, Writers::Shared);
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
        if self.merges_on_free(class_bytes) {
            // SAFETY: the buffer being freed held the block, not cached or listed.
            unsafe { self.release_block(record, class) };
        } else {
            self.lists
                .push(CACHELESS_SHARD, class, self.memory.blocks.record(record));
        }
        self.count_cacheless(class_bytes, requested, false);
        self.life.end_cacheless();
        false
    }

    /// Pops a block from the shared lists of `class`: from `shard`'s first, then from the
    /// other shards in turn.
    #[inline]
    pub(in crate::pool) fn pop_list(&self, shard: usize, class: usize) -> Option<Taken<'_>> {
        self.pop_list_leaving(shard, class, false)
    }

    /// [`pop_list`](Self::pop_list), or with `spare` only from a list that keeps at least one
    /// more block.
    #[inline(always)]
    fn pop_list_leaving(&self, shard: usize, class: usize, spare: bool) -> Option<Taken<'_>> {
        let popped = self.lists.pop(&self.memory.blocks, shard, class, spare);
        // A listed record holds its block's address, written before the Release push that
        // our Acquire pop synchronises with.
        Some(Taken::new(self.memory.blocks.record(popped?), class, false))
    }

    /// [`pop_list`](Self::pop_list) of `class`, or, when its lists are empty and the
    /// configuration allows it, a spare block (one its list does not end with) of the next
    /// larger classes whose blocks are at most a quarter larger ([`LARGER_BLOCK_SLACK`]): a
    /// block that would otherwise wait on its list serves the request instead of a new block
    /// from the system. Size classes each keep their own blocks, so without this a pool
    /// serving varied sizes keeps growing long after its total in use stopped growing (each
    /// class reaches its own peak at its own time); with it, the free blocks of neighbouring
    /// classes pool their slack. A list's last block stays for its own class, whose next
    /// request in a repeating pattern (a training step) comes back for it; a class that met
    /// a larger class's spares before it had blocks of its own may still go on borrowing
    /// them (see `PoolConfig::larger_blocks` for the bound).
    #[inline]
    pub(in crate::pool) fn pop_list_or_larger(
        &self,
        shard: usize,
        class: usize,
    ) -> Option<Taken<'_>> {
        match self.pop_list(shard, class) {
            Some(taken) => Some(taken),
            None => self.pop_larger(shard, class),
        }
    }

    /// The second half of [`pop_list_or_larger`](Self::pop_list_or_larger): a spare block of
    /// a slightly larger class, where the rules allow one.
    #[cold]
    #[inline(never)]
    fn pop_larger(&self, shard: usize, class: usize) -> Option<Taken<'_>> {
        // Under a budget a request keeps to its own class: the lender may run short later,
        // and the block it then needs from the system is larger than the one this request
        // would have taken, which the budget may refuse.
        if !self.config.larger_blocks || self.memory.budgeted() {
            return None;
        }
        let own = class::class_size(class);
        let limit = own.saturating_add(own / LARGER_BLOCK_SLACK);
        // Nor does a block cross the thread caches' limit: a class they keep, served by
        // blocks of a class they skip, would never find one in its bin again (each goes back
        // to its own class's list when freed), so every allocation of it would miss.
        let cached = self.caches.keep(class);
        (class + 1..class::CLASSES)
            .take_while(|&larger| {
                class::class_size(larger) <= limit && self.caches.keep(larger) == cached
            })
            .find_map(|larger| self.pop_list_leaving(shard, larger, true))
    }

    /// Notes, for the idle policy, the class of a block taken for a request of `class`
    /// when it is another one: not idle, it serves its neighbour.
    fn note_lender_drawn(&self, taken: &Taken<'_>, class: usize) {
        if taken.class() != class {
            self.lists.note_drawn(taken.class());
        }
    }

    /// Whether a block of `class`, freed by any thread, goes straight back to the page layer
    /// (where it merges with its free neighbours): one that merges on free and that no
    /// thread cache keeps.
    pub(in crate::pool) fn freed_to_pages(&self, class: usize) -> bool {
        !self.caches.keep(class) && self.merges_on_free(class::class_size(class))
    }

    /// Whether a freed block of `class_bytes` goes straight back to the page layer, past the
    /// shared lists (and the thread caches, for the free's cold path: the hot path,
    /// `free_cached`, bins a block its own thread frees without asking): under a budget,
    /// blocks of 256 KiB and more of the page layer. There it merges with the free pages
    /// beside it; under a budget the pool holds little beyond what is live, so the next
    /// large request of another size needs exactly such merged pages, and a block kept in
    /// its class would split them (the main job fitted to 75% of its peak: 11,000-13,000
    /// minor faults a step with such blocks listed, 0-4,200 without). Against the bytes of
    /// such a block, the page layer's lock and search cost little; smaller blocks keep the
    /// caches.
    #[inline]
    pub(in crate::pool) fn merges_on_free(&self, class_bytes: usize) -> bool {
        class_bytes >= MERGE_MIN_BLOCK && self.memory.paged(class_bytes) && self.memory.budgeted()
    }
}
