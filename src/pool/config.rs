//! `PoolConfig`: the settings of a pool, checked when the pool is built.

use super::class;
use super::error::PoolError;

/// The largest block a thread cache may keep (the caches have a bin for each class up to it).
pub(super) const MAX_CACHED_BLOCK: usize = 1 << 20;

/// Configuration of a [`BufferPool`](super::BufferPool).
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
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolConfig {
    /// Alignment of every buffer: a power of two from 8 to 4096. Default 64.
    pub alignment: usize,
    /// Bytes the pool may hold from the system (in use plus cached, and its free pages that
    /// may be resident). `None`: no limit; `Some(u64::MAX)` is the same (`budget()` reads
    /// `None`, and nothing a budget changes applies).
    pub budget: Option<u64>,
    /// Bytes each thread may keep cached per pool, in blocks it allocated itself and freed
    /// again (blocks freed by another thread go to the pool's shared lists, where the thread
    /// that allocates next finds them). 0 turns the thread caches off. Default 4 MiB.
    pub thread_cache_bytes: usize,
    /// Blocks larger than this skip the thread caches. At most 1 MiB. Default 1 MiB.
    pub thread_cache_max_block: usize,
    /// Blocks each thread may keep cached per size class. Default 8.
    pub thread_cache_blocks_per_class: usize,
    /// Events kept by the trace ring, at most [`PoolConfig::MAX_TRACE_EVENTS`]; 0 (the default)
    /// turns tracing off. The ring is allocated in full when tracing starts.
    pub trace_capacity: usize,
    /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)` on Linux) for blocks of at
    /// least `advise_min_block` bytes, which are then also aligned to 2 MiB, so that a large
    /// buffer is covered by huge pages end to end. Default on.
    pub huge_pages: bool,
    /// Fault in blocks of at least `advise_min_block` bytes when they come from the system
    /// (`madvise(MADV_POPULATE_WRITE)` on Linux, else a write per page), so that the first
    /// touch does not pay for it. Default off.
    pub prefault: bool,
    /// The smallest block that `huge_pages` and `prefault` apply to. Default 2 MiB.
    pub advise_min_block: usize,
    /// The idle policy of [`BufferPool::trim_idle`](super::BufferPool::trim_idle): a size
    /// class that no allocation has drawn from the shared lists during this many calls in a
    /// row has its listed blocks released, and so do the caches of threads that made no pool
    /// operation during this many calls in a row (at least one). Default 4.
    pub idle_rounds: u32,
    /// Track the bytes in use in a pool-wide counter (the default), so that `in_use_bytes`
    /// and `peak_in_use_bytes` are exact at every moment, whatever other threads do: reset
    /// the peaks, run a step, read the true high-water mark. While one thread alone uses
    /// the pool (or threads one after another that take the same thread index, as a
    /// worker spawned and joined in turn does), it updates the counter with a plain load
    /// and store, which costs next to nothing (an alloc + free pair on an AMD Zen 5
    /// machine: 7.5-8.3 ns against 15.6-16.7 ns with a locked instruction each). From the
    /// first allocation, free or resize of a thread with another index on, for good, it
    /// costs one shared read-modify-write per allocation and one per free (the counter's
    /// cache line moves between threads that allocate at once): on 2-core machines, mixed
    /// sizes with half the frees made by a neighbour thread and no byte touched, 0.59-0.84x
    /// the throughput of `exact_peaks: false` on two threads (on that Zen 5 machine; 0.76-0.84x
    /// on earlier Intel and AMD ones; `benches/README.md`). An exact peak cannot be had for
    /// less: the maximum over time of a sum of per-thread counts is no function of
    /// per-thread figures.
    ///
    /// When off, each thread counts on its own only: `in_use_bytes` is a sum of per-thread
    /// counters read one after another (exact when no other thread is using the pool,
    /// approximate otherwise), and `peak_in_use_bytes` is not tracked (it reads 0).
    /// `peak_reserved_bytes` is exact either way.
    pub exact_peaks: bool,
    /// The same for the requested bytes (`requested_bytes`, `peak_requested_bytes`): one
    /// more shared read-modify-write per allocation and free. Default off: then
    /// `requested_bytes` is a sum of per-thread counters and its peak is not tracked (0).
    #[cfg_attr(feature = "serde", serde(default))]
    pub exact_requested: bool,
    /// When a size class has no free block listed, serve the request with a spare listed
    /// block of a larger class that holds at most a quarter more bytes (for classes of 64
    /// bytes and more, one or two classes up), before asking the system for a new block (the
    /// default). Spare: the list it is on (one per class and shard) keeps at least one more
    /// block, so each list's last free block stays for its own class's next request. Each
    /// class keeps its own blocks, so a pool serving varied sizes would otherwise keep
    /// growing after its total in use stopped: every class grows to its own peak, and the
    /// classes peak at different times.
    ///
    /// Such a buffer's [`capacity`](super::PoolBuffer::capacity) is its block's size, larger
    /// than [`BufferPool::class_size_for`](super::BufferPool::class_size_for) of its length,
    /// and the block goes back to its own class when freed. The price: a class whose
    /// requests find a larger class's spares first may go on being served by them, each
    /// block at most a quarter larger than its own would be; in a step that repeats, that
    /// holds the pool up to a quarter above what it would reserve for those blocks (a
    /// constructed worst case reached +11% in all; the main job's and the burn benchmark's
    /// figures did not move). Never under a budget (the lender may run short later, and
    /// the budget refuse the larger block it then needs where the borrower's own would have
    /// fitted), never across `thread_cache_max_block` (a class the thread caches keep,
    /// served by blocks they skip, would miss its bin for good), and never from a thread
    /// cache.
    ///
    /// Off, a request takes a block of its own class or a new one.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig};
    /// let pool = BufferPool::with_config(PoolConfig {
    ///     thread_cache_bytes: 0, // freed blocks go straight to the shared lists
    ///     ..PoolConfig::default()
    /// })?;
    /// let (a, b) = (pool.alloc(1152 << 10)?, pool.alloc(1152 << 10)?); // the 1.125 MiB class
    /// drop((a, b)); // both listed
    /// let buffer = pool.alloc(1 << 20)?; // the 1 MiB class has none listed
    /// assert_eq!(buffer.capacity(), 1152 << 10); // served by a spare 1.125 MiB block
    /// assert_eq!(pool.stats().system_allocations, 2);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    #[cfg_attr(feature = "serde", serde(default = "larger_blocks_default"))]
    pub larger_blocks: bool,
    /// Where blocks of 32 KiB and more come from. On (the default): from the pool's own
    /// pages, segments it maps from the OS (`mmap` on Linux; the system allocator
    /// elsewhere) and carves blocks out of, best fit; a block released by the class lists
    /// merges with the free pages beside it, so bytes freed in one size serve a request of
    /// another, and free pages go back to the OS (`madvise(MADV_DONTNEED)`) after
    /// [`decay_ms`](Self::decay_ms), at once when the budget needs them, and on
    /// [`BufferPool::trim`](super::BufferPool::trim). Under a budget the pool then keeps its
    /// resident memory, free pages included, within the budget
    /// ([`PoolStats::committed_bytes`](super::PoolStats::committed_bytes)).
    ///
    /// Off: every block is one allocation of the global allocator (of the system allocator
    /// for the process-wide pool), freed back to it one by one; a heap such as glibc's may
    /// keep such memory resident after the pool released it.
    ///
    /// ```
    /// use ferropool::BufferPool;
    /// let pool = BufferPool::new();
    /// drop(pool.alloc(16 << 20)?); // carved from a segment, then cached
    /// pool.trim(); // the block back to the free pages, purged, and its segment unmapped
    /// let stats = pool.stats();
    /// assert_eq!((stats.reserved_bytes, stats.committed_bytes, stats.mapped_bytes), (0, 0, 0));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    #[cfg_attr(feature = "serde", serde(default = "os_pages_default"))]
    pub os_pages: bool,
    /// With `os_pages`: milliseconds a free page may stay resident before it goes back to
    /// the OS (checked whenever the pool maps, carves or releases a block, and on
    /// [`BufferPool::trim_idle`](super::BufferPool::trim_idle); no thread of its own).
    /// Default 10,000. 0 returns every page the moment its block is released (a system
    /// call per release); `u64::MAX` never returns pages by the clock, only for the budget
    /// and on `trim`. A pool whose blocks stay on its lists (the steady state of a
    /// repeating step) releases nothing and so returns nothing.
    #[cfg_attr(feature = "serde", serde(default = "decay_ms_default"))]
    pub decay_ms: u64,
}

#[cfg(feature = "serde")]
fn larger_blocks_default() -> bool {
    true
}

#[cfg(feature = "serde")]
fn os_pages_default() -> bool {
    true
}

#[cfg(feature = "serde")]
fn decay_ms_default() -> u64 {
    PoolConfig::default().decay_ms
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            alignment: 64,
            budget: None,
            thread_cache_bytes: 4 << 20,
            thread_cache_max_block: MAX_CACHED_BLOCK,
            thread_cache_blocks_per_class: 8,
            trace_capacity: 0,
            huge_pages: true,
            prefault: false,
            advise_min_block: 2 << 20,
            idle_rounds: 4,
            exact_peaks: true,
            exact_requested: false,
            larger_blocks: true,
            os_pages: true,
            decay_ms: 10_000,
        }
    }
}

impl PoolConfig {
    /// The most events a pool's trace ring keeps (about 72 MiB of events).
    pub const MAX_TRACE_EVENTS: usize = 1 << 20;

    /// Whether the pool keeps a pool-wide exact counter (`exact_peaks` or
    /// `exact_requested`).
    pub(super) fn exact_counters(&self) -> bool {
        self.exact_peaks || self.exact_requested
    }

    /// Checks every field.
    pub(super) fn validate(&self) -> Result<(), PoolError> {
        let invalid = |field, value: usize, expected| {
            Err(PoolError::InvalidConfig {
                field,
                value: value as u64,
                expected,
            })
        };
        if !self.alignment.is_power_of_two() || !(8..=4096).contains(&self.alignment) {
            return invalid("alignment", self.alignment, "a power of two in 8..=4096");
        }
        if self.thread_cache_max_block > MAX_CACHED_BLOCK {
            return invalid(
                "thread_cache_max_block",
                self.thread_cache_max_block,
                "at most 1 MiB (1048576)",
            );
        }
        if self.trace_capacity > Self::MAX_TRACE_EVENTS {
            return invalid(
                "trace_capacity",
                self.trace_capacity,
                "at most MAX_TRACE_EVENTS (1048576)",
            );
        }
        Ok(())
    }

    /// The classes that go through the thread caches: every class below the one returned
    /// (the classes whose blocks are at most `thread_cache_max_block`; none when the caches
    /// are off).
    pub(super) fn cached_classes(&self) -> usize {
        if self.thread_cache_bytes == 0 {
            return 0;
        }
        // The smallest class holding `thread_cache_max_block`, itself included if it holds
        // exactly that many bytes (validation bounds the size, so it has a class).
        let max = self.thread_cache_max_block;
        match class::class_of(max) {
            Some(class) if class::class_size(class) == max => class + 1,
            Some(class) => class,
            None => 0,
        }
    }
}

/// Classes with a thread-cache bin: every class up to [`MAX_CACHED_BLOCK`].
pub(super) const BIN_CLASSES: usize = match class::class_of(MAX_CACHED_BLOCK) {
    Some(class) => class + 1,
    None => panic!("the largest cached block has a class"),
};
