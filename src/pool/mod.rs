//! `BufferPool`: size-classed, thread-cached, budgeted buffers for tensor bytes.
//!
//! # Where a block is
//!
//! Every block the pool holds from the system is, at every moment, in exactly one place:
//!
//! - **handed out**, owned by one [`PoolBuffer`];
//! - **in a thread cache**: the bin of its class in the slot of the thread that allocated
//!   it and freed it again (see `slot`); only blocks up to
//!   [`PoolConfig::thread_cache_max_block`], within the cache's bounds;
//! - **on a shared list** of its class, where any thread's allocation finds it: blocks
//!   freed by another thread than the one that allocated them, blocks too large for the
//!   caches, blocks that did not fit a cache;
//! - **released** to the system.
//!
//! # Paths
//!
//! - **alloc**: the calling thread's bin for the class (no lock, no read-modify-write) → the
//!   class's shared list (one compare-exchange) → the system, within the byte budget. A
//!   budget miss first releases every cached block, other threads' caches included, then
//!   tries once more, then fails with [`PoolError::BudgetExceeded`].
//! - **free** (dropping a [`PoolBuffer`], on any thread): the freeing thread's bin if that
//!   thread allocated the block and it fits, else the shared list. So a buffer allocated on a
//!   forward thread and dropped on a replay thread is back where the forward thread finds it.
//! - **trim** releases every cached block now, other threads' caches included;
//!   **trim_idle** releases the lists of classes nobody drew from lately and the caches of
//!   threads that made no pool operation lately; **flush_thread_cache** moves the calling
//!   thread's cache to the shared lists.
//!
//! A thread reaches its slot through its thread index (a small number, reused after the
//! thread exits: a new thread inherits an exited one's cache, and trim takes it back either
//! way), so finding it costs one table lookup however many pools the process has made.
//!
//! # Lifetime
//!
//! Dropping the last [`BufferPool`] handle closes the pool: every cached block goes back to
//! the system at once (no thread has to come back for it), and buffers still alive go back to
//! the system when they drop. The pool's control block is freed by whoever finishes last: the
//! close, or the drop of the last live buffer. See `lifetime` for the protocol.

mod advise;
#[cfg(feature = "allocator-api2")]
mod allocator_api;
mod blocks;
mod buffer;
mod class;
mod config;
mod error;
mod front;
mod lifetime;
mod raw;
mod slot;
mod stats;
mod tag;
mod trace;

pub use buffer::PoolBuffer;
pub use config::PoolConfig;
pub use error::{OutOfMemory, PoolError};
pub use front::PoolAllocator;
pub use stats::{BlockInfo, ClassStats, PoolStats};
pub use tag::{MemoryTag, TagScope};
pub use trace::{PoolEvent, PoolEventKind};

use std::alloc::Layout;
use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::paged::PagedTable;
use crate::stack::{TaggedStack, NIL};
use crate::sync::{
    asymmetric, global, system, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering,
};
use crate::thread;
use blocks::{BlockTable, Record};
use slot::{bump, Entry, Slot};
use stats::{raise, PoolCounters};
use trace::Trace;

/// A size-classed pool of aligned byte buffers. Cloning is cheap: clones share one pool,
/// which closes when the last of them drops.
///
/// ```
/// use ferropool::BufferPool;
/// let pool = BufferPool::new();
/// let mut buffer = pool.alloc_zeroed(4096)?;
/// assert!(buffer.as_bytes().unwrap().iter().all(|&b| b == 0));
/// buffer.as_bytes_mut().unwrap()[0] = 7;
/// drop(buffer); // back to this thread's cache
/// let again = pool.alloc(4096)?; // served by the cache, no system call
/// assert_eq!(pool.stats().cache_hits, 1);
/// # drop(again);
/// # Ok::<(), ferropool::PoolError>(())
/// ```
pub struct BufferPool {
    /// Invariant: points to a live `PoolInner`, which counts this handle in `handles`.
    inner: NonNull<PoolInner>,
}

// SAFETY: `PoolInner` is shared through atomics only; a handle is a counted reference to it.
unsafe impl Send for BufferPool {}
// SAFETY: as above.
unsafe impl Sync for BufferPool {}

/// The shared state of one pool.
pub(crate) struct PoolInner {
    id: u64,
    config: PoolConfig,
    /// Whether blocks come from `System` directly rather than from the global allocator (for
    /// the pool behind ferropool's own global allocator, which must not call itself).
    system_blocks: bool,
    /// `BufferPool` handles alive; the last one to drop closes the pool.
    handles: AtomicUsize,
    /// Set once, when the last handle drops.
    closed: AtomicBool,
    /// Live blocks after the close, less the frees since: see `lifetime`.
    remaining: AtomicI64,
    blocks: BlockTable,
    /// One list of blocks per size class. Invariant: every block on list `c` holds
    /// `class_size(c)` bytes and is owned by the list.
    lists: [CachePadded<TaggedStack>; class::CLASSES],
    /// Per class, the `idle_round` in which an allocation last drew on its list or the
    /// system: a heuristic for `trim_idle`, never a safety matter.
    last_drawn: [AtomicU64; class::CLASSES],
    /// Calls of `trim_idle` so far.
    idle_round: AtomicU64,
    /// Classes below this one go through the thread caches (from the configuration).
    cached_classes: usize,
    /// Slots by thread index (see `slot`).
    slots: PagedTable<CachePadded<Slot>>,
    /// Operations of threads that hold no thread index (their thread-locals are being
    /// destroyed) and so have no slot: they count here, with read-modify-writes, and the
    /// close waits for `slotless_busy` to fall to zero as it waits for each slot's owner.
    slotless_busy: AtomicUsize,
    slotless: SlotlessCounters,
    counters: PoolCounters,
    /// The byte budget (`u64::MAX` for none): the configuration's, until `set_budget`.
    budget: AtomicU64,
    /// The event trace, once enabled (by the configuration or `enable_trace`).
    trace: std::sync::OnceLock<Trace>,
}

impl BufferPool {
    /// A pool with the default configuration.
    pub fn new() -> Self {
        Self::with_config(PoolConfig::default()).expect("the default configuration is valid")
    }

    /// A pool with `config`.
    ///
    /// # Errors
    ///
    /// [`PoolError::InvalidConfig`] when a field is out of range (see [`PoolConfig`]).
    pub fn with_config(config: PoolConfig) -> Result<Self, PoolError> {
        Self::build(config, false)
    }

    /// A pool whose blocks come from `System` (`system_blocks`) or the global allocator.
    pub(crate) fn build(config: PoolConfig, system_blocks: bool) -> Result<Self, PoolError> {
        config.validate()?;
        asymmetric::init();
        Ok(Self {
            inner: lifetime::allocate(config, system_blocks),
        })
    }

    #[inline(always)]
    fn inner(&self) -> &PoolInner {
        // SAFETY: invariant on `inner`: a handle keeps its pool alive.
        unsafe { self.inner.as_ref() }
    }

    /// A buffer of `size` bytes with unspecified contents.
    ///
    /// # Errors
    ///
    /// [`PoolError::BudgetExceeded`] when the budget cannot hold another block even after
    /// releasing every cached one; [`PoolError::TooLarge`] above 1 TiB;
    /// [`PoolError::SystemAllocFailed`] when the system refuses.
    #[inline]
    pub fn alloc(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        PoolInner::alloc(self.inner, size, false)
    }

    /// A buffer of `size` zero bytes. A reused block is cleared; a block new from the system
    /// is zeroed by the system (no extra pass).
    ///
    /// # Errors
    ///
    /// As [`alloc`](Self::alloc).
    pub fn alloc_zeroed(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        PoolInner::alloc(self.inner, size, true)
    }

    /// Returns every cached block to the system now: the shared lists and every thread's
    /// cache (waiting, at most, for an operation a thread is running on the pool at that
    /// moment). Returns the bytes released.
    pub fn trim(&self) -> u64 {
        let inner = self.inner();
        inner.counters.trims.fetch_add(1, Ordering::Relaxed);
        let released = inner.release_cached();
        inner.trace(PoolEventKind::Trim, released, 0);
        released
    }

    /// A gentle trim for a periodic moment such as the end of a training step: releases the
    /// listed blocks of every size class that no allocation has drawn from the shared lists
    /// during the last [`PoolConfig::idle_rounds`] calls, and the caches of threads that made
    /// no pool operation during them. Classes and threads in use keep their blocks. Returns
    /// the bytes released.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig};
    ///
    /// let pool = BufferPool::with_config(PoolConfig {
    ///     thread_cache_bytes: 0, // every free goes to the shared lists
    ///     idle_rounds: 1,
    ///     ..PoolConfig::default()
    /// })?;
    /// drop((pool.alloc(4096)?, pool.alloc(1 << 20)?)); // both cached on the lists
    /// for _ in 0..2 {
    ///     drop(pool.alloc(4096)?); // only the 4 KiB class stays in use
    ///     pool.trim_idle();
    /// }
    /// assert_eq!(pool.stats().cached_bytes, 4096);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn trim_idle(&self) -> u64 {
        self.inner().trim_idle()
    }

    /// Moves the calling thread's cached blocks of this pool to the pool's shared lists,
    /// where any thread can reuse them. Call it when a thread is about to idle for long (a
    /// worker parking between jobs); `trim` would release them instead. Returns the bytes
    /// moved.
    ///
    /// ```
    /// use ferropool::BufferPool;
    ///
    /// let pool = BufferPool::new();
    /// drop(pool.alloc(4096)?); // kept in this thread's cache
    /// assert_eq!(pool.flush_thread_cache(), 4096);
    /// assert_eq!(pool.flush_thread_cache(), 0);
    /// assert_eq!(pool.stats().cached_in_lists_bytes, 4096);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn flush_thread_cache(&self) -> u64 {
        let inner = self.inner();
        let Some((slot, _)) = inner.my_slot() else {
            return 0; // no slot, no cache
        };
        slot.drain(|class, record| inner.push_list(class, record.index))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.inner().stats()
    }

    /// Starts every peak statistic again from its current value (as
    /// `torch.cuda.reset_peak_memory_stats` does), for example at the start of a step.
    pub fn reset_peak_stats(&self) {
        let inner = self.inner();
        let now = inner.stats();
        let c = &inner.counters;
        c.peak_reserved.store(now.reserved_bytes, Ordering::Relaxed);
        c.peak_in_use.store(now.in_use_bytes, Ordering::Relaxed);
        c.peak_requested
            .store(now.requested_bytes, Ordering::Relaxed);
    }

    /// The blocks of every size class the pool holds, in use or cached (classes it holds
    /// none of are left out). A scan of the pool's block records.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        let mut by_class: HashMap<usize, ClassStats> = HashMap::new();
        self.inner().blocks.for_each(|record| {
            if let Some((class, in_use)) = record.picture() {
                let entry = by_class.entry(class).or_insert_with(|| ClassStats {
                    block_bytes: class::class_size(class),
                    ..ClassStats::default()
                });
                if in_use {
                    entry.in_use_blocks += 1;
                } else {
                    entry.cached_blocks += 1;
                }
            }
        });
        let mut classes: Vec<_> = by_class.into_values().collect();
        classes.sort_by_key(|c| c.block_bytes);
        classes
    }

    /// The blocks handed out right now: size, class, allocating thread and tag of each, so a
    /// caller can see what holds memory. A scan of the pool's block records; blocks moving
    /// during the scan may be missed or seen twice.
    pub fn snapshot(&self) -> Vec<BlockInfo> {
        let mut live = Vec::new();
        self.inner().blocks.for_each(|record| {
            if let Some(info) = record.live_info() {
                live.push(info);
            }
        });
        live
    }

    /// Bytes in use (class sizes) per memory tag (`None` for untagged buffers), from a
    /// [`snapshot`](Self::snapshot).
    pub fn memory_by_tag(&self) -> HashMap<Option<MemoryTag>, u64> {
        let mut by_tag = HashMap::new();
        for block in self.snapshot() {
            *by_tag.entry(block.tag).or_insert(0) += block.block_bytes as u64;
        }
        by_tag
    }

    /// The traced events, oldest first (empty when tracing is off).
    pub fn trace_events(&self) -> Vec<PoolEvent> {
        self.inner()
            .trace
            .get()
            .map_or_else(Vec::new, Trace::events)
    }

    /// Nanoseconds on the trace's clock (the `at_ns` of an event recorded now), or `None`
    /// when tracing is off.
    pub fn trace_now_ns(&self) -> Option<u64> {
        self.inner().trace.get().map(Trace::now_ns)
    }

    /// Records a caller's own moment in the trace (a [`PoolEventKind::Mark`] event carrying
    /// `value`), for example a step boundary. Does nothing when tracing is off.
    pub fn trace_mark(&self, value: u64) {
        self.inner().trace(PoolEventKind::Mark, value, 0);
    }

    /// The traced events in the Chrome Trace Event format, which Perfetto
    /// (<https://ui.perfetto.dev>) and `chrome://tracing` open: an instant event per
    /// allocation, free, system call, trim and mark on the track of the thread that made it
    /// (with bytes, class and tag), and a counter track with the bytes in use, cached and
    /// reserved. Timestamps are microseconds since the pool was created.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig};
    /// let pool = BufferPool::with_config(PoolConfig { trace_capacity: 64, ..PoolConfig::default() })?;
    /// drop(pool.alloc(4096)?);
    /// let json = pool.trace_json();
    /// assert!(json.starts_with("{\"displayTimeUnit\""));
    /// assert!(json.contains("\"ph\":\"C\""));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn trace_json(&self) -> String {
        trace::to_chrome_json(self.inner().id, &self.trace_events())
    }

    /// The configuration, as given when the pool was made (see [`budget`](Self::budget) for
    /// the budget in force).
    pub fn config(&self) -> &PoolConfig {
        &self.inner().config
    }

    /// The byte budget in force.
    pub fn budget(&self) -> Option<u64> {
        self.inner().budget()
    }

    /// Changes the byte budget (`None`: no limit). A lower budget than the memory held
    /// refuses new blocks until enough is freed or trimmed; nothing is taken back from
    /// buffers in use.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let held = pool.alloc(1 << 20)?;
    /// pool.set_budget(Some(1 << 20));
    /// assert!(pool.alloc(4096).is_err(), "1 MiB is held already");
    /// drop(held);
    /// assert!(pool.alloc(4096).is_ok(), "the cached block is released to make room");
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn set_budget(&self, budget: Option<u64>) {
        self.inner()
            .budget
            .store(budget.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Starts tracing with a ring of `capacity` events (at most [`PoolConfig::MAX_TRACE_EVENTS`]: a
    /// larger capacity is cut to it), if the pool does not trace already (the
    /// configuration's `trace_capacity`, or an earlier call); whether this call started it.
    pub fn enable_trace(&self, capacity: usize) -> bool {
        let capacity = capacity.min(PoolConfig::MAX_TRACE_EVENTS);
        capacity > 0 && self.inner().trace.set(Trace::new(capacity)).is_ok()
    }

    /// This pool's identity.
    pub fn id(&self) -> u64 {
        self.inner().id
    }

    /// Pools of this process whose control block is still allocated: those with a handle or
    /// a buffer alive. A leak check for programs that make a pool per job: it goes back down
    /// when a job's pool and buffers are gone.
    pub fn pools_alive() -> usize {
        lifetime::alive()
    }

    /// The rounded size a request of `size` bytes occupies, or `None` if too large.
    pub fn class_size_for(size: usize) -> Option<usize> {
        class::class_of(size).map(class::class_size)
    }
}

impl Clone for BufferPool {
    fn clone(&self) -> Self {
        // Relaxed: a new handle is made from a live one, like `Arc::clone`.
        self.inner().handles.fetch_add(1, Ordering::Relaxed);
        Self { inner: self.inner }
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        if self.inner().handles.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        crate::sync::fence(Ordering::Acquire);
        // SAFETY: this was the last handle; `close` is the pool's close, run once.
        unsafe { lifetime::close(self.inner) };
    }
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("id", &self.inner().id)
            .field("config", &self.inner().config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A block just taken for a buffer.
pub(super) struct Taken<'p> {
    record: &'p Record,
    addr: NonNull<u8>,
    /// Whether its bytes are known to be zero.
    zeroed: bool,
}

impl PoolInner {
    /// The calling thread's slot and index: one thread-local read when this thread's last
    /// pool operation was on this pool. `None` if the thread holds no index.
    #[inline(always)]
    fn my_slot(&self) -> Option<(&Slot, u32)> {
        if let Some((slot, thread)) = thread::cached_slot(self.id) {
            // SAFETY: `my_slot_slow` cached this pointer from this pool's slot table (pool
            // identities are never reused), whose pages never move or free while the pool
            // lives; the caller keeps the pool alive.
            return Some((unsafe { &*slot.cast::<Slot>() }, thread));
        }
        self.my_slot_slow()
    }

    #[cold]
    #[inline(never)]
    fn my_slot_slow(&self) -> Option<(&Slot, u32)> {
        let thread = thread::index()? as u32;
        let slot = self.slot(thread);
        thread::cache_slot(self.id, std::ptr::from_ref(slot).cast());
        Some((slot, thread))
    }

    /// The slot of thread `thread`, allocating its page on first use.
    #[inline(always)]
    fn slot(&self, thread: u32) -> &Slot {
        match self.slots.get(thread) {
            Some(slot) => slot,
            None => self.new_slot(thread),
        }
    }

    #[cold]
    #[inline(never)]
    fn new_slot(&self, thread: u32) -> &Slot {
        let (page, _) = self.slots.locate(thread);
        self.slots
            .ensure_page(page, |_| CachePadded::new(Slot::new()));
        self.slots.at(thread)
    }

    /// Allocates a buffer from the pool at `this`.
    #[inline]
    pub(super) fn alloc(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
    ) -> Result<PoolBuffer, PoolError> {
        // SAFETY: the caller holds a handle or a live buffer of the pool, which keeps it alive.
        let inner = unsafe { this.as_ref() };
        let class = class::class_of(size).ok_or(PoolError::TooLarge {
            requested: size,
            max: class::MAX_SIZE,
        })?;
        let class_bytes = class::class_size(class);
        let tag = tag::current();
        let Some((slot, thread)) = inner.my_slot() else {
            return inner.alloc_slotless(this, class, class_bytes, size, zeroed, tag);
        };
        let mut taken = None;
        if class < inner.cached_classes {
            match slot.enter(&inner.closed) {
                Entry::Closed => return Err(PoolError::Closed),
                Entry::Open { bins } => {
                    if let Some(record) = bins.then(|| slot.pop(class, class_bytes)).flatten() {
                        record.hand_out(thread, tag, class, size);
                        inner.count_alloc(slot, class_bytes, size, true);
                        slot.leave();
                        // SAFETY: a record on a bin holds its block's non-null address.
                        let addr = unsafe { record.addr() };
                        taken = Some(Taken {
                            record,
                            addr,
                            zeroed: false,
                        });
                    } else {
                        slot.leave();
                    }
                }
            }
        }
        let taken = match taken {
            Some(taken) => taken,
            None => inner.alloc_slow(slot, class, class_bytes, size, zeroed, thread, tag)?,
        };
        if zeroed && !taken.zeroed {
            // SAFETY: the block holds `class_bytes >= size` bytes and is exclusively ours.
            unsafe { taken.addr.as_ptr().write_bytes(0, size) };
        }
        inner.trace(PoolEventKind::Alloc, class_bytes as u64, class);
        Ok(PoolBuffer::new(
            this,
            taken.addr,
            size,
            taken.record,
            class,
            zeroed,
        ))
    }

    /// A block from the class's shared list or the system, handed out to `thread`.
    #[cold]
    #[allow(clippy::too_many_arguments)] // the hot path's locals, passed on as they are
    fn alloc_slow(
        &self,
        slot: &Slot,
        class: usize,
        class_bytes: usize,
        size: usize,
        zeroed: bool,
        thread: u32,
        tag: u32,
    ) -> Result<Taken<'_>, PoolError> {
        self.mark_drawn(class);
        let taken = match self.pop_list(class) {
            Some(taken) => taken,
            None => self.system_alloc(class, class_bytes, size, zeroed)?,
        };
        match slot.enter(&self.closed) {
            Entry::Closed => {
                // Only a buffer's `alloc_sibling` allocates without a handle; the pool
                // closed meanwhile, and its lists are drained for good: release the block.
                self.release(taken.record.index, class);
                Err(PoolError::Closed)
            }
            Entry::Open { .. } => {
                taken.record.hand_out(thread, tag, class, size);
                self.count_alloc(slot, class_bytes, size, false);
                slot.leave();
                Ok(taken)
            }
        }
    }

    /// Counts an allocation in the calling thread's slot (inside an operation).
    #[inline(always)]
    fn count_alloc(&self, slot: &Slot, class_bytes: usize, requested: usize, hit: bool) {
        let c = &slot.counters;
        bump(if hit { &c.hits } else { &c.misses }, 1);
        bump(&c.allocated_bytes, class_bytes as u64);
        bump(&c.allocated_requested, requested as u64);
        if self.config.exact_peaks {
            self.counters
                .exact_alloc(class_bytes as u64, requested as u64);
        }
    }

    /// Gives a buffer's block back (its `Drop`). Returns whether the pool was closed: the
    /// block then went back to the system, and the caller must count the buffer out with
    /// [`lifetime::count_out`] once no reference into the pool is left (this call's frame
    /// included), since the pool may be freed from then on.
    #[inline]
    pub(super) fn free(&self, record: &Record, class: usize, requested: usize) -> bool {
        let class_bytes = class::class_size(class);
        let allocator = record.take_back();
        let Some((slot, thread)) = self.my_slot() else {
            return self.free_slotless(record.index, class, requested);
        };
        match slot.enter(&self.closed) {
            Entry::Closed => {
                lifetime::release_after_close(self, record.index, class);
                true
            }
            Entry::Open { bins } => {
                let config = &self.config;
                let cached = bins
                    && allocator == thread
                    && class < self.cached_classes
                    && slot.push(
                        class,
                        class_bytes,
                        record,
                        config.thread_cache_blocks_per_class,
                        config.thread_cache_bytes,
                    );
                if !cached {
                    self.lists[class].push_chain(record.index + 1, &record.next);
                }
                let c = &slot.counters;
                bump(&c.frees, 1);
                bump(&c.freed_bytes, class_bytes as u64);
                bump(&c.freed_requested, requested as u64);
                if config.exact_peaks {
                    self.counters
                        .exact_free(class_bytes as u64, requested as u64);
                }
                // Inside the operation: after `leave`, a closing thread may free the pool.
                self.trace(PoolEventKind::Free, class_bytes as u64, class);
                slot.leave();
                false
            }
        }
    }

    /// Starts an operation of a thread without a slot: the pool's open (and the operation
    /// counted, so the close waits for it), or closed.
    fn enter_slotless(&self) -> bool {
        self.slotless_busy.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.slotless_busy.fetch_sub(1, Ordering::Release);
            return false;
        }
        true
    }

    /// [`alloc`](Self::alloc) for a thread without a slot: from the shared lists or the
    /// system, counted in the pool's shared counters.
    #[cold]
    fn alloc_slotless(
        &self,
        this: NonNull<PoolInner>,
        class: usize,
        class_bytes: usize,
        size: usize,
        zeroed: bool,
        tag: u32,
    ) -> Result<PoolBuffer, PoolError> {
        if !self.enter_slotless() {
            return Err(PoolError::Closed);
        }
        let taken = self
            .pop_list(class)
            .map_or_else(|| self.system_alloc(class, class_bytes, size, zeroed), Ok);
        if let Ok(taken) = &taken {
            taken.record.hand_out(SLOTLESS, tag, class, size);
            self.slotless.count(class_bytes, size, true);
        }
        self.slotless_busy.fetch_sub(1, Ordering::Release);
        let taken = taken?;
        if zeroed && !taken.zeroed {
            // SAFETY: the block holds `class_bytes >= size` bytes and is exclusively ours.
            unsafe { taken.addr.as_ptr().write_bytes(0, size) };
        }
        Ok(PoolBuffer::new(
            this,
            taken.addr,
            size,
            taken.record,
            class,
            zeroed,
        ))
    }

    /// [`free`](Self::free) for a thread without a slot: to the shared list.
    #[cold]
    fn free_slotless(&self, record: u32, class: usize, requested: usize) -> bool {
        if !self.enter_slotless() {
            lifetime::release_after_close(self, record, class);
            return true;
        }
        self.push_list(class, record);
        self.slotless
            .count(class::class_size(class), requested, false);
        self.slotless_busy.fetch_sub(1, Ordering::Release);
        false
    }

    /// Pops a block from the shared list of `class`.
    #[inline]
    fn pop_list(&self, class: usize) -> Option<Taken<'_>> {
        let index = self.lists[class].pop(|i| &self.blocks.record(i).next)?;
        let record = self.blocks.record(index);
        // SAFETY: a listed record holds its block's non-null address (written before the
        // Release push that our Acquire pop synchronises with).
        let addr = unsafe { record.addr() };
        Some(Taken {
            record,
            addr,
            zeroed: false,
        })
    }

    /// Puts a block on the shared list of its class.
    #[inline]
    fn push_list(&self, class: usize, record: u32) {
        self.lists[class].push_chain(record + 1, &self.blocks.record(record).next);
    }

    /// A block new from the system, within the budget.
    #[cold]
    fn system_alloc(
        &self,
        class: usize,
        class_bytes: usize,
        size: usize,
        zeroed: bool,
    ) -> Result<Taken<'_>, PoolError> {
        let mut released = None;
        if !self.reserve(class_bytes as u64) {
            // Release every cached block, other threads' caches included, and try once more.
            released = Some(self.release_for_room());
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            if !self.reserve(class_bytes as u64) {
                self.counters
                    .budget_failures
                    .fetch_add(1, Ordering::Relaxed);
                let report = self.out_of_memory(size, class_bytes, released);
                return Err(PoolError::BudgetExceeded(Box::new(report)));
            }
        }
        let layout = self.layout(class_bytes);
        // SAFETY: `layout` has a non-zero size (every class is at least 8 bytes).
        let allocate = || unsafe {
            match (self.system_blocks, zeroed) {
                (true, true) => system::alloc_zeroed(layout),
                (true, false) => system::alloc(layout),
                (false, true) => global::alloc_zeroed(layout),
                (false, false) => global::alloc(layout),
            }
        };
        let mut raw = allocate();
        if raw.is_null() && released.is_none() {
            // The system is short: give it back what is cached, then try once more.
            released = Some(self.release_for_room());
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            raw = allocate();
        }
        let Some(addr) = NonNull::new(raw) else {
            self.unreserve(class_bytes as u64);
            let report = self.out_of_memory(size, class_bytes, released);
            return Err(PoolError::SystemAllocFailed(Box::new(report)));
        };
        let record = match self.blocks.claim() {
            Ok(record) => record,
            Err(error) => {
                // SAFETY: allocated just above with `layout`, never shared.
                unsafe { self.dealloc_block(addr.as_ptr(), layout) };
                self.unreserve(class_bytes as u64);
                return Err(error);
            }
        };
        let record = self.blocks.record(record);
        record.set_block(addr, class);
        let config = &self.config;
        if (config.huge_pages || config.prefault) && class_bytes >= config.advise_min_block {
            advise::advise(
                addr.as_ptr(),
                class_bytes,
                config.huge_pages,
                config.prefault,
            );
        }
        let c = &self.counters;
        c.system_allocations.fetch_add(1, Ordering::Relaxed);
        // The peak moves only once the memory is really held (a refused request never
        // counts).
        raise(&c.peak_reserved, c.reserved.load(Ordering::Relaxed));
        if !config.exact_peaks {
            let (in_use, requested) = self.sum_in_use();
            raise(&c.peak_in_use, in_use + class_bytes as u64);
            raise(&c.peak_requested, requested + size as u64);
        }
        self.trace(PoolEventKind::SystemAlloc, class_bytes as u64, class);
        Ok(Taken {
            record,
            addr,
            zeroed,
        })
    }

    /// The layout of a block of `class_bytes`: the configured alignment, or 2 MiB for a block
    /// that gets transparent huge pages, so that huge pages can cover it end to end.
    fn layout(&self, class_bytes: usize) -> Layout {
        const HUGE_PAGE: usize = 2 << 20;
        let config = &self.config;
        let align = if config.huge_pages
            && class_bytes >= config.advise_min_block
            && class_bytes >= HUGE_PAGE
        {
            HUGE_PAGE
        } else {
            config.alignment
        };
        Layout::from_size_align(class_bytes, align)
            .expect("class sizes and alignments are validated")
    }

    /// Returns a block's memory to where `system_alloc` got it.
    ///
    /// # Safety
    ///
    /// `ptr` came from `system_alloc` with `layout`, and nothing uses it afterwards.
    unsafe fn dealloc_block(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, and `system_blocks` names the allocator it came from.
        unsafe {
            if self.system_blocks {
                system::dealloc(ptr, layout);
            } else {
                global::dealloc(ptr, layout);
            }
        }
    }

    /// Adds `bytes` to `reserved` if the budget allows.
    fn reserve(&self, bytes: u64) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        let reserved = &self.counters.reserved;
        let mut current = reserved.load(Ordering::Relaxed);
        loop {
            let Some(next) = current.checked_add(bytes).filter(|&n| n <= budget) else {
                return false;
            };
            match reserved.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    fn unreserve(&self, bytes: u64) {
        self.counters.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Returns a block's memory to the system and its record to the spare list.
    fn release(&self, record: u32, class: usize) {
        let class_bytes = class::class_size(class);
        let rec = self.blocks.record(record);
        // SAFETY: the caller owns the block (taken off a list or bin, or handed back), which
        // was allocated by `system_alloc` with this class's layout.
        unsafe { self.dealloc_block(rec.addr().as_ptr(), self.layout(class_bytes)) };
        rec.clear_block();
        self.blocks.release(record);
        self.unreserve(class_bytes as u64);
        self.counters.system_frees.fetch_add(1, Ordering::Relaxed);
        self.trace(PoolEventKind::SystemFree, class_bytes as u64, class);
    }

    /// Releases every block on the list of `class`. Returns the bytes released.
    fn release_list(&self, class: usize) -> u64 {
        let mut released = 0;
        let mut link = self.lists[class].take_all();
        while link != NIL {
            let record = link - 1;
            link = self.blocks.record(record).next.load(Ordering::Relaxed);
            released += class::class_size(class) as u64;
            self.release(record, class);
        }
        released
    }

    /// Calls `f` with every slot.
    fn for_each_slot(&self, mut f: impl FnMut(&Slot)) {
        for page in 0..self.slots.page_count() {
            if let Some(slots) = self.slots.page(page) {
                slots.iter().for_each(|slot| f(slot));
            }
        }
    }

    /// Releases every cached block: every thread's cache and every list. Returns the bytes
    /// released.
    fn release_cached(&self) -> u64 {
        let mut released = 0;
        self.for_each_slot(|slot| {
            released += slot.drain(|class, record| self.release(record.index, class));
        });
        (0..class::CLASSES)
            .map(|c| self.release_list(c))
            .sum::<u64>()
            + released
    }

    /// Releases every cached block to make room for an allocation; returns what was cached
    /// before, for the error report should the room still not suffice.
    fn release_for_room(&self) -> CachedPicture {
        let picture = self.cached_picture();
        self.release_cached();
        picture
    }

    /// Where cached memory is, for an out-of-memory report.
    fn cached_picture(&self) -> CachedPicture {
        let mut in_threads = 0;
        self.for_each_slot(|slot| in_threads += slot.binned());
        let mut largest = 0;
        self.blocks.for_each(|record| {
            if let Some((class, false)) = record.picture() {
                largest = largest.max(class::class_size(class));
            }
        });
        let (in_use, _) = self.sum_in_use();
        let reserved = self.counters.reserved.load(Ordering::Relaxed);
        CachedPicture {
            in_threads,
            in_lists: reserved.saturating_sub(in_use).saturating_sub(in_threads),
            largest,
        }
    }

    fn out_of_memory(
        &self,
        requested: usize,
        block_bytes: usize,
        released: Option<CachedPicture>,
    ) -> OutOfMemory {
        let before = released.unwrap_or_else(|| self.cached_picture());
        let (in_use, _) = self.sum_in_use();
        OutOfMemory {
            requested,
            block_bytes,
            budget: self.budget(),
            in_use,
            cached_in_threads: before.in_threads,
            cached_in_lists: before.in_lists,
            reserved: self.counters.reserved.load(Ordering::Relaxed),
            peak_reserved: self.counters.peak_reserved.load(Ordering::Relaxed),
            largest_cached_block: before.largest,
        }
    }

    /// Records that an allocation drew on `class` in the current idle round. Stores only on
    /// a change, so a class in steady use keeps its line shared instead of bouncing it.
    fn mark_drawn(&self, class: usize) {
        let round = self.idle_round.load(Ordering::Relaxed);
        if self.last_drawn[class].load(Ordering::Relaxed) != round {
            self.last_drawn[class].store(round, Ordering::Relaxed);
        }
    }

    fn trim_idle(&self) -> u64 {
        let round = self.idle_round.fetch_add(1, Ordering::Relaxed) + 1;
        let idle_rounds = u64::from(self.config.idle_rounds);
        let mut released: u64 = (0..class::CLASSES)
            .filter(|&class| {
                // Saturating: a racing call may have advanced the round already.
                round.saturating_sub(self.last_drawn[class].load(Ordering::Relaxed)) > idle_rounds
            })
            .map(|class| self.release_list(class))
            .sum();
        // A thread's cache is idle if the thread made no operation since the last round.
        self.for_each_slot(|slot| {
            let c = &slot.counters;
            let operations = slot.operations();
            // (A slot with nothing cached is skipped: draining it would cost a heavy fence
            // for nothing.)
            if c.seen_operations.swap(operations, Ordering::Relaxed) == operations
                && slot.binned() > 0
            {
                released += slot.drain(|class, record| self.release(record.index, class));
            }
        });
        self.trace(PoolEventKind::Trim, released, 0);
        released
    }

    /// Bytes in use and requested, summed over the slots.
    fn sum_in_use(&self) -> (u64, u64) {
        let (mut allocated, mut freed, mut asked, mut given) = (0u64, 0u64, 0u64, 0u64);
        self.for_each_slot(|slot| {
            let c = &slot.counters;
            allocated = allocated.wrapping_add(c.allocated_bytes.load(Ordering::Relaxed));
            freed = freed.wrapping_add(c.freed_bytes.load(Ordering::Relaxed));
            asked = asked.wrapping_add(c.allocated_requested.load(Ordering::Relaxed));
            given = given.wrapping_add(c.freed_requested.load(Ordering::Relaxed));
        });
        let o = &self.slotless;
        allocated = allocated.wrapping_add(o.allocated_bytes.load(Ordering::Relaxed));
        freed = freed.wrapping_add(o.freed_bytes.load(Ordering::Relaxed));
        asked = asked.wrapping_add(o.allocated_requested.load(Ordering::Relaxed));
        given = given.wrapping_add(o.freed_requested.load(Ordering::Relaxed));
        (allocated.saturating_sub(freed), asked.saturating_sub(given))
    }

    fn stats(&self) -> PoolStats {
        let mut s = PoolStats::default();
        let mut freed_requested = 0u64;
        let mut allocated_requested = 0u64;
        let mut misses = 0u64;
        self.for_each_slot(|slot| {
            let c = &slot.counters;
            // Each counter read once, so that hits and misses add up to the allocations
            // however the owner moves on meanwhile.
            misses += c.misses.load(Ordering::Relaxed);
            s.cache_hits += c.hits.load(Ordering::Relaxed);
            s.frees += c.frees.load(Ordering::Relaxed);
            s.allocated_bytes_total += c.allocated_bytes.load(Ordering::Relaxed);
            s.freed_bytes_total += c.freed_bytes.load(Ordering::Relaxed);
            allocated_requested += c.allocated_requested.load(Ordering::Relaxed);
            freed_requested += c.freed_requested.load(Ordering::Relaxed);
            s.cached_in_threads_bytes += slot.binned();
        });
        let o = &self.slotless;
        s.cache_misses = misses + o.allocations.load(Ordering::Relaxed);
        s.allocations = s.cache_hits + s.cache_misses;
        s.frees += o.frees.load(Ordering::Relaxed);
        s.allocated_bytes_total += o.allocated_bytes.load(Ordering::Relaxed);
        s.freed_bytes_total += o.freed_bytes.load(Ordering::Relaxed);
        allocated_requested += o.allocated_requested.load(Ordering::Relaxed);
        freed_requested += o.freed_requested.load(Ordering::Relaxed);
        let c = &self.counters;
        s.in_use_bytes = s.allocated_bytes_total.saturating_sub(s.freed_bytes_total);
        s.requested_bytes = allocated_requested.saturating_sub(freed_requested);
        s.in_use_blocks = s.allocations.saturating_sub(s.frees);
        s.reserved_bytes = c.reserved.load(Ordering::Relaxed);
        s.cached_bytes = s.reserved_bytes.saturating_sub(s.in_use_bytes);
        s.cached_in_threads_bytes = s.cached_in_threads_bytes.min(s.cached_bytes);
        s.cached_in_lists_bytes = s.cached_bytes - s.cached_in_threads_bytes;
        s.peak_reserved_bytes = c
            .peak_reserved
            .load(Ordering::Relaxed)
            .max(s.reserved_bytes);
        s.peak_in_use_bytes = raise(&c.peak_in_use, s.in_use_bytes);
        s.peak_requested_bytes = raise(&c.peak_requested, s.requested_bytes);
        s.system_allocations = c.system_allocations.load(Ordering::Relaxed);
        s.system_frees = c.system_frees.load(Ordering::Relaxed);
        s.alloc_retries = c.retries.load(Ordering::Relaxed);
        s.budget_failures = c.budget_failures.load(Ordering::Relaxed);
        s.trims = c.trims.load(Ordering::Relaxed);
        s
    }

    /// The byte budget, if any.
    fn budget(&self) -> Option<u64> {
        Some(self.budget.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX)
    }

    /// Records an event if tracing is on.
    #[inline(always)]
    fn trace(&self, kind: PoolEventKind, bytes: u64, class: usize) {
        if let Some(trace) = self.trace.get() {
            let thread = thread::index().map_or(SLOTLESS, |t| t as u32);
            trace.record(kind, bytes, class, thread);
        }
    }
}

/// The thread of operations made by a thread without a slot (it matches no slot; one less
/// than `u32::MAX`, so that a record's `holder`, the thread plus one, does not wrap).
const SLOTLESS: u32 = u32::MAX - 1;

/// The counters of operations made by threads without a slot (shared: read-modify-writes).
#[derive(Default)]
struct SlotlessCounters {
    allocations: AtomicU64,
    allocated_bytes: AtomicU64,
    allocated_requested: AtomicU64,
    frees: AtomicU64,
    freed_bytes: AtomicU64,
    freed_requested: AtomicU64,
}

impl SlotlessCounters {
    fn count(&self, class_bytes: usize, requested: usize, allocation: bool) {
        let (count, bytes, asked) = if allocation {
            (
                &self.allocations,
                &self.allocated_bytes,
                &self.allocated_requested,
            )
        } else {
            (&self.frees, &self.freed_bytes, &self.freed_requested)
        };
        count.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(class_bytes as u64, Ordering::Relaxed);
        asked.fetch_add(requested as u64, Ordering::Relaxed);
    }
}

/// Where cached memory was before a release.
#[derive(Clone, Copy)]
struct CachedPicture {
    in_threads: u64,
    in_lists: u64,
    largest: usize,
}

impl fmt::Debug for PoolInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolInner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
