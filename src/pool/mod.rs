//! `BufferPool`: size-classed, thread-cached, budgeted buffers for tensor bytes.
//!
//! # Where a block is
//!
//! Every block the pool holds from the system is, at every moment, in exactly one place:
//!
//! - **handed out**, owned by one [`PoolBuffer`];
//! - **in a thread cache**: the bin of its class in the cache of the thread that allocated
//!   it and freed it again (see `cache`); only blocks up to
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
//! A thread reaches its cache through its thread index (a small number, reused after the
//! thread exits: a new thread inherits an exited one's cache, and trim takes it back either
//! way), so finding it costs one table lookup however many pools the process has made.
//!
//! # Lifetime
//!
//! Dropping the last [`BufferPool`] handle closes the pool: every cached block goes back to
//! the system at once (no thread has to come back for it), and buffers still alive go back to
//! the system when they drop. The pool's control block is freed by whoever finishes last: the
//! close, or the drop of the last live buffer. See `engine/close.rs` for the protocol.

mod class;
mod config;
mod engine;
mod error;
pub(crate) mod eviction;
pub(crate) mod front;
mod human_bytes;
mod observe;
mod pages;

pub use config::PoolConfig;
pub use engine::buffer::PoolBuffer;
pub use error::{OutOfMemory, PoolError};
pub use front::global::PoolAllocator;
pub use observe::stats::{BlockInfo, ClassStats, PoolStats};
pub use observe::tag::{MemoryByTag, MemoryTag, TagScope};
pub use observe::trace::{PoolEvent, PoolEventKind, SpanGuard};

use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;

use crate::sync::asymmetric;
use crate::thread;
use engine::close;
use engine::inner::PoolInner;
use observe::chrome;
use observe::trace::{self, Trace};

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

impl BufferPool {
    /// A pool with the default configuration.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig};
    /// let pool = BufferPool::new();
    /// assert_eq!(pool.config(), &PoolConfig::default());
    /// assert_eq!(pool.stats().reserved_bytes, 0); // nothing is held before the first buffer
    /// ```
    pub fn new() -> Self {
        Self::with_config(PoolConfig::default()).expect("the default configuration is valid")
    }

    /// A pool with `config`.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig, PoolError};
    /// let page_aligned = PoolConfig { alignment: 4096, ..PoolConfig::default() };
    /// let pool = BufferPool::with_config(page_aligned)?;
    /// assert_eq!(pool.alloc(100)?.as_ptr() as usize % 4096, 0);
    /// let odd = BufferPool::with_config(PoolConfig { alignment: 3, ..PoolConfig::default() });
    /// assert!(matches!(odd, Err(PoolError::InvalidConfig { field: "alignment", .. })));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
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
            inner: close::allocate_control_block(config, system_blocks),
        })
    }

    #[inline(always)]
    pub(in crate::pool) fn inner(&self) -> &PoolInner {
        // SAFETY: invariant on `inner`: a handle keeps its pool alive.
        unsafe { self.inner.as_ref() }
    }

    /// A buffer of `size` bytes with unspecified contents.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let mut buffer = pool.alloc(1000)?;
    /// buffer.fill(0); // its bytes start unspecified
    /// assert_eq!((buffer.len(), buffer.capacity()), (1000, 1024));
    /// assert_eq!(pool.stats().in_use_bytes, 1024);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PoolError::BudgetExceeded`] when the budget cannot hold another block even after
    /// releasing every cached one; [`PoolError::TooLarge`] above 1 TiB;
    /// [`PoolError::SystemAllocFailed`] when the system refuses.
    #[inline]
    pub fn alloc(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        PoolInner::alloc(self.inner, size, false, true)
    }

    /// A buffer of `size` zero bytes. A reused block is cleared; a block new from the system
    /// is zeroed by the system (no extra pass).
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// pool.alloc(256)?.fill(0xff); // dropped dirty, into this thread's cache
    /// let buffer = pool.alloc_zeroed(256)?; // the same block, cleared
    /// assert_eq!(buffer.as_bytes(), Some(&[0u8; 256][..]));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`alloc`](Self::alloc).
    pub fn alloc_zeroed(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        PoolInner::alloc(self.inner, size, true, true)
    }

    /// Returns every cached block to the system now: the shared lists and every thread's
    /// cache (waiting, at most, for an operation a thread is running on the pool at that
    /// moment), and every free page of the pool's own that may be resident. Returns the bytes
    /// given back: the cached blocks, and the free pages that were dirty before the call (a
    /// block released here and then purged counts once).
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// drop(pool.alloc(1 << 20)?); // kept in this thread's cache
    /// assert_eq!(pool.trim(), 1 << 20);
    /// assert_eq!(pool.stats().reserved_bytes, 0);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn trim(&self) -> u64 {
        let inner = self.inner();
        inner.books.count_trim();
        let dirty = inner.memory.dirty_bytes();
        let released = inner.release_cached();
        inner.memory.trim_pages();
        inner.books.trace(PoolEventKind::Trim, released, 0);
        released + dirty
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
        let inner = self.inner();
        let released = inner.trim_idle();
        inner.memory.tick_pages();
        released
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
        // A thread that never used the pool has no cache in it (and gets no cache now).
        let Some(cache) = inner.my_existing_cache() else {
            return 0;
        };
        cache.drain_own(|class, record| inner.lists.push(cache.shard(), class, record))
    }

    /// A snapshot of the counters.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let buffer = pool.alloc(1000)?;
    /// let stats = pool.stats();
    /// assert_eq!((stats.in_use_bytes, stats.requested_bytes), (1024, 1000));
    /// assert_eq!(stats.in_use_blocks, 1);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn stats(&self) -> PoolStats {
        self.inner().stats()
    }

    /// Starts every peak statistic again from its current value (as
    /// `torch.cuda.reset_peak_memory_stats` does), for example at the start of a step.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let buffer = pool.alloc(1 << 20)?;
    /// assert_eq!(pool.stats().peak_in_use_bytes, 1 << 20);
    /// drop(buffer);
    /// pool.reset_peak_stats();
    /// assert_eq!(pool.stats().peak_in_use_bytes, 0);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn reset_peak_stats(&self) {
        let inner = self.inner();
        inner.memory.reset_peaks();
        inner.books.reset_peaks(&inner.config);
    }

    /// The blocks of every size class the pool holds, in use or cached, and the evictions of
    /// each class over the pool's life (classes with none of either are left out). A scan of
    /// the pool's block records.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let held = pool.alloc(1000)?;
    /// drop(pool.alloc(4096)?);
    /// let classes = pool.class_stats(); // smallest class first
    /// assert_eq!((classes[0].block_bytes, classes[0].in_use_blocks), (1024, 1));
    /// assert_eq!((classes[1].block_bytes, classes[1].cached_blocks), (4096, 1));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn class_stats(&self) -> Vec<ClassStats> {
        let _bookkeeping = thread::Bookkeeping::open();
        let mut by_class: HashMap<usize, ClassStats> = HashMap::new();
        self.inner().memory.for_each_record(|record| {
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
        for (class, evicted) in self.inner().evictor.evicted_by_class() {
            if evicted > 0 {
                let entry = by_class.entry(class).or_insert_with(|| ClassStats {
                    block_bytes: class::class_size(class),
                    ..ClassStats::default()
                });
                entry.evicted_blocks = evicted;
            }
        }
        let mut classes: Vec<_> = by_class.into_values().collect();
        classes.sort_by_key(|c| c.block_bytes);
        classes
    }

    /// The blocks handed out right now: size, class, allocating thread and tag of each, so a
    /// caller can see what holds memory. A scan of the pool's block records; blocks moving
    /// during the scan may be missed or seen twice.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let held = [pool.alloc(1000)?, pool.alloc(50)?];
    /// let requested: usize = pool.snapshot().iter().map(|block| block.requested).sum();
    /// assert_eq!(requested, 1050);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn snapshot(&self) -> Vec<BlockInfo> {
        let _bookkeeping = thread::Bookkeeping::open();
        let mut live = Vec::new();
        self.inner().memory.for_each_record(|record| {
            if let Some(info) = record.live_info() {
                live.push(info);
            }
        });
        live
    }

    /// Bytes in use (class sizes) per memory tag (`None` for untagged buffers), from a
    /// [`snapshot`](Self::snapshot).
    ///
    /// ```
    /// use ferropool::{BufferPool, MemoryTag};
    /// let pool = BufferPool::new();
    /// let weights = MemoryTag::new("weights");
    /// let w = { let _scope = weights.enter(); pool.alloc(4096)? };
    /// let scratch = pool.alloc(1000)?;
    /// let by_tag = pool.memory_by_tag();
    /// assert_eq!((by_tag.get(weights), by_tag.untagged()), (4096, 1024));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn memory_by_tag(&self) -> MemoryByTag {
        let _bookkeeping = thread::Bookkeeping::open();
        self.snapshot()
            .into_iter()
            .map(|block| (block.tag, block.block_bytes as u64))
            .collect()
    }

    /// The traced events, oldest first (empty when tracing is off).
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// assert!(pool.trace_events().is_empty()); // tracing is off
    /// pool.enable_trace(2); // a ring of two events
    /// for step in 0..5 { pool.trace_mark(step); }
    /// let values: Vec<u64> = pool.trace_events().iter().map(|event| event.bytes).collect();
    /// assert_eq!(values, [3, 4]); // oldest first; older ones fell out of the ring
    /// ```
    pub fn trace_events(&self) -> Vec<PoolEvent> {
        let _bookkeeping = thread::Bookkeeping::open();
        self.inner()
            .books
            .ring()
            .map_or_else(Vec::new, Trace::events)
    }

    /// Nanoseconds on the trace's clock (the `at_ns` of an event recorded now), or `None`
    /// when tracing is off.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// assert_eq!(pool.trace_now_ns(), None); // tracing is off
    /// pool.enable_trace(16);
    /// pool.trace_mark(0);
    /// let now = pool.trace_now_ns();
    /// assert!(now >= Some(pool.trace_events()[0].at_ns));
    /// ```
    pub fn trace_now_ns(&self) -> Option<u64> {
        self.inner().books.ring().map(Trace::now_ns)
    }

    /// Records a caller's own moment in the trace (a [`PoolEventKind::Mark`] event carrying
    /// `value`), for example a step boundary. Does nothing when tracing is off.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolEventKind};
    /// let pool = BufferPool::new();
    /// pool.enable_trace(16);
    /// pool.trace_mark(42); // step 42 begins
    /// let mark = pool.trace_events()[0];
    /// assert_eq!((mark.kind, mark.bytes), (PoolEventKind::Mark, 42));
    /// ```
    pub fn trace_mark(&self, value: u64) {
        let inner = self.inner();
        if inner.books.ring().is_some() {
            trace::name_this_thread();
            inner.books.trace(PoolEventKind::Mark, value, 0);
        }
    }

    /// Begins a span named `name` on this thread's track of the trace: it ends when the
    /// returned guard drops, and the export shows it as a duration (a `B`/`E` pair) on the
    /// thread's OS tid, spans nested as the guards are. With tracing off it records nothing
    /// and costs one atomic load; with tracing on, two ring events and no allocation (but
    /// for a thread's first span or mark, which stores its name for the export).
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolEventKind};
    /// let pool = BufferPool::new();
    /// drop(pool.trace_span("off")); // tracing is off: nothing recorded
    /// pool.enable_trace(64);
    /// {
    ///     let _step = pool.trace_span("step");
    ///     drop(pool.alloc(4096)?);
    /// }
    /// let events = pool.trace_events();
    /// assert_eq!((events[0].kind, events[0].name), (PoolEventKind::SpanBegin, "step"));
    /// assert_eq!(events.last().unwrap().kind, PoolEventKind::SpanEnd);
    /// assert!(pool.trace_json().contains("\"ph\":\"B\""));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn trace_span(&self, name: &'static str) -> SpanGuard<'_> {
        SpanGuard::begin(self.inner().books.ring(), name)
    }

    /// The traced events in the Chrome Trace Event format, which Perfetto
    /// (<https://ui.perfetto.dev>) and `chrome://tracing` open: an instant event per
    /// allocation, free, system call, trim and mark (with bytes, class, thread index and
    /// tag) and a `B`/`E` duration pair per [span](Self::trace_span), on the track of the
    /// OS thread (`tid`) that made it; a `thread_name` metadata event per thread (the Rust
    /// name of a thread that made a span or a mark, kept for live threads and the last 1,024
    /// that exited; else `thread <index>`); and a counter track with the bytes in use, cached
    /// and reserved. Timestamps are microseconds since the pool was created. The document is
    /// serialized by `serde_json`. A span's end whose begin the ring has already dropped is
    /// left out, so that every `E` closes a `B`; a span still open has its `B` only (Perfetto
    /// draws it to the end of the trace). For a long trace,
    /// [`write_trace_json`](Self::write_trace_json) streams the same document to a file.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig};
    /// let pool = BufferPool::with_config(PoolConfig {
    ///     trace_capacity: 64,
    ///     ..PoolConfig::default()
    /// })?;
    /// drop(pool.alloc(4096)?);
    /// let json = pool.trace_json();
    /// assert!(json.starts_with("{\"displayTimeUnit\""));
    /// assert!(json.contains("\"ph\":\"C\""));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn trace_json(&self) -> String {
        let _bookkeeping = thread::Bookkeeping::open();
        chrome::to_string(self.inner().id, &self.trace_events())
    }

    /// Writes the traced events to `writer` as [`trace_json`](Self::trace_json) formats
    /// them, streamed: the document is not built in memory first. The writes go through a
    /// buffer of 64 KiB, and `writer` is flushed before this returns.
    ///
    /// # Errors
    ///
    /// What `writer` reports, the final flush's included: `Ok` means the whole document
    /// reached `writer`.
    ///
    /// ```no_run
    /// let pool = ferropool::BufferPool::new();
    /// pool.enable_trace(1 << 16);
    /// // ... the run ...
    /// pool.write_trace_json(std::fs::File::create("trace.json")?)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write_trace_json(&self, writer: impl std::io::Write) -> std::io::Result<()> {
        let _bookkeeping = thread::Bookkeeping::open();
        chrome::write(self.inner().id, &self.trace_events(), writer)
    }

    /// The configuration, as given when the pool was made (see [`budget`](Self::budget) for
    /// the budget in force).
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig};
    /// let config = PoolConfig { idle_rounds: 8, ..PoolConfig::default() };
    /// let pool = BufferPool::with_config(config.clone())?;
    /// assert_eq!(pool.config(), &config);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn config(&self) -> &PoolConfig {
        &self.inner().config
    }

    /// The byte budget in force.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// assert_eq!(pool.budget(), None);
    /// pool.set_budget(Some(1 << 20));
    /// assert_eq!(pool.budget(), Some(1 << 20));
    /// assert_eq!(pool.config().budget, None); // the configuration stays as given
    /// ```
    pub fn budget(&self) -> Option<u64> {
        self.inner().memory.budget()
    }

    /// Changes the byte budget (`None`: no limit; `Some(u64::MAX)` is the same as `None`).
    ///
    /// A budget below what the pool holds takes nothing back from buffers in use, and refuses
    /// new blocks until enough is freed: the pool releases every cached block at once and
    /// purges its free pages down to the budget, and until what it holds fits again, a freed
    /// block goes back to the system rather than to a cache, so the pool's resident free
    /// memory stays within the budget whatever `decay_ms` is. A budget also withdraws
    /// huge-page advice from the pool's pages (given while there was none): a huge page would
    /// make resident bytes around a small block that the budget does not see.
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
        let inner = self.inner();
        inner.memory.set_budget(budget);
        if inner.memory.over_budget() {
            inner.release_cached();
            inner.memory.fit_pages();
        }
    }

    /// Starts tracing with a ring of `capacity` events (at most [`PoolConfig::MAX_TRACE_EVENTS`]: a
    /// larger capacity is cut to it), if the pool does not trace already (the
    /// configuration's `trace_capacity`, or an earlier call); whether this call started it.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// assert!(pool.enable_trace(1024));
    /// assert!(!pool.enable_trace(1024), "it traces already");
    /// drop(pool.alloc(64)?);
    /// assert_eq!(pool.trace_events().len(), 3); // system alloc, alloc, free
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn enable_trace(&self, capacity: usize) -> bool {
        let capacity = capacity.min(PoolConfig::MAX_TRACE_EVENTS);
        self.inner().books.enable(capacity)
    }

    /// Bytes the pool holds for per-thread state: the caches and counters of the threads
    /// that used it, and the map that finds them. It follows how many threads used the pool,
    /// not how high their thread indices are.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// assert_eq!(pool.thread_state_bytes(), 0); // no thread used it yet
    /// assert_eq!(pool.flush_thread_cache(), 0); // nothing to flush, and no state made
    /// assert_eq!(pool.thread_state_bytes(), 0);
    /// drop(pool.alloc(64)?);
    /// assert!(pool.thread_state_bytes() > 0);
    /// assert!(pool.thread_state_bytes() < 64 << 10);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn thread_state_bytes(&self) -> usize {
        self.inner().caches.footprint()
    }

    /// This pool's identity.
    ///
    /// ```
    /// use ferropool::BufferPool;
    /// let pool = BufferPool::new();
    /// assert_eq!(pool.clone().id(), pool.id()); // clones share one pool
    /// assert_ne!(BufferPool::new().id(), pool.id());
    /// ```
    pub fn id(&self) -> u64 {
        self.inner().id
    }

    /// Pools of this process whose control block is still allocated: those with a handle or
    /// a buffer alive. A leak check for programs that make a pool per job: it goes back down
    /// when a job's pool and buffers are gone.
    ///
    /// ```
    /// use ferropool::BufferPool;
    /// let before = BufferPool::pools_alive();
    /// let pool = BufferPool::new();
    /// let buffer = pool.alloc(64)?;
    /// drop(pool);
    /// assert_eq!(BufferPool::pools_alive(), before + 1); // the buffer keeps it
    /// drop(buffer);
    /// assert_eq!(BufferPool::pools_alive(), before);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn pools_alive() -> usize {
        close::alive()
    }

    /// The size of the class a request of `size` bytes is rounded up to, or `None` if too
    /// large: the block it takes, unless its class has no free block and it takes a spare
    /// one of a larger class ([`PoolConfig::larger_blocks`]).
    ///
    /// ```
    /// use ferropool::BufferPool;
    /// assert_eq!(BufferPool::class_size_for(1000), Some(1024));
    /// assert_eq!(BufferPool::class_size_for(usize::MAX), None);
    /// ```
    pub fn class_size_for(size: usize) -> Option<usize> {
        class::class_of(size).map(class::class_size)
    }
}

impl Clone for BufferPool {
    fn clone(&self) -> Self {
        // Relaxed: a new handle is made from a live one, like `Arc::clone`.
        self.inner().life.add_handle();
        Self { inner: self.inner }
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        if !self.inner().life.drop_handle() {
            return;
        }
        // SAFETY: this was the last handle; `close` is the pool's close, run once.
        unsafe { close::close(self.inner) };
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
