//! Memory from the system and back: blocks reserved within the byte budget and released one
//! by one, and the out-of-memory report. What decides which cached blocks go back (trim,
//! the idle policy, budget pressure, the close) is in `drain.rs`.

use std::alloc::Layout;
use std::ptr::NonNull;

use super::super::pages::{Room, PAGE, PAGED_MIN_BLOCK};
use super::super::{advise, class, OutOfMemory, PoolError, PoolEventKind};
use super::inner::PoolInner;
use super::ops::Taken;
use crate::sync::{global, system, Ordering};

impl PoolInner {
    /// A block new from the system, within the budget.
    #[cold]
    pub(in crate::pool) fn system_alloc(
        &self,
        class: usize,
        class_bytes: usize,
        size: usize,
        zeroed: bool,
    ) -> Result<Taken<'_>, PoolError> {
        let mut released = None;
        // First the listed blocks the budget lacks (largest first), then everything.
        let bytes = class_bytes as u64;
        let room = self.reserve(bytes) || (self.release_listed_for(bytes) && self.reserve(bytes));
        if !room {
            // Release every cached block, other threads' caches included, and try once more.
            released = Some(self.release_cached_for_retry());
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
        let allocate = || self.obtain_block(class_bytes, layout, zeroed);
        let mut raw = allocate();
        if raw.is_null() && released.is_none() {
            // The system is short: give it back what is cached, then try once more.
            released = Some(self.release_cached_for_retry());
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
        self.counters.hold(class_bytes as u64);
        self.counters
            .system_allocations
            .fetch_add(1, Ordering::Relaxed);
        self.trace(PoolEventKind::SystemAlloc, class_bytes as u64, class);
        Ok(Taken::new(record, class, zeroed))
    }

    /// Whether blocks of `class_bytes` come from the page layer (else from the heap).
    #[inline]
    pub(in crate::pool) fn paged(&self, class_bytes: usize) -> bool {
        self.config.os_pages && class_bytes >= PAGED_MIN_BLOCK
    }

    /// A block of `class_bytes` (zeroed if `zeroed`) from where blocks of that size come
    /// from, with the advice the configuration asks for; null if the system refuses.
    fn obtain_block(&self, class_bytes: usize, layout: Layout, zeroed: bool) -> *mut u8 {
        let config = &self.config;
        let advised = class_bytes >= config.advise_min_block;
        // Huge pages only without a budget: a huge page makes resident the bytes around a
        // block that the pool did not hand out, and the advice stays on the range after the
        // block goes back.
        let paged = self.paged(class_bytes);
        let huge_pages = config.huge_pages && !(paged && self.budget().is_some());
        let raw = if paged {
            let align = if huge_pages && advised {
                layout.align().max(PAGE)
            } else {
                PAGE
            };
            let room = || Room {
                budget: self.budget.load(Ordering::Relaxed),
                outside: self.counters.heap_held.load(Ordering::Relaxed),
            };
            self.pages
                .obtain(class_bytes, align, zeroed, room)
                .map_or(std::ptr::null_mut(), NonNull::as_ptr)
        } else {
            // SAFETY: `layout` has a non-zero size (every class is at least 8 bytes).
            let raw = unsafe {
                match (self.system_blocks, zeroed) {
                    (true, true) => system::alloc_zeroed(layout),
                    (true, false) => system::alloc(layout),
                    (false, true) => global::alloc_zeroed(layout),
                    (false, false) => global::alloc(layout),
                }
            };
            if !raw.is_null() {
                self.counters
                    .heap_held
                    .fetch_add(class_bytes as u64, Ordering::Relaxed);
            }
            raw
        };
        if !raw.is_null() && advised && (huge_pages || config.prefault) {
            advise::advise(raw, class_bytes, huge_pages, config.prefault);
        }
        raw
    }

    /// The layout of a block of `class_bytes`: the configured alignment, or 2 MiB for a block
    /// that gets transparent huge pages, so that huge pages can cover it end to end.
    pub(in crate::pool) fn layout(&self, class_bytes: usize) -> Layout {
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
    pub(in crate::pool) unsafe fn dealloc_block(&self, ptr: *mut u8, layout: Layout) {
        if self.paged(layout.size()) {
            let block = NonNull::new(ptr).expect("a block is never null");
            // SAFETY: the caller's contract: the page layer gave out this block of this size.
            unsafe { self.pages.give_back(block, layout.size()) };
            return;
        }
        self.counters
            .heap_held
            .fetch_sub(layout.size() as u64, Ordering::Relaxed);
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
    pub(in crate::pool) fn reserve(&self, bytes: u64) -> bool {
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
                // The peak moves once the system granted the block (`PoolCounters::hold`):
                // reads report `held`, which leaves this reservation out until then.
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    pub(in crate::pool) fn unreserve(&self, bytes: u64) {
        self.counters.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Returns a block's memory to the system and its record to the spare list.
    pub(in crate::pool) fn release_block(&self, record: u32, class: usize) {
        let class_bytes = class::class_size(class);
        let rec = self.blocks.record(record);
        // SAFETY: the caller owns the block (taken off a list or bin, or handed back), which
        // was allocated by `system_alloc` with this class's layout.
        unsafe { self.dealloc_block(rec.addr().as_ptr(), self.layout(class_bytes)) };
        rec.clear_block();
        self.blocks.retire(record);
        self.counters
            .held
            .fetch_sub(class_bytes as u64, Ordering::Relaxed);
        self.unreserve(class_bytes as u64);
        self.counters.system_frees.fetch_add(1, Ordering::Relaxed);
        self.trace(PoolEventKind::SystemFree, class_bytes as u64, class);
    }

    /// Where cached memory is, for an out-of-memory report.
    pub(in crate::pool) fn cache_snapshot(&self) -> CacheSnapshot {
        let mut in_threads = 0;
        self.for_each_cache(|cache| in_threads += cache.binned());
        let mut largest = 0;
        self.blocks.for_each(|record| {
            if let Some((class, false)) = record.picture() {
                largest = largest.max(class::class_size(class));
            }
        });
        let (in_use, _) = self.in_use_now();
        let reserved = self.counters.held.load(Ordering::Relaxed);
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
        let (reserved, peak_reserved) = self.counters.reserved_and_peak();
        OutOfMemory {
            requested,
            block_bytes,
            budget: self.budget(),
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

    /// The byte budget, if any.
    pub(in crate::pool) fn budget(&self) -> Option<u64> {
        Some(self.budget.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX)
    }
}

/// Where cached memory was before a release.
#[derive(Clone, Copy)]
pub(in crate::pool) struct CacheSnapshot {
    pub(in crate::pool) in_threads: u64,
    pub(in crate::pool) in_lists: u64,
    pub(in crate::pool) largest: usize,
}
