//! What the pool reports across its parts: the statistics ([`PoolStats`]), the bytes in use
//! now, and where cached memory is for an out-of-memory report. Cold reads, each part
//! answering through its own methods.

use super::inner::PoolInner;
use crate::pool::class;
use crate::pool::error::OutOfMemory;
use crate::pool::observe::stats::PoolStats;
use crate::sync::Ordering;

impl PoolInner {
    /// The statistics now (see [`PoolStats`] for what each figure is, and how exact).
    pub(in crate::pool) fn stats(&self) -> PoolStats {
        let mut s = PoolStats::default();
        let t = self
            .caches
            .op_totals(self.books.cacheless(), Ordering::Relaxed);
        s.frees = t.frees;
        s.freed_bytes_total = t.freed_bytes;
        s.cache_hits = t.hits;
        s.cache_misses = t.misses;
        s.allocations = t.allocations();
        s.allocated_bytes_total = t.allocated_bytes;
        let (allocated_requested, freed_requested) = (t.allocated_requested, t.freed_requested);
        self.caches
            .for_each(|cache| s.cached_in_threads_bytes += cache.binned());
        // An exact counter is one load: the figure at one instant, and its peak is raised
        // with it, so no later read reports a peak below a figure reported before. Sums of
        // counters read one after another are never fed into a peak.
        if self.config.exact_peaks {
            (s.in_use_bytes, s.peak_in_use_bytes) = self.books.in_use_and_peak();
        } else {
            s.in_use_bytes = s.allocated_bytes_total.saturating_sub(s.freed_bytes_total);
        }
        if self.config.exact_requested {
            (s.requested_bytes, s.peak_requested_bytes) = self.books.requested_and_peak();
        } else {
            s.requested_bytes = allocated_requested.saturating_sub(freed_requested);
        }
        // Reserved after in use: a block in use was reserved before it was counted, so a
        // later look at `reserved` holds it unless it was freed and trimmed meanwhile; a few
        // looks make that race rare (a read that still loses it reports no cached bytes).
        let mut looks = 0;
        loop {
            (s.reserved_bytes, s.peak_reserved_bytes) = self.memory.held_and_peak();
            looks += 1;
            if s.reserved_bytes >= s.in_use_bytes || looks == 4 {
                break;
            }
        }
        s.in_use_blocks = s.allocations.saturating_sub(s.frees);
        s.cached_bytes = s.reserved_bytes.saturating_sub(s.in_use_bytes);
        s.cached_in_threads_bytes = s.cached_in_threads_bytes.min(s.cached_bytes);
        s.cached_in_lists_bytes = s.cached_bytes - s.cached_in_threads_bytes;
        (s.system_allocations, s.system_frees) = self.memory.system_calls();
        (s.alloc_retries, s.budget_failures, s.trims) = self.books.slow_counts();
        self.evictor.stats(&mut s);
        self.memory.page_stats(&mut s);
        s
    }

    /// Bytes in use and requested now: the exact counters the configuration keeps, else the
    /// sums of every thread's counts (exact when no other thread is using the pool; see
    /// [`PoolStats`] for what it is otherwise).
    pub(in crate::pool) fn in_use_now(&self) -> (u64, u64) {
        let config = &self.config;
        let (mut in_use, mut requested) = if config.exact_peaks && config.exact_requested {
            (0, 0)
        } else {
            let t = self
                .caches
                .op_totals(self.books.cacheless(), Ordering::Relaxed);
            (
                t.allocated_bytes.saturating_sub(t.freed_bytes),
                t.allocated_requested.saturating_sub(t.freed_requested),
            )
        };
        if config.exact_peaks {
            in_use = self.books.in_use();
        }
        if config.exact_requested {
            requested = self.books.requested();
        }
        (in_use, requested)
    }

    /// Where cached memory is, for an out-of-memory report.
    pub(in crate::pool) fn cache_snapshot(&self) -> CacheSnapshot {
        let mut in_threads = 0;
        self.caches.for_each(|cache| in_threads += cache.binned());
        let mut largest = 0;
        self.memory.for_each_record(|record| {
            if let Some((class, false)) = record.picture() {
                largest = largest.max(class::class_size(class));
            }
        });
        let (in_use, _) = self.in_use_now();
        let reserved = self.memory.held();
        CacheSnapshot {
            in_threads,
            in_lists: reserved.saturating_sub(in_use).saturating_sub(in_threads),
            largest,
        }
    }

    pub(in crate::pool) fn out_of_memory(
        &self,
        requested: usize,
        block_bytes: usize,
        released: Option<CacheSnapshot>,
    ) -> OutOfMemory {
        let before = released.unwrap_or_else(|| self.cache_snapshot());
        let (in_use, _) = self.in_use_now();
        let (reserved, peak_reserved) = self.memory.held_and_peak();
        OutOfMemory {
            requested,
            block_bytes,
            budget: self.memory.budget(),
            in_use,
            cached_in_threads: before.in_threads,
            cached_in_lists: before.in_lists,
            reserved,
            peak_reserved,
            largest_cached_block: before.largest,
            evictable_pinned: 0,
            evictable_unpinned: 0,
            short_with_every_eviction: 0,
        }
    }
}

/// Where cached memory was before a release.
#[derive(Clone, Copy)]
pub(in crate::pool) struct CacheSnapshot {
    pub(in crate::pool) in_threads: u64,
    pub(in crate::pool) in_lists: u64,
    pub(in crate::pool) largest: usize,
}
