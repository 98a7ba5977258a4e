//! Pool statistics: what each thread counted in its cache (single writer, no read-modify-
//! write on the hot path), summed on read with the pool-wide counters of the slow paths.

use std::fmt;

use super::tag::MemoryTag;
use crate::pool::human_bytes::HumanBytes;

/// A snapshot of a pool's counters, in the spirit of `torch.cuda.memory_stats()`: current and
/// peak bytes and blocks, totals since the pool was made, and what the pool did to get them.
///
/// `cached_bytes` is `reserved_bytes - in_use_bytes`: memory the pool holds from the system
/// and has not handed out, split into what threads keep in their caches and what waits on the
/// pool's shared lists.
///
/// # What one read guarantees while other threads use the pool
///
/// - `reserved_bytes` is the value of the pool's reservation counter at one instant during
///   the read; with [`PoolConfig::exact_peaks`](super::super::PoolConfig::exact_peaks) (the
///   default) so is `in_use_bytes`, and with
///   [`PoolConfig::exact_requested`](super::super::PoolConfig::exact_requested) `requested_bytes`
///   (each at its own instant).
/// - The peaks are high-water marks of those counters since the pool was made or
///   [`BufferPool::reset_peak_stats`](super::super::BufferPool::reset_peak_stats) last ran: never
///   above the largest value the counter took (a read never raises a peak past the true
///   maximum), never below a value of the figure reported before, and never lower than an
///   earlier read's, except across a reset. A reservation counts from the moment it is made,
///   including one the system then refuses.
/// - The totals (`allocations`, `frees`, `cache_hits`, `cache_misses`,
///   `allocated_bytes_total`, `freed_bytes_total`, `system_*`, `alloc_retries`,
///   `budget_failures`, `trims`) only grow; each is read once per thread, so it lies between
///   its value when the read began and its value when it ended; `allocations` is always
///   `cache_hits + cache_misses`, and frees are read before allocations (with acquire loads,
///   which bring along the count of each freed block's allocation, on whatever thread it
///   was made), so `frees` never exceeds `allocations` (nor `freed_bytes_total`
///   `allocated_bytes_total`).
/// - `in_use_bytes` and `reserved_bytes` are read at two instants: a block reserved, used,
///   freed and trimmed between them can make `in_use_bytes` exceed `reserved_bytes` (the
///   read looks at `reserved` again a few times first, so this is rare; `cached_bytes` then
///   reads 0).
/// - The figures derived from counters read at different instants (`in_use_blocks`,
///   `cached_bytes` and its split) are exact when no other thread is using the pool, and
///   approximations otherwise (never negative; `cached_bytes` never above `reserved_bytes`).
///   So are `in_use_bytes` with `exact_peaks` off and `requested_bytes` with
///   `exact_requested` off (the default); their peaks are then not tracked and read 0.
///
/// Its `Display` is a summary in human units:
///
/// ```
/// let pool = ferropool::BufferPool::new();
/// let buffer = pool.alloc(3 << 20)?;
/// let text = pool.stats().to_string();
/// assert!(text.contains("in use"), "{text}");
/// assert!(text.contains("3.00 MiB"), "{text}");
/// # drop(buffer);
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolStats {
    /// Bytes in blocks handed out (each block's whole size: its request's class, or a
    /// larger one with `PoolConfig::larger_blocks`).
    pub in_use_bytes: u64,
    /// High-water mark of `in_use_bytes` (0 with `exact_peaks` off).
    pub peak_in_use_bytes: u64,
    /// Bytes requested by the blocks handed out, before rounding.
    pub requested_bytes: u64,
    /// High-water mark of `requested_bytes` (0 unless `exact_requested` is on).
    pub peak_requested_bytes: u64,
    /// Blocks handed out.
    pub in_use_blocks: u64,
    /// Bytes held from the system and not handed out: `cached_in_threads_bytes +
    /// cached_in_lists_bytes`.
    pub cached_bytes: u64,
    /// Of `cached_bytes`, what threads keep in their caches.
    pub cached_in_threads_bytes: u64,
    /// Of `cached_bytes`, what waits on the pool's shared lists.
    pub cached_in_lists_bytes: u64,
    /// Bytes held from the system: `in_use_bytes + cached_bytes`.
    pub reserved_bytes: u64,
    /// High-water mark of `reserved_bytes`.
    pub peak_reserved_bytes: u64,
    /// Bytes handed out since the pool was made (class sizes).
    pub allocated_bytes_total: u64,
    /// Bytes given back since the pool was made (class sizes).
    pub freed_bytes_total: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Buffers given back.
    pub frees: u64,
    /// Allocations served by the calling thread's cache.
    pub cache_hits: u64,
    /// Allocations the thread cache could not serve (from the shared lists or the system).
    pub cache_misses: u64,
    /// Blocks obtained from the system.
    pub system_allocations: u64,
    /// Blocks returned to the system.
    pub system_frees: u64,
    /// Allocations that first failed for the budget, released cached memory, and were tried
    /// again.
    pub alloc_retries: u64,
    /// Allocations refused for the budget, after that retry; one that evicting values then
    /// served counts here too (see `evictions`).
    pub budget_failures: u64,
    /// Calls to `trim`.
    pub trims: u64,
    /// Evictable values the pool evicted, to make room for a request the budget refused or
    /// on their owner's request (see
    /// [`RetainedValue::evictable`](crate::RetainedValue::evictable)).
    pub evictions: u64,
    /// The bytes (block sizes) of those evictions.
    pub evicted_bytes: u64,
    /// Of those evictions, the values the window step evicted: a run of neighbours whose
    /// blocks, with the free pages beside them, make room for a large request (see
    /// [`BufferPool::class_stats`](super::super::BufferPool::class_stats) for the evictions
    /// by size).
    pub window_evictions: u64,
    /// Evicted values recomputed on a read.
    pub recomputations: u64,
    /// The bytes (block sizes) of those recomputes.
    pub recomputed_bytes: u64,
    /// Time spent in recomputes, nanoseconds (each recompute's own computation, without
    /// that of the inputs it recomputed first, which count on their own).
    pub recompute_ns: u64,
    /// An upper bound of the pool's resident memory: `reserved_bytes` plus `dirty_bytes`.
    /// Under a budget the pool keeps it within the budget: it purges free pages before it
    /// would pass it. The two are read at two instants: while other threads allocate or
    /// release, a block on its way between the pages and the class lists may count twice or
    /// not at all in one read (`peak_committed_bytes` is taken under the pages' lock and
    /// counts every block once). (With [`PoolConfig::os_pages`](super::super::PoolConfig::os_pages)
    /// off, a heap may keep what the pool released: then this is only what the pool holds.)
    #[cfg_attr(feature = "serde", serde(default))]
    pub committed_bytes: u64,
    /// High-water mark of `committed_bytes`: raised whenever the pool's pages serve a block,
    /// whenever a budgeted pool takes a block from the heap (the two ways what it commits
    /// grows: a block given back only moves bytes from held to free), and by every read of
    /// the statistics, so never below `committed_bytes` or `peak_reserved_bytes` in one read.
    #[cfg_attr(feature = "serde", serde(default))]
    pub peak_committed_bytes: u64,
    /// Bytes of the pool's free pages (not in any block) that may still be resident: freed
    /// and not yet returned to the OS (see
    /// [`PoolConfig::decay_ms`](super::super::PoolConfig::decay_ms)).
    #[cfg_attr(feature = "serde", serde(default))]
    pub dirty_bytes: u64,
    /// Address space the pool's pages hold mapped: its blocks of 32 KiB and more and the
    /// free pages around them, resident or not.
    #[cfg_attr(feature = "serde", serde(default))]
    pub mapped_bytes: u64,
    /// System calls of the pool's pages: maps, unmaps and purges.
    #[cfg_attr(feature = "serde", serde(default))]
    pub os_calls: u64,
    /// Bytes of free pages returned to the OS (purged) so far.
    #[cfg_attr(feature = "serde", serde(default))]
    pub purged_bytes: u64,
}

impl PoolStats {
    /// Bytes lost to rounding requests up to their block's size (their class, or a larger
    /// one's with `PoolConfig::larger_blocks`): `in_use - requested`.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let buffer = pool.alloc(1000)?; // a block of 1024 bytes
    /// assert_eq!(pool.stats().rounding_waste_bytes(), 24);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn rounding_waste_bytes(&self) -> u64 {
        self.in_use_bytes.saturating_sub(self.requested_bytes)
    }

    /// Fraction of allocations served by a thread cache, in `0.0..=1.0`.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// drop(pool.alloc(4096)?); // a miss: from the system
    /// drop(pool.alloc(4096)?); // a hit: the block just freed
    /// assert_eq!(pool.stats().cache_hit_rate(), 0.5);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn cache_hit_rate(&self) -> f64 {
        if self.allocations == 0 {
            0.0
        } else {
            self.cache_hits as f64 / self.allocations as f64
        }
    }
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = HumanBytes;
        writeln!(
            f,
            "in use    {:>11}  peak {:>11}  ({} blocks; requested {}, peak {})",
            b(self.in_use_bytes),
            b(self.peak_in_use_bytes),
            self.in_use_blocks,
            b(self.requested_bytes),
            b(self.peak_requested_bytes),
        )?;
        writeln!(
            f,
            "cached    {:>11}  ({} in thread caches, {} on shared lists)",
            b(self.cached_bytes),
            b(self.cached_in_threads_bytes),
            b(self.cached_in_lists_bytes),
        )?;
        writeln!(
            f,
            "reserved  {:>11}  peak {:>11}",
            b(self.reserved_bytes),
            b(self.peak_reserved_bytes),
        )?;
        writeln!(
            f,
            "totals    {} allocations ({:.1}% from thread caches), {} frees; {} allocated, {} freed",
            self.allocations,
            100.0 * self.cache_hit_rate(),
            self.frees,
            b(self.allocated_bytes_total),
            b(self.freed_bytes_total),
        )?;
        write!(
            f,
            "system    {} allocations, {} frees; {} retries after releasing cached memory, {} refused for the budget; {} trims",
            self.system_allocations,
            self.system_frees,
            self.alloc_retries,
            self.budget_failures,
            self.trims,
        )?;
        if self.mapped_bytes > 0 || self.os_calls > 0 {
            write!(
                f,
                "\npages     {} mapped, {} free and resident, committed {} (peak {}); {} system calls, {} returned",
                b(self.mapped_bytes),
                b(self.dirty_bytes),
                b(self.committed_bytes),
                b(self.peak_committed_bytes),
                self.os_calls,
                b(self.purged_bytes),
            )?;
        }
        if self.evictions > 0 || self.recomputations > 0 {
            write!(
                f,
                "\nevicted   {} values ({}); {} recomputed ({}) in {:.3} s",
                self.evictions,
                b(self.evicted_bytes),
                self.recomputations,
                b(self.recomputed_bytes),
                self.recompute_ns as f64 / 1e9,
            )?;
        }
        Ok(())
    }
}

/// The blocks of one size class, as
/// [`BufferPool::class_stats`](super::super::BufferPool::class_stats) reports them.
///
/// ```
/// let pool = ferropool::BufferPool::new();
/// let held = [pool.alloc(4096)?, pool.alloc(4000)?]; // both in the 4 KiB class
/// let classes = pool.class_stats();
/// assert_eq!(classes.len(), 1);
/// assert_eq!((classes[0].block_bytes, classes[0].in_use_blocks), (4096, 2));
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClassStats {
    /// Bytes a block of the class holds.
    pub block_bytes: usize,
    /// Blocks of the class handed out.
    pub in_use_blocks: u64,
    /// Blocks of the class the pool holds and has not handed out.
    pub cached_blocks: u64,
    /// Evictable values of the class the pool has evicted, over its life.
    pub evicted_blocks: u64,
}

/// One live block, as [`BufferPool::snapshot`](super::super::BufferPool::snapshot) reports it.
///
/// ```
/// use ferropool::{BufferPool, MemoryTag};
/// let pool = BufferPool::new();
/// let kv_cache = MemoryTag::new("kv-cache");
/// let _scope = kv_cache.enter();
/// let held = pool.alloc(1000)?;
/// let block = pool.snapshot()[0];
/// assert_eq!((block.requested, block.block_bytes, block.tag), (1000, 1024, Some(kv_cache)));
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockInfo {
    /// Bytes requested.
    pub requested: usize,
    /// Bytes of the block (its class).
    pub block_bytes: usize,
    /// The thread index of the allocating thread (small numbers, reused after a thread
    /// exits; `u32::MAX - 1` for a thread without one: its thread-locals were being
    /// destroyed).
    pub thread: u32,
    /// The tag current on that thread when it allocated the block.
    pub tag: Option<MemoryTag>,
}
