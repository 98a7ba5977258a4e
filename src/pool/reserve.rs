//! Memory from the system and back: blocks reserved within the byte budget, released by
//! trim, the idle policy, budget pressure and the close, and the out-of-memory report.

use std::alloc::Layout;
use std::ptr::NonNull;

use super::blocks::Record;
use super::cache::ThreadCache;
use super::inner::PoolInner;
use super::ops::Taken;
use super::{advise, class, OutOfMemory, PoolError, PoolEventKind};
use crate::stack::NIL;
use crate::sync::{asymmetric, global, system, Ordering};

impl PoolInner {
    /// A block new from the system, within the budget.
    #[cold]
    pub(super) fn system_alloc(
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
        let config = &self.config;
        if (config.huge_pages || config.prefault) && class_bytes >= config.advise_min_block {
            advise::advise(
                addr.as_ptr(),
                class_bytes,
                config.huge_pages,
                config.prefault,
            );
        }
        self.counters.hold(class_bytes as u64);
        self.counters
            .system_allocations
            .fetch_add(1, Ordering::Relaxed);
        self.trace(PoolEventKind::SystemAlloc, class_bytes as u64, class);
        Ok(Taken {
            record,
            addr,
            zeroed,
        })
    }

    /// The layout of a block of `class_bytes`: the configured alignment, or 2 MiB for a block
    /// that gets transparent huge pages, so that huge pages can cover it end to end.
    pub(super) fn layout(&self, class_bytes: usize) -> Layout {
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
    pub(super) unsafe fn dealloc_block(&self, ptr: *mut u8, layout: Layout) {
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
    pub(super) fn reserve(&self, bytes: u64) -> bool {
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

    pub(super) fn unreserve(&self, bytes: u64) {
        self.counters.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Returns a block's memory to the system and its record to the spare list.
    pub(super) fn release(&self, record: u32, class: usize) {
        let class_bytes = class::class_size(class);
        let rec = self.blocks.record(record);
        // SAFETY: the caller owns the block (taken off a list or bin, or handed back), which
        // was allocated by `system_alloc` with this class's layout.
        unsafe { self.dealloc_block(rec.addr().as_ptr(), self.layout(class_bytes)) };
        rec.clear_block();
        self.blocks.release(record);
        self.counters
            .held
            .fetch_sub(class_bytes as u64, Ordering::Relaxed);
        self.unreserve(class_bytes as u64);
        self.counters.system_frees.fetch_add(1, Ordering::Relaxed);
        self.trace(PoolEventKind::SystemFree, class_bytes as u64, class);
    }

    /// Releases blocks from the shared lists, largest class first and one at a time, until
    /// the budget has room for `need` more bytes; whether it has. The first answer to a
    /// request the budget refuses: it takes no thread's cache (no fence) and leaves every
    /// block it does not need cached, so a budget the steps fill does not make each step
    /// give back and fault in again all it cached (a fitted run of the main job at 90% of
    /// its peak: about 1,200 minor faults a step when every cached block went back).
    fn release_listed_for(&self, need: u64) -> bool {
        let Some(budget) = self.budget() else {
            return false;
        };
        for class in (0..class::CLASSES).rev() {
            for list in self.lists.iter().map(|shard| &shard[class]) {
                loop {
                    let reserved = self.counters.reserved.load(Ordering::Relaxed);
                    if reserved.saturating_add(need) <= budget {
                        return true;
                    }
                    match list.pop(|i| &self.blocks.record(i).next) {
                        Some(record) => self.release(record, class),
                        None => break,
                    }
                }
            }
        }
        false
    }

    /// Releases every block on the lists of `class`, every shard's. Returns the bytes
    /// released.
    pub(super) fn release_list(&self, class: usize) -> u64 {
        let mut released = 0;
        for shard in &self.lists {
            let mut link = shard[class].take_all();
            while link != NIL {
                let record = link - 1;
                link = self.blocks.record(record).next.load(Ordering::Relaxed);
                released += class::class_size(class) as u64;
                self.release(record, class);
            }
        }
        released
    }

    /// Calls `f` with every cache: one per thread index that used the pool (see
    /// `crate::roster`), whatever the indices.
    pub(super) fn for_each_cache(&self, f: impl FnMut(&ThreadCache)) {
        self.caches.iter().map(|cache| &**cache).for_each(f);
    }

    /// A token no other drain of this pool holds now (odd: never 0, the free flag, nor the
    /// owner's own drain).
    fn drain_token(&self) -> u32 {
        self.drain_tokens.fetch_add(2, Ordering::Relaxed) | 1
    }

    /// Takes the cached blocks of every cache that caches any and that `pick` picks, whatever
    /// their owners are doing: claims each, issues one heavy fence (`fence`: false only for
    /// the close, which fenced and waited every owner out already), then takes each claimed
    /// cache's blocks and calls `each(class, record)` for them. Returns the bytes taken.
    /// `pick` sees every cache, empty ones included.
    pub(super) fn drain_caches(
        &self,
        fence: bool,
        mut pick: impl FnMut(&ThreadCache) -> bool,
        mut each: impl FnMut(usize, &Record),
    ) -> u64 {
        let token = self.drain_token();
        let mut claimed = false;
        self.for_each_cache(|cache| {
            claimed |= pick(cache) && cache.claim_if_holding(token);
        });
        if !claimed {
            return 0;
        }
        if fence {
            asymmetric::heavy();
        }
        let mut taken = 0;
        self.for_each_cache(|cache| {
            if cache.claimed_by(token) {
                taken += cache.take_claimed(&mut each);
            }
        });
        taken
    }

    /// Releases every cached block: every thread's cache (one heavy fence for all) and every
    /// list. Returns the bytes released.
    pub(super) fn release_cached(&self) -> u64 {
        self.release_cached_fenced(true)
    }

    /// [`release_cached`](Self::release_cached), with the heavy fence only if `fence`.
    pub(super) fn release_cached_fenced(&self, fence: bool) -> u64 {
        let released = self.drain_caches(
            fence,
            |_| true,
            |class, record| self.release(record.index, class),
        );
        (0..class::CLASSES)
            .map(|c| self.release_list(c))
            .sum::<u64>()
            + released
    }

    /// Releases every cached block to make room for an allocation; returns what was cached
    /// before, for the error report should the room still not suffice.
    pub(super) fn release_cached_for_retry(&self) -> CacheSnapshot {
        let picture = self.cache_snapshot();
        self.release_cached();
        picture
    }

    /// Where cached memory is, for an out-of-memory report.
    pub(super) fn cache_snapshot(&self) -> CacheSnapshot {
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

    pub(super) fn out_of_memory(
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
        }
    }

    /// Records that an allocation drew on `class` in the current idle round. Stores only on
    /// a change, so a class in steady use keeps its line shared instead of bouncing it.
    pub(super) fn note_class_drawn(&self, class: usize) {
        let round = self.idle_round.load(Ordering::Relaxed);
        if self.last_drawn[class].load(Ordering::Relaxed) != round {
            self.last_drawn[class].store(round, Ordering::Relaxed);
        }
    }

    pub(super) fn trim_idle(&self) -> u64 {
        let round = self.idle_round.fetch_add(1, Ordering::Relaxed) + 1;
        let idle_rounds = u64::from(self.config.idle_rounds);
        let mut released: u64 = (0..class::CLASSES)
            .filter(|&class| {
                // Saturating: a racing call may have advanced the round already.
                round.saturating_sub(self.last_drawn[class].load(Ordering::Relaxed)) > idle_rounds
            })
            .map(|class| self.release_list(class))
            .sum();
        // A thread's cache is idle once the thread made no operation during `idle_rounds`
        // rounds in a row (a heuristic: racing calls may count a round twice or not at all).
        // (At least one: a thread that worked since the last round is never idle.)
        let idle_rounds = self.config.idle_rounds.max(1);
        released += self.drain_caches(
            true,
            |cache| {
                let operations = cache.operations();
                let seen = cache.seen_operations.swap(operations, Ordering::Relaxed);
                let idle = if seen == operations {
                    cache.idle_rounds.load(Ordering::Relaxed).saturating_add(1)
                } else {
                    0
                };
                cache.idle_rounds.store(idle, Ordering::Relaxed);
                idle >= idle_rounds
            },
            |class, record| self.release(record.index, class),
        );
        self.trace(PoolEventKind::Trim, released, 0);
        released
    }

    /// The byte budget, if any.
    pub(super) fn budget(&self) -> Option<u64> {
        Some(self.budget.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX)
    }
}

/// Where cached memory was before a release.
#[derive(Clone, Copy)]
pub(super) struct CacheSnapshot {
    pub(super) in_threads: u64,
    pub(super) in_lists: u64,
    pub(super) largest: usize,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::sync::asymmetric::heavy_fences_here;
    use crate::thread::on_a_high_index;
    use crate::{BufferPool, PoolConfig};

    #[test]
    #[cfg_attr(miri, ignore = "2,200 threads: too slow under Miri")]
    fn one_thread_with_a_high_index_costs_a_pool_little() {
        on_a_high_index(2_200, || {
            let pool = BufferPool::new();
            drop(pool.alloc(4096).unwrap()); // into this thread's cache
            assert!(
                pool.thread_state_bytes() <= 64 << 10,
                "{} bytes of per-thread state for one thread",
                pool.thread_state_bytes()
            );
            let fences = heavy_fences_here();
            assert_eq!(pool.trim(), 4096);
            assert_eq!(heavy_fences_here() - fences, 1, "one fence per trim");
            drop(pool.alloc(4096).unwrap());
            let fences = heavy_fences_here();
            drop(pool); // the close: one fence, for `closed`
            assert_eq!(heavy_fences_here() - fences, 1, "one fence per close");
        });
    }

    #[test]
    fn a_trim_fences_once_whatever_the_threads_that_used_the_pool() {
        let pool = BufferPool::new();
        std::thread::scope(|scope| {
            for _ in 0..64 {
                scope.spawn(|| drop(pool.alloc(4096).unwrap())); // each caches a block
            }
        });
        std::thread::scope(|scope| {
            for _ in 0..64 {
                scope.spawn(|| drop(pool.alloc(1 << 20).unwrap())); // and these another
            }
        });
        let fences = heavy_fences_here();
        assert!(pool.trim() >= 4096);
        assert_eq!(heavy_fences_here() - fences, 1);
        // Nothing cached: nothing to take, no fence at all.
        let fences = heavy_fences_here();
        assert_eq!(pool.trim(), 0);
        assert_eq!(heavy_fences_here() - fences, 0);
        // A budget miss fences once too.
        let tight = BufferPool::with_config(PoolConfig {
            budget: Some(1 << 20),
            ..PoolConfig::default()
        })
        .unwrap();
        std::thread::scope(|scope| {
            for _ in 0..16 {
                scope.spawn(|| drop(tight.alloc(64 << 10).unwrap()));
            }
        });
        let fences = heavy_fences_here();
        assert!(tight.alloc(1 << 20).is_ok(), "room made from the caches");
        assert_eq!(heavy_fences_here() - fences, 1);
    }
}
