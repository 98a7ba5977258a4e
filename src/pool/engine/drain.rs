//! Drains: cached blocks back to the system. Trim and the close take every cache and list;
//! the idle policy takes the lists of classes nobody drew on and the caches of idle
//! threads; budget pressure takes listed blocks only until a request fits, then everything.
//! A drain claims each thread cache through the owner/drainer handshake (`cache.rs`) and
//! walks every shard of the shared lists.
//!
//! What the pool reports across its parts (the statistics, the bytes in use now, the
//! out-of-memory report) is in `report.rs`.

use super::blocks::Record;
use super::cache::PoolThreadCache;
use super::inner::PoolInner;
use super::lists::LIST_SHARDS;
use super::report::CacheSnapshot;
use crate::pool::class;
use crate::pool::observe::trace::PoolEventKind;
use crate::sync::asymmetric;

impl PoolInner {
    /// Releases blocks from the shared lists, largest class first and one at a time, until
    /// the budget has room for `need` more bytes; whether it has. The first answer to a
    /// request the budget refuses: it takes no thread's cache (no fence) and leaves every
    /// block it does not need cached, so a budget the steps fill does not make each step
    /// give back and fault in again all it cached (a fitted run of the main job at 90% of
    /// its peak: about 1,200 minor faults a step when every cached block went back).
    pub(in crate::pool) fn release_listed_for(&self, need: u64) -> bool {
        if !self.memory.budgeted() {
            return false;
        }
        for class in (0..class::CLASSES).rev() {
            for shard in 0..LIST_SHARDS {
                loop {
                    if self.memory.has_room(need) {
                        return true;
                    }
                    match self.lists.pop_from(self.memory.records(), shard, class) {
                        // SAFETY: popped off its class's list: this thread's alone.
                        Some(record) => unsafe { self.release_block(record, class) },
                        None => break,
                    }
                }
            }
        }
        false
    }

    /// Releases every block on the lists of `class`, every shard's. Returns the bytes
    /// released.
    pub(in crate::pool) fn release_list(&self, class: usize) -> u64 {
        let blocks = self.lists.take_all(self.memory.records(), class, |record| {
            // SAFETY: taken off its class's list: this thread's alone.
            unsafe { self.release_block(record, class) };
        });
        blocks * class::class_size(class) as u64
    }

    /// Takes the cached blocks of every cache that caches any and that `pick` picks, whatever
    /// their owners are doing: claims each, issues one heavy fence (`fence`: false only for
    /// the close, which fenced and waited every owner out already), then takes each claimed
    /// cache's blocks and calls `each(class, record)` for them. Returns the bytes taken.
    /// `pick` sees every cache, empty ones included.
    pub(in crate::pool) fn drain_caches(
        &self,
        fence: bool,
        mut pick: impl FnMut(&PoolThreadCache) -> bool,
        mut each: impl FnMut(usize, &Record),
    ) -> u64 {
        let token = self.caches.drain_token();
        let mut claimed = false;
        self.caches.for_each(|cache| {
            claimed |= pick(cache) && cache.claim_if_holding(token);
        });
        if !claimed {
            return 0;
        }
        if fence {
            asymmetric::heavy();
        }
        let mut taken = 0;
        self.caches.for_each(|cache| {
            if cache.claimed_by(token) {
                taken += cache.take_claimed(&mut each);
            }
        });
        taken
    }

    /// Releases every cached block: every thread's cache (one heavy fence for all) and every
    /// list. Returns the bytes released.
    pub(in crate::pool) fn release_cached(&self) -> u64 {
        self.release_cached_fenced(true)
    }

    /// [`release_cached`](Self::release_cached), with the heavy fence only if `fence`.
    pub(in crate::pool) fn release_cached_fenced(&self, fence: bool) -> u64 {
        let released = self.drain_caches(
            fence,
            |_| true,
            // SAFETY: taken out of a claimed cache's bin: this thread's alone.
            |class, record| unsafe { self.release_block(record.index, class) },
        );
        (0..class::CLASSES)
            .map(|c| self.release_list(c))
            .sum::<u64>()
            + released
    }

    /// Releases every cached block to make room for an allocation; returns what was cached
    /// before, for the error report should the room still not suffice.
    pub(in crate::pool) fn release_cached_for_retry(&self) -> CacheSnapshot {
        let picture = self.cache_snapshot();
        self.release_cached();
        picture
    }

    pub(in crate::pool) fn trim_idle(&self) -> u64 {
        let round = self.lists.next_round();
        let idle_rounds = u64::from(self.config.idle_rounds);
        let mut released: u64 = (0..class::CLASSES)
            .filter(|&class| self.lists.idle(class, round, idle_rounds))
            .map(|class| self.release_list(class))
            .sum();
        // A thread's cache is idle once the thread made no operation during `idle_rounds`
        // rounds in a row (a heuristic: racing calls may count a round twice or not at all).
        // (At least one: a thread that worked since the last round is never idle.)
        let idle_rounds = self.config.idle_rounds.max(1);
        released += self.drain_caches(
            true,
            |cache| cache.idle_rounds() >= idle_rounds,
            // SAFETY: taken out of a claimed cache's bin: this thread's alone.
            |class, record| unsafe { self.release_block(record.index, class) },
        );
        self.books.trace(PoolEventKind::Trim, released, 0);
        released
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::pool::{BufferPool, PoolConfig};
    use crate::sync::asymmetric::heavy_fences_here;
    use crate::thread::on_a_high_index;

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
        // This thread uses the pool first, so that the switch from a sole writer to shared
        // counters (a heavy fence on the thread that makes it) happens now, on another
        // thread. When the threads below ran one by one on one thread index, this thread's
        // first use made the switch inside the count (in 2 of 60 runs of the suite).
        drop(tight.alloc(64 << 10).unwrap());
        std::thread::scope(|scope| {
            for _ in 0..15 {
                scope.spawn(|| drop(tight.alloc(64 << 10).unwrap()));
            }
        });
        let fences = heavy_fences_here();
        assert!(tight.alloc(1 << 20).is_ok(), "room made from the caches");
        assert_eq!(heavy_fences_here() - fences, 1);
    }
}
