//! Pool statistics: per-thread counters with a single writer each (no read-modify-write on
//! the hot path), merged on read with the pool-wide counters of the slow paths.

use crate::sync::{AtomicI64, AtomicU64, Ordering};

/// A snapshot of a pool's counters. Byte counts are in bytes; `peak_*` are high-water marks.
///
/// `cached_bytes` is `reserved_bytes - in_use_bytes`: whatever the pool holds from the
/// system and has not handed out is cached somewhere (a thread cache or a class list).
///
/// `peak_reserved_bytes` is exact. The other peaks are sampled whenever the pool reserves or
/// releases system memory and whenever stats are read, so they can miss a short spike that
/// neither event saw; they never exceed `peak_reserved_bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Bytes in blocks handed out (rounded up to their class).
    pub in_use_bytes: u64,
    /// High-water mark of `in_use_bytes`.
    pub peak_in_use_bytes: u64,
    /// Bytes requested by the blocks handed out, before rounding.
    pub requested_bytes: u64,
    /// High-water mark of `requested_bytes`.
    pub peak_requested_bytes: u64,
    /// Bytes in blocks cached by the pool (its lists and the threads' caches): reserved and
    /// not in use.
    pub cached_bytes: u64,
    /// High-water mark of `cached_bytes`.
    pub peak_cached_bytes: u64,
    /// Bytes held from the system: `in_use_bytes + cached_bytes`.
    pub reserved_bytes: u64,
    /// High-water mark of `reserved_bytes` (exact).
    pub peak_reserved_bytes: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Buffers returned.
    pub frees: u64,
    /// Allocations served by the calling thread's cache.
    pub cache_hits: u64,
    /// Allocations the thread cache could not serve (from the pool's lists or the system).
    pub cache_misses: u64,
    /// Blocks obtained from the system.
    pub system_allocations: u64,
    /// Blocks returned to the system.
    pub system_frees: u64,
    /// Calls to `trim`.
    pub trims: u64,
    /// Allocations refused for the budget.
    pub budget_failures: u64,
}

impl PoolStats {
    /// Bytes lost to rounding requests up to their class: `in_use - requested`.
    pub fn rounding_waste_bytes(&self) -> u64 {
        self.in_use_bytes.saturating_sub(self.requested_bytes)
    }

    /// Fraction of allocations served by a thread cache, in `0.0..=1.0`.
    pub fn cache_hit_rate(&self) -> f64 {
        if self.allocations == 0 {
            0.0
        } else {
            self.cache_hits as f64 / self.allocations as f64
        }
    }
}

/// Counters one thread writes (relaxed load + store: one writer, so no read-modify-write)
/// and any thread reads. The signed ones move in both directions: a buffer allocated on one
/// thread and freed on another adds on the first and subtracts on the second.
///
/// Cached bytes are not counted here: they are whatever is reserved and not in use.
#[derive(Default, Debug)]
pub(super) struct ThreadCounters {
    pub(super) in_use: AtomicI64,
    pub(super) requested: AtomicI64,
    /// Allocations served by a thread cache.
    pub(super) hits: AtomicU64,
    /// Allocations served from a class list or the system.
    pub(super) misses: AtomicU64,
    pub(super) frees: AtomicU64,
}

/// Adds `delta` to a counter that only the calling thread writes.
#[inline(always)]
pub(super) fn bump_i(counter: &AtomicI64, delta: i64) {
    counter.store(counter.load(Ordering::Relaxed) + delta, Ordering::Relaxed);
}

/// Adds 1 to a counter that only the calling thread writes.
#[inline(always)]
pub(super) fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl ThreadCounters {
    /// Counts an allocation (`sign` 1, a miss) or a free (`sign` -1) on shared counters, for
    /// operations made without a thread cache (read-modify-writes: these are shared).
    pub(super) fn count_shared(&self, sign: i64, class_bytes: usize, requested: usize) {
        let event = if sign > 0 { &self.misses } else { &self.frees };
        event.fetch_add(1, Ordering::Relaxed);
        self.in_use
            .fetch_add(sign * class_bytes as i64, Ordering::Relaxed);
        self.requested
            .fetch_add(sign * requested as i64, Ordering::Relaxed);
    }

    /// Adds this thread's counters into `into` (with read-modify-writes: `into` is shared).
    pub(super) fn fold_into(&self, into: &ThreadCounters) {
        for (from, to) in [
            (&self.in_use, &into.in_use),
            (&self.requested, &into.requested),
        ] {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let events = [
            (&self.hits, &into.hits),
            (&self.misses, &into.misses),
            (&self.frees, &into.frees),
        ];
        for (from, to) in events {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Adds this thread's counters into a plain sum.
    pub(super) fn sum_into(&self, sum: &mut Sums) {
        sum.in_use += self.in_use.load(Ordering::Relaxed);
        sum.requested += self.requested.load(Ordering::Relaxed);
        sum.hits += self.hits.load(Ordering::Relaxed);
        sum.misses += self.misses.load(Ordering::Relaxed);
        sum.frees += self.frees.load(Ordering::Relaxed);
    }
}

/// A plain sum of [`ThreadCounters`].
#[derive(Default, Debug)]
pub(super) struct Sums {
    pub(super) in_use: i64,
    pub(super) requested: i64,
    pub(super) hits: u64,
    pub(super) misses: u64,
    pub(super) frees: u64,
}

/// Pool-wide counters of the slow paths (read-modify-writes are fine there).
#[derive(Default, Debug)]
pub(super) struct PoolCounters {
    pub(super) reserved: AtomicU64,
    pub(super) peak_reserved: AtomicU64,
    pub(super) peak_in_use: AtomicU64,
    pub(super) peak_requested: AtomicU64,
    pub(super) peak_cached: AtomicU64,
    pub(super) system_allocations: AtomicU64,
    pub(super) system_frees: AtomicU64,
    pub(super) trims: AtomicU64,
    pub(super) budget_failures: AtomicU64,
}
