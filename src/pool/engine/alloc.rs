//! The ways in: a buffer's allocation through the calling thread's cache (its bin of the
//! class, then the class's shared lists, then the system, within the budget), the same
//! through the shared lists alone for a thread that holds no thread index (its thread-locals
//! are being destroyed), and the eviction a refused request asks for.

use std::ptr::NonNull;

use super::blocks::Record;
use super::buffer::PoolBuffer;
use super::cache::{Entry, PoolThreadCache};
use super::inner::{Handout, PoolInner};
use super::lists::CACHELESS_SHARD;
use crate::pool::class;
use crate::pool::error::{OutOfMemory, PoolError};
use crate::pool::observe::counters::CACHELESS;
use crate::pool::observe::trace::PoolEventKind;
use crate::thread;

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

    /// For a request that asks for zeros (`zeroed`): the block taken off a bin or list, known
    /// to be zero if the record says so (read before its `hand_out`).
    #[inline(always)]
    pub(in crate::pool) fn knowing_zero(self, zeroed: bool) -> Self {
        let zero = zeroed && self.record.known_zero();
        Self::new(self.record, self.class(), zero)
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
        let zero = self.zeroed();
        let block = Handout::new(pool, addr, size, self.record, self.class(), zeroed, zero);
        PoolBuffer::from_block(block)
    }
}

/// A request may take a listed block of a larger class holding at most `1 / LARGER_BLOCK_SLACK`
/// more bytes than its own class (with `PoolConfig::larger_blocks`).
pub(in crate::pool) const LARGER_BLOCK_SLACK: usize = 4;

impl PoolInner {
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
        // Before `hand_out`, which overwrites the record's zero mark.
        let taken = Taken::new(record, class, false).knowing_zero(zeroed);
        record.hand_out(thread, tag, class, size);
        inner.count_alloc(cache, thread, class_bytes, size, true);
        cache.end_operation(busy);
        inner
            .books
            .trace(PoolEventKind::Alloc, class_bytes as u64, class);
        Some(taken.into_buffer(this, size, zeroed))
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
        let taken = match self.pop_list_or_larger(cache.shard(), class) {
            Some(taken) => {
                self.note_lender_drawn(&taken, class);
                taken.knowing_zero(zeroed)
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
            self.books.count_retry();
            if !memory.reserve(bytes) {
                self.books.count_budget_failure();
                let report = self.out_of_memory(size, class_bytes, released);
                return Err(PoolError::BudgetExceeded(Box::new(report)));
            }
        }
        let mut obtained = memory.new_block(class, class_bytes, zeroed);
        if obtained.is_none() && released.is_none() {
            // The system is short: give it back what is cached, then try once more.
            released = Some(self.release_cached_for_retry());
            self.books.count_retry();
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
        cache.count_alloc(hit, class_bytes, requested);
        let writers = self.books.exact_writers(&self.config, thread);
        self.books
            .exact_alloc(&self.config, class_bytes as u64, requested as u64, writers);
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
            self.books
                .count_cacheless(&self.config, block_bytes, size, true);
        }
        self.life.end_cacheless();
        let taken = taken?;
        self.books
            .trace(PoolEventKind::Alloc, block_bytes as u64, taken.class());
        Ok(taken.into_buffer(this, size, zeroed))
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
        let popped = self.lists.pop(self.memory.records(), shard, class, spare);
        // A listed record holds its block's address, written before the Release push that
        // our Acquire pop synchronises with.
        Some(Taken::new(self.memory.record(popped?), class, false))
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
}
