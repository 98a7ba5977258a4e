//! `BufferPool`: size-classed, thread-cached, budgeted buffers for tensor bytes.
//!
//! # Paths
//!
//! - **alloc**: the calling thread's cache for the size class (no lock, no read-modify-write)
//!   → the pool's lock-free list for the class (one compare-exchange) → the system, within the
//!   byte budget. A budget miss first releases cached blocks, then fails with
//!   [`PoolError::BudgetExceeded`].
//! - **free** (dropping a [`PoolBuffer`], on any thread): the dropping thread's cache if the
//!   block fits its bounds, else the class list. Buffers freed by replay threads thus come
//!   back without any global lock.
//! - **trim**: releases the class lists and the calling thread's cache to the system; other
//!   threads release their caches on their next pool operation. **trim_idle** releases only
//!   the lists of classes no allocation has drawn from lately (the idle policy).
//! - **thread exit** (or [`BufferPool::flush_thread_caches`]): the thread's cached blocks go
//!   to the class lists and its counters into the pool's.
//!
//! # Lifetime
//!
//! A pool's control block (class list heads, block records and counters: a few tens of KiB)
//! is allocated once and lives for the rest of the process. Buffers and thread caches refer to
//! it by `&'static`, so handing out and returning a buffer never touches a reference count.
//! When the last [`BufferPool`] handle drops, the pool is closed: its cached memory goes back
//! to the system, and buffers still alive return their memory to the system when they drop.

mod advise;
mod blocks;
mod cache;
mod class;
mod error;
mod stats;
mod trace;

pub use error::PoolError;
pub use stats::PoolStats;
pub use trace::{PoolEvent, PoolEventKind};

use std::alloc::Layout;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crate::identity::next_identity;
use crate::stack::TaggedStack;
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use blocks::BlockTable;
use stats::{PoolCounters, Sums, ThreadCounters};
use trace::Trace;

/// Configuration of a [`BufferPool`].
///
/// ```
/// use ferropool::{BufferPool, PoolConfig};
/// let pool = BufferPool::with_config(PoolConfig {
///     budget: Some(64 << 20),
///     ..PoolConfig::default()
/// })?;
/// let buffer = pool.alloc(1000)?;
/// assert_eq!(buffer.len(), 1000);
/// assert_eq!(buffer.capacity(), 1024); // the 1 KiB class
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Alignment of every buffer: a power of two from 8 to 4096. Default 64.
    pub alignment: usize,
    /// Bytes the pool may hold from the system (live plus cached). `None`: no limit.
    pub budget: Option<u64>,
    /// Bytes each thread may cache per pool. Default 64 MiB.
    pub thread_cache_bytes: usize,
    /// Blocks larger than this skip the thread caches (they go to the class lists, one
    /// compare-exchange away). Default 16 MiB.
    pub thread_cache_max_block: usize,
    /// Blocks each thread may cache per class. Default 32.
    pub thread_cache_blocks_per_class: usize,
    /// Events kept by the trace ring; 0 (the default) turns tracing off.
    pub trace_capacity: usize,
    /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)` on Linux) for blocks of at
    /// least `advise_min_block` bytes when they come from the system. Default off.
    pub huge_pages: bool,
    /// Fault in blocks of at least `advise_min_block` bytes when they come from the system
    /// (`madvise(MADV_POPULATE_WRITE)` on Linux, else a write per page), so that the first
    /// touch does not pay for it. Default off.
    pub prefault: bool,
    /// The smallest block that `huge_pages` and `prefault` apply to. Default 2 MiB.
    pub advise_min_block: usize,
    /// The idle policy of [`BufferPool::trim_idle`]: a size class that no allocation has
    /// drawn from the pool's shared lists since this many calls ago has its listed blocks
    /// released. Default 4.
    pub idle_rounds: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            alignment: 64,
            budget: None,
            thread_cache_bytes: 64 << 20,
            thread_cache_max_block: 16 << 20,
            thread_cache_blocks_per_class: 32,
            trace_capacity: 0,
            huge_pages: false,
            prefault: false,
            advise_min_block: 2 << 20,
            idle_rounds: 4,
        }
    }
}

/// A size-classed pool of aligned byte buffers. Cloning is cheap: clones share one pool.
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
#[derive(Clone)]
pub struct BufferPool {
    inner: &'static PoolInner,
    /// Closes the pool when the last handle drops.
    _open: Arc<OpenHandle>,
}

/// Closes its pool on drop.
struct OpenHandle(&'static PoolInner);

impl Drop for OpenHandle {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        // `trim` bumps the trim count: every thread cache then releases its blocks at its
        // next operation and, seeing the pool closed, keeps none afterwards.
        self.0.trim();
    }
}

/// A block of memory: its record and address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    record: u32,
    addr: NonNull<u8>,
}

// SAFETY: a `Block` is a handle to memory owned by whoever holds it (a thread cache, a list,
// or one `PoolBuffer`); moving it between threads moves that ownership.
unsafe impl Send for Block {}

/// The shared state of one pool. See the module docs for why it is `'static`.
pub(crate) struct PoolInner {
    id: u64,
    config: PoolConfig,
    blocks: BlockTable,
    /// One lock-free list of blocks per size class. Invariant: every block on list `c` holds
    /// `class_size(c)` bytes and is owned by the list.
    lists: Box<[TaggedStack]>,
    /// Per class, the `idle_round` during which an allocation last missed the thread caches
    /// for it (drew from its list or from the system). A heuristic for `trim_idle`, never a
    /// safety matter.
    last_drawn: Box<[AtomicU64]>,
    /// Calls of `trim_idle` so far.
    idle_round: AtomicU64,
    counters: PoolCounters,
    /// Counters of live threads (read by `stats`).
    threads: Mutex<Vec<Arc<ThreadCounters>>>,
    /// Counters of exited threads, and of operations made without a thread cache.
    retired: ThreadCounters,
    closed: AtomicBool,
    trace: Option<Trace>,
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
    /// [`PoolError::InvalidConfig`] when the alignment is not a power of two in `8..=4096`.
    pub fn with_config(config: PoolConfig) -> Result<Self, PoolError> {
        if !config.alignment.is_power_of_two() || !(8..=4096).contains(&config.alignment) {
            return Err(PoolError::InvalidConfig {
                field: "alignment",
                value: config.alignment as u64,
                expected: "a power of two in 8..=4096",
            });
        }
        let trace = (config.trace_capacity > 0).then(|| Trace::new(config.trace_capacity));
        let inner: &'static PoolInner = Box::leak(Box::new(PoolInner {
            id: next_identity().get(),
            config,
            blocks: BlockTable::new(),
            lists: (0..class::CLASSES).map(|_| TaggedStack::new()).collect(),
            last_drawn: (0..class::CLASSES).map(|_| AtomicU64::new(0)).collect(),
            idle_round: AtomicU64::new(0),
            counters: PoolCounters::default(),
            threads: Mutex::new(Vec::new()),
            retired: ThreadCounters::default(),
            closed: AtomicBool::new(false),
            trace,
        }));
        keep_reachable(inner as *const PoolInner as usize);
        Ok(Self {
            inner,
            _open: Arc::new(OpenHandle(inner)),
        })
    }

    /// The process-wide default pool, created on first use with [`PoolConfig::default`].
    #[cfg(not(loom))]
    pub fn global() -> &'static BufferPool {
        static GLOBAL: std::sync::OnceLock<BufferPool> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(BufferPool::new)
    }

    /// The default pool of the current loom execution.
    #[cfg(loom)]
    pub fn global() -> &'static BufferPool {
        loom::lazy_static! {
            static ref GLOBAL: BufferPool = BufferPool::new();
        }
        &GLOBAL
    }

    /// A buffer of `size` bytes with unspecified contents.
    ///
    /// # Errors
    ///
    /// [`PoolError::BudgetExceeded`] when the budget cannot hold another block even after
    /// releasing cached ones; [`PoolError::TooLarge`] above 1 TiB;
    /// [`PoolError::SystemAllocFailed`] when the system refuses.
    #[inline]
    pub fn alloc(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        self.inner.alloc(size, false)
    }

    /// A buffer of `size` zero bytes. A reused block is cleared; a block new from the system
    /// is zeroed by the system (no extra pass).
    ///
    /// # Errors
    ///
    /// As [`alloc`](Self::alloc).
    pub fn alloc_zeroed(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        self.inner.alloc(size, true)
    }

    /// Returns cached memory to the system: the class lists and this thread's cache now, the
    /// other threads' caches at their next pool operation. Returns the bytes released now.
    pub fn trim(&self) -> u64 {
        self.inner.trim()
    }

    /// Releases the listed blocks of every size class that no allocation has drawn from the
    /// pool's shared lists during the last [`PoolConfig::idle_rounds`] calls: a gentle trim
    /// for a periodic moment such as the end of a training step. Classes in use keep their
    /// blocks; thread caches are left alone (they are bounded; [`trim`](Self::trim) empties
    /// them too). Returns the bytes released.
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
        self.inner.trim_idle()
    }

    /// Hands every block the calling thread has cached, in every pool, back to the pools'
    /// shared lists, where any thread can reuse it, and merges the thread's counters into
    /// the pools'. Thread exit does the same; call this when a thread is about to idle for
    /// long (a worker parking between jobs) so its cache does not hold memory meanwhile.
    /// Returns the bytes moved. The thread's next allocation starts a fresh cache.
    ///
    /// ```
    /// use ferropool::BufferPool;
    ///
    /// let pool = BufferPool::new();
    /// drop(pool.alloc(4096)?); // kept in this thread's cache
    /// assert_eq!(BufferPool::flush_thread_caches(), 4096);
    /// assert_eq!(BufferPool::flush_thread_caches(), 0);
    /// assert_eq!(pool.stats().cached_bytes, 4096); // now on the pool's shared list
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn flush_thread_caches() -> u64 {
        cache::retire_current()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.inner.stats()
    }

    /// The traced events, oldest first (empty when tracing is off).
    pub fn trace_events(&self) -> Vec<PoolEvent> {
        self.inner
            .trace
            .as_ref()
            .map_or_else(Vec::new, Trace::events)
    }

    /// Nanoseconds on the trace's clock (the `at_ns` of an event recorded now), or `None`
    /// when tracing is off. Lets a caller mark its own moments, such as step boundaries, on
    /// the same time axis as the events.
    pub fn trace_clock_ns(&self) -> Option<u64> {
        self.inner.trace.as_ref().map(Trace::now_ns)
    }

    /// The traced events as JSON (`{"events":[...]}`).
    pub fn trace_json(&self) -> String {
        trace::to_json(&self.trace_events())
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// The rounded size a request of `size` bytes occupies, or `None` if too large.
    pub fn class_size_for(size: usize) -> Option<usize> {
        class::class_of(size).map(class::class_size)
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
            .field("id", &self.inner.id)
            .field("config", &self.inner.config)
            .field("stats", &self.inner.stats())
            .finish()
    }
}

impl PoolInner {
    #[inline]
    fn alloc(&'static self, size: usize, zeroed: bool) -> Result<PoolBuffer, PoolError> {
        let class = class::class_of(size).ok_or(PoolError::TooLarge {
            requested: size,
            max: class::MAX_SIZE,
        })?;
        let class_bytes = class::class_size(class);
        let mut thread = 0;
        let cached = cache::with_cache(self, |cache| {
            thread = cache.thread;
            cache.take(class, class_bytes, size)
        });
        let (block, zero_done) = match cached {
            Some(Some(block)) => (block, false),
            has_cache => {
                // Counted only once it succeeds, so a refused request leaves the counters be.
                let taken = self.take_shared(class, class_bytes, zeroed, thread)?;
                let counted = has_cache.is_some()
                    && cache::with_cache(self, |cache| cache.count_miss(class_bytes, size))
                        .is_some();
                if !counted {
                    self.retired.count_shared(1, class_bytes, size);
                }
                taken
            }
        };
        if zeroed && !zero_done {
            // SAFETY: the block holds `class_bytes >= size` bytes and is exclusively ours.
            unsafe { block.addr.as_ptr().write_bytes(0, size) };
        }
        if let Some(trace) = &self.trace {
            trace.record(
                PoolEventKind::Alloc,
                class_bytes as u64,
                class as u32,
                thread,
            );
        }
        Ok(PoolBuffer {
            block,
            len: size,
            capacity: class_bytes,
            class: class as u32,
            initialized: zeroed,
            pool: self,
        })
    }

    /// A block from the class list or the system. Returns whether it is already zeroed.
    fn take_shared(
        &'static self,
        class: usize,
        class_bytes: usize,
        zeroed: bool,
        thread: u32,
    ) -> Result<(Block, bool), PoolError> {
        self.mark_drawn(class);
        if let Some(record) = self.lists[class].pop(|i| &self.blocks.record(i).next) {
            let addr = self.blocks.record(record).addr.load(Ordering::Relaxed);
            // SAFETY: a listed record holds the non-null address of its block (written before
            // the Release push that our Acquire pop synchronises with).
            let addr = unsafe { NonNull::new_unchecked(addr as *mut u8) };
            return Ok((Block { record, addr }, false));
        }
        self.system_alloc(class, class_bytes, zeroed, thread)
    }

    #[cold]
    fn system_alloc(
        &'static self,
        class: usize,
        class_bytes: usize,
        zeroed: bool,
        thread: u32,
    ) -> Result<(Block, bool), PoolError> {
        if !self.reserve(class_bytes as u64) {
            // Release what is cached and try once more.
            cache::release_current(self);
            self.release_lists();
            if !self.reserve(class_bytes as u64) {
                self.counters
                    .budget_failures
                    .fetch_add(1, Ordering::Relaxed);
                let stats = self.stats();
                return Err(PoolError::BudgetExceeded {
                    requested: class_bytes as u64,
                    budget: self.config.budget.unwrap_or(u64::MAX),
                    in_use: stats.in_use_bytes,
                    cached: stats.cached_bytes,
                });
            }
        }
        let layout = self.layout(class_bytes);
        // SAFETY: `layout` has a non-zero size (every class is at least 8 bytes).
        let raw = unsafe {
            if zeroed {
                crate::sync::alloc_zeroed(layout)
            } else {
                crate::sync::alloc(layout)
            }
        };
        let Some(addr) = NonNull::new(raw) else {
            self.unreserve(class_bytes as u64);
            return Err(PoolError::SystemAllocFailed {
                size: class_bytes,
                align: self.config.alignment,
            });
        };
        let record = match self.blocks.claim() {
            Ok(record) => record,
            Err(error) => {
                // SAFETY: allocated just above with `layout`, never shared.
                unsafe { crate::sync::dealloc(addr.as_ptr(), layout) };
                self.unreserve(class_bytes as u64);
                return Err(error);
            }
        };
        self.blocks
            .record(record)
            .addr
            .store(addr.as_ptr() as usize, Ordering::Relaxed);
        let config = &self.config;
        if (config.huge_pages || config.prefault) && class_bytes >= config.advise_min_block {
            advise::advise(
                addr.as_ptr(),
                class_bytes,
                config.huge_pages,
                config.prefault,
            );
        }
        self.counters
            .system_allocations
            .fetch_add(1, Ordering::Relaxed);
        if let Some(trace) = &self.trace {
            trace.record(
                PoolEventKind::SystemAlloc,
                class_bytes as u64,
                class as u32,
                thread,
            );
        }
        Ok((Block { record, addr }, zeroed))
    }

    fn layout(&self, class_bytes: usize) -> Layout {
        Layout::from_size_align(class_bytes, self.config.alignment)
            .expect("class sizes and alignments are validated")
    }

    /// Adds `bytes` to `reserved` if the budget allows.
    fn reserve(&self, bytes: u64) -> bool {
        let budget = self.config.budget.unwrap_or(u64::MAX);
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
                Ok(_) => {
                    self.counters
                        .peak_reserved
                        .fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(actual) => current = actual,
            }
        }
    }

    fn unreserve(&self, bytes: u64) {
        self.counters.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    #[inline]
    fn free(&'static self, block: Block, class: usize, class_bytes: usize, requested: usize) {
        let mut thread = 0;
        let leftover = cache::with_cache(self, |cache| {
            thread = cache.thread;
            cache.put(block, class, class_bytes, requested)
        });
        match leftover {
            Some(None) => {}
            Some(Some(block)) => self.give_back(block, class),
            None => {
                self.retired.count_shared(-1, class_bytes, requested);
                self.give_back(block, class);
            }
        }
        if let Some(trace) = &self.trace {
            trace.record(
                PoolEventKind::Free,
                class_bytes as u64,
                class as u32,
                thread,
            );
        }
    }

    /// Puts a block on its class list; if the pool is closed, that list goes back to the
    /// system.
    ///
    /// The check comes after the push, so a block given back while the last handle closes
    /// the pool is never stranded: the push is a compare-exchange with acquire on the list
    /// head and the close empties every list with a release compare-exchange after setting
    /// `closed`, so either the close takes this block or this check sees `closed` and
    /// releases the list (loom: `thread_exit_flush_racing_close`).
    fn give_back(&'static self, block: Block, class: usize) {
        self.lists[class].push_chain(block.record + 1, &self.blocks.record(block.record).next);
        if self.is_closed() {
            self.release_list(class);
        }
    }

    /// Returns a block's memory to the system.
    fn release_block(&self, block: Block, class: usize) {
        let class_bytes = class::class_size(class);
        // SAFETY: the block was allocated with this class's layout by `system_alloc` and is
        // owned by the caller, which gives it up here.
        unsafe { crate::sync::dealloc(block.addr.as_ptr(), self.layout(class_bytes)) };
        self.blocks.release(block.record);
        self.unreserve(class_bytes as u64);
        self.counters.system_frees.fetch_add(1, Ordering::Relaxed);
        if let Some(trace) = &self.trace {
            trace.record(
                PoolEventKind::SystemFree,
                class_bytes as u64,
                class as u32,
                0,
            );
        }
    }

    /// Releases every block on the class lists. Returns the bytes released.
    fn release_lists(&self) -> u64 {
        (0..self.lists.len())
            .map(|class| self.release_list(class))
            .sum()
    }

    /// Releases every block on the list of `class`. Returns the bytes released.
    fn release_list(&self, class: usize) -> u64 {
        let class_bytes = class::class_size(class);
        let mut released = 0;
        let mut link = self.lists[class].take_all();
        while link != crate::stack::NIL {
            let record = link - 1;
            let rec = self.blocks.record(record);
            link = rec.next.load(Ordering::Relaxed);
            let addr = rec.addr.load(Ordering::Relaxed);
            released += class_bytes as u64;
            // SAFETY: listed records hold their block's non-null address.
            let addr = unsafe { NonNull::new_unchecked(addr as *mut u8) };
            self.release_block(Block { record, addr }, class);
        }
        released
    }

    fn trim(&'static self) -> u64 {
        self.counters.trims.fetch_add(1, Ordering::Release);
        let released = cache::release_current(self) + self.release_lists();
        if let Some(trace) = &self.trace {
            trace.record(PoolEventKind::Trim, released, 0, 0);
        }
        released
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
        let released = (0..self.lists.len())
            .filter(|&class| {
                // Saturating: a racing call may have advanced the round already.
                round.saturating_sub(self.last_drawn[class].load(Ordering::Relaxed)) > idle_rounds
            })
            .map(|class| self.release_list(class))
            .sum();
        if let Some(trace) = &self.trace {
            trace.record(PoolEventKind::Trim, released, 0, 0);
        }
        released
    }

    #[inline]
    fn trim_count(&self) -> u64 {
        self.counters.trims.load(Ordering::Acquire)
    }

    #[inline]
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn register_thread(&self, counters: Arc<ThreadCounters>) {
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(counters);
    }

    /// Moves a departing cache's counters into `retired`. Both steps happen under the lock
    /// `stats` takes, so no reader sees the thread's counts missing or twice.
    fn retire_thread(&self, counters: &Arc<ThreadCounters>) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(index) = threads.iter().position(|c| Arc::ptr_eq(c, counters)) {
            threads.swap_remove(index);
        }
        counters.fold_into(&self.retired);
    }

    fn stats(&self) -> PoolStats {
        let mut sums = Sums::default();
        {
            let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
            self.retired.sum_into(&mut sums);
            for counters in threads.iter() {
                counters.sum_into(&mut sums);
            }
        }
        let c = &self.counters;
        let reserved = c.reserved.load(Ordering::Relaxed);
        let in_use = sums.in_use.max(0) as u64;
        let requested = sums.requested.max(0) as u64;
        let cached = reserved.saturating_sub(in_use);
        let allocations = sums.hits + sums.misses;
        let peak =
            |counter: &AtomicU64, now: u64| counter.fetch_max(now, Ordering::Relaxed).max(now);
        PoolStats {
            in_use_bytes: in_use,
            peak_in_use_bytes: peak(&c.peak_in_use, in_use),
            requested_bytes: requested,
            peak_requested_bytes: peak(&c.peak_requested, requested),
            cached_bytes: cached,
            peak_cached_bytes: peak(&c.peak_cached, cached),
            reserved_bytes: reserved,
            peak_reserved_bytes: c.peak_reserved.load(Ordering::Relaxed),
            allocations,
            frees: sums.frees,
            cache_hits: sums.hits,
            cache_misses: sums.misses,
            system_allocations: c.system_allocations.load(Ordering::Relaxed),
            system_frees: c.system_frees.load(Ordering::Relaxed),
            trims: c.trims.load(Ordering::Relaxed),
            budget_failures: c.budget_failures.load(Ordering::Relaxed),
        }
    }
}

/// An aligned byte buffer from a [`BufferPool`]; it returns itself to the pool when dropped,
/// from any thread.
///
/// Its bytes start uninitialised (unless it came from
/// [`alloc_zeroed`](BufferPool::alloc_zeroed)): write them through
/// [`as_uninit_mut`](Self::as_uninit_mut) or [`fill`](Self::fill), after which
/// [`as_bytes`](Self::as_bytes) gives them back.
pub struct PoolBuffer {
    block: Block,
    /// Requested bytes; the block holds at least this many.
    len: usize,
    /// Bytes of the block: `class_size(class)`, kept to spare the free path a lookup.
    capacity: usize,
    class: u32,
    /// Whether all `len` bytes have been written.
    initialized: bool,
    pool: &'static PoolInner,
}

// SAFETY: a `PoolBuffer` owns its bytes exclusively (like a `Box<[u8]>`), and its pool is
// `Sync`: dropping it on another thread returns the block through that thread's cache.
unsafe impl Send for PoolBuffer {}
// SAFETY: `&PoolBuffer` only reads the bytes.
unsafe impl Sync for PoolBuffer {}

impl PoolBuffer {
    /// Requested length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the block actually holds (the size class).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Start of the bytes; aligned to the pool's alignment.
    pub fn as_ptr(&self) -> *const u8 {
        self.block.addr.as_ptr()
    }

    /// Start of the bytes, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.block.addr.as_ptr()
    }

    /// The bytes, if all have been written (or the buffer came zeroed).
    pub fn as_bytes(&self) -> Option<&[u8]> {
        // SAFETY: `len` bytes of the block are ours, and `initialized` says they are written.
        self.initialized
            .then(|| unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) })
    }

    /// The bytes for writing, if all have been written (or the buffer came zeroed).
    pub fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        let (ptr, len) = (self.as_mut_ptr(), self.len);
        // SAFETY: as in `as_bytes`, and `&mut self` makes the access exclusive.
        self.initialized
            .then(|| unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// The bytes as possibly uninitialised memory, for a first write.
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: `len` bytes of the block are exclusively ours; `MaybeUninit` makes no claim
        // about their contents.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr().cast(), self.len) }
    }

    /// Declares every byte written.
    ///
    /// # Safety
    ///
    /// All [`len`](Self::len) bytes must have been initialised (for example through
    /// [`as_uninit_mut`](Self::as_uninit_mut) or [`as_mut_ptr`](Self::as_mut_ptr)).
    pub unsafe fn assume_init(&mut self) {
        self.initialized = true;
    }

    /// Sets every byte to `byte`.
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: `len` bytes of the block are exclusively ours.
        unsafe { self.as_mut_ptr().write_bytes(byte, self.len) };
        self.initialized = true;
    }

    /// Copies `src` into the buffer.
    ///
    /// # Errors
    ///
    /// [`PoolError::LengthMismatch`] unless `src.len() == self.len()`; the buffer is unchanged.
    pub fn copy_from_slice(&mut self, src: &[u8]) -> Result<(), PoolError> {
        if src.len() != self.len {
            return Err(PoolError::LengthMismatch {
                expected: self.len,
                found: src.len(),
            });
        }
        // SAFETY: `src` and our `len` bytes do not overlap (we own ours exclusively).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_mut_ptr(), src.len()) };
        self.initialized = true;
        Ok(())
    }
}

impl PoolBuffer {
    /// A buffer of `size` bytes from the pool this one came from.
    pub(crate) fn alloc_sibling(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        self.pool.alloc(size, false)
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        self.pool
            .free(self.block, self.class as usize, self.capacity, self.len);
    }
}

impl fmt::Debug for PoolBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("initialized", &self.initialized)
            .field("addr", &self.block.addr)
            .finish()
    }
}

impl fmt::Debug for PoolInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolInner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Records the address of an allocation the pool keeps for the rest of the process on
/// purpose (its control block), so that leak checkers (LeakSanitizer, Miri) find it
/// reachable instead of reporting it. Bookkeeping outside any protocol a model checks.
fn keep_reachable(address: usize) {
    static KEPT: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    KEPT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(address);
}
