//! The pool's counters. Every thread cache has one [`OpCounters`] of its operations, written
//! by its owner alone; the threads without a cache share one more, written with
//! read-modify-writes. The statistics, the bytes in use without exact counters and the
//! close add them up through one function, `ThreadCaches::op_totals` (`engine/cache.rs`).
//! The pool-wide
//! [`PoolCounters`] hold the slow paths' counts and the exact bytes in use with their peaks.

use crossbeam_utils::CachePadded;

use super::super::PoolConfig;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The thread of operations made by a thread without a cache (it matches no cache; one less
/// than `u32::MAX`, so that a record's `holder`, the thread plus one, does not wrap).
pub(in crate::pool) const CACHELESS: u32 = u32::MAX - 1;

/// Who writes an [`OpCounters`], or the pool's exact counters ([`LiveBytes`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::pool) enum Writers {
    /// Its owner alone, inside its operations (a thread cache's set): a load and a store.
    Owner,
    /// Any thread (the set of the threads without a cache): read-modify-writes.
    Shared,
}

/// What a thread (or the threads without a cache) counted of its allocations and frees.
///
/// Invariant: written as its [`Writers`] say (the owner's set by its owner alone, inside an
/// operation), the frees with release stores; read by any thread, the frees with acquire
/// loads. So a read that counts a free also sees the allocation of that block, on whatever
/// thread it was counted (the block reached the freeing thread after its allocation was
/// counted): no sum counts more frees than allocations.
#[derive(Default, Debug)]
pub(in crate::pool) struct OpCounters {
    /// Blocks handed out from the shared lists or the system (the rest came from the thread's
    /// cache: `allocations = misses + hits`).
    misses: AtomicU64,
    /// Blocks handed out from the thread's cache.
    hits: AtomicU64,
    /// Bytes (class sizes) and requested bytes of the blocks handed out.
    allocated_bytes: AtomicU64,
    allocated_requested: AtomicU64,
    /// Blocks given back (whoever allocated them), and their bytes.
    frees: AtomicU64,
    freed_bytes: AtomicU64,
    freed_requested: AtomicU64,
}

/// [`OpCounters`] added up.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(in crate::pool) struct OpTotals {
    pub(in crate::pool) misses: u64,
    pub(in crate::pool) hits: u64,
    pub(in crate::pool) allocated_bytes: u64,
    pub(in crate::pool) allocated_requested: u64,
    pub(in crate::pool) frees: u64,
    pub(in crate::pool) freed_bytes: u64,
    pub(in crate::pool) freed_requested: u64,
}

impl OpTotals {
    /// Blocks handed out.
    pub(in crate::pool) fn allocations(&self) -> u64 {
        self.misses.wrapping_add(self.hits)
    }
}

/// Adds `delta` to a counter its owner alone writes: a load and a store, no read-modify-write.
#[inline(always)]
pub(in crate::pool) fn bump(counter: &AtomicU64, delta: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(delta),
        Ordering::Relaxed,
    );
}

/// Adds `counter`'s value to `total`.
fn add_load(total: &mut u64, counter: &AtomicU64, order: Ordering) {
    *total = total.wrapping_add(counter.load(order));
}

/// Adds `delta` (wrapping: a negative one as its two's complement) to `counter` as
/// `writers` may, the write with `order`; returns the sum.
#[inline(always)]
fn add(counter: &AtomicU64, delta: u64, writers: Writers, order: Ordering) -> u64 {
    match writers {
        Writers::Owner => {
            let sum = counter.load(Ordering::Relaxed).wrapping_add(delta);
            counter.store(sum, order);
            sum
        }
        Writers::Shared => counter.fetch_add(delta, order).wrapping_add(delta),
    }
}

impl OpCounters {
    /// Counts a block handed out (`hit`: from the thread's cache).
    #[inline(always)]
    pub(in crate::pool) fn count_alloc(
        &self,
        hit: bool,
        class_bytes: usize,
        requested: usize,
        w: Writers,
    ) {
        let relaxed = Ordering::Relaxed;
        add(if hit { &self.hits } else { &self.misses }, 1, w, relaxed);
        add(&self.allocated_bytes, class_bytes as u64, w, relaxed);
        add(&self.allocated_requested, requested as u64, w, relaxed);
    }

    /// Counts a block given back: release stores (see the invariant; on x86 the same plain
    /// stores as relaxed ones).
    #[inline(always)]
    pub(in crate::pool) fn count_free(&self, class_bytes: usize, requested: usize, w: Writers) {
        let release = Ordering::Release;
        add(&self.frees, 1, w, release);
        add(&self.freed_bytes, class_bytes as u64, w, release);
        add(&self.freed_requested, requested as u64, w, release);
    }

    /// Counts a block's requested size changed from `old` to `new` bytes, as a free of `old`
    /// requested bytes and an allocation of `new` would, without counting a block.
    pub(in crate::pool) fn count_resize(&self, old: usize, new: usize, w: Writers) {
        add(&self.allocated_requested, new as u64, w, Ordering::Relaxed);
        add(&self.freed_requested, old as u64, w, Ordering::Release);
    }

    /// Adds this set's frees (blocks and bytes) to `totals`, with acquire loads (see the
    /// invariant).
    pub(in crate::pool) fn add_frees_to(&self, totals: &mut OpTotals) {
        let acquire = Ordering::Acquire;
        add_load(&mut totals.frees, &self.frees, acquire);
        add_load(&mut totals.freed_bytes, &self.freed_bytes, acquire);
        add_load(&mut totals.freed_requested, &self.freed_requested, acquire);
    }

    /// Adds this set's allocations (blocks and bytes) to `totals`; each counter is read once,
    /// so hits and misses add up to the allocations however the owner moves on meanwhile.
    pub(in crate::pool) fn add_allocations_to(&self, totals: &mut OpTotals, order: Ordering) {
        add_load(&mut totals.misses, &self.misses, order);
        add_load(&mut totals.hits, &self.hits, order);
        add_load(&mut totals.allocated_bytes, &self.allocated_bytes, order);
        add_load(
            &mut totals.allocated_requested,
            &self.allocated_requested,
            order,
        );
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn owner_and_shared_sets_count_alike_and_add_up() {
        let (owner, shared) = (OpCounters::default(), OpCounters::default());
        for (set, w) in [(&owner, Writers::Owner), (&shared, Writers::Shared)] {
            for _ in 0..3 {
                set.count_alloc(true, 64, 50, w); // hits: 3 per set
            }
            set.count_alloc(false, 128, 100, w); // a miss
            set.count_free(64, 50, w);
            set.count_resize(100, 120, w);
        }
        let mut totals = OpTotals::default();
        for set in [&owner, &shared] {
            set.add_frees_to(&mut totals);
            set.add_allocations_to(&mut totals, Ordering::Relaxed);
        }
        assert_eq!(
            totals,
            OpTotals {
                misses: 2,
                hits: 6,
                allocated_bytes: 640,
                allocated_requested: 740,
                frees: 2,
                freed_bytes: 128,
                freed_requested: 300,
            }
        );
        assert_eq!(totals.allocations(), 8);
    }
}

/// Pool-wide counters: those of the slow paths (read-modify-writes are fine there), and the
/// exact bytes in use with their peaks. (What the pool holds from the system, and its peak,
/// are the memory's books: `engine/memory.rs`.)
#[derive(Default, Debug)]
pub(in crate::pool) struct PoolCounters {
    /// The bytes in use (with `exact_peaks`) and requested (with `exact_requested`), on a
    /// cache line of their own: the hot path writes them.
    pub(in crate::pool) live: CachePadded<LiveBytes>,
    pub(in crate::pool) trims: AtomicU64,
    pub(in crate::pool) retries: AtomicU64,
    pub(in crate::pool) budget_failures: AtomicU64,
}

/// `LiveBytes::solo` before any thread counted in the exact counters.
pub(in crate::pool) const SOLO_NONE: u32 = 0;
/// `LiveBytes::solo` while a second thread waits out the sole writer's operation.
pub(in crate::pool) const SOLO_SWITCHING: u32 = u32::MAX - 1;
/// `LiveBytes::solo` once more than one thread may write the exact counters: for good.
pub(in crate::pool) const SOLO_SHARED: u32 = u32::MAX;

/// The value of `LiveBytes::solo` that makes `thread` the sole writer, if its index allows.
#[inline(always)]
pub(in crate::pool) fn solo_value(thread: u32) -> Option<u32> {
    thread
        .checked_add(1)
        .filter(|&value| value < SOLO_SWITCHING)
}

/// The exact counters of `exact_peaks` and `exact_requested`.
#[derive(Default, Debug)]
pub(in crate::pool) struct LiveBytes {
    /// Bytes (class sizes) of the blocks handed out: every allocation adds, every free
    /// subtracts, so each value it takes is the true figure at that instant.
    ///
    /// Invariant: while `solo` names a thread index, only the thread holding that index
    /// writes it (and `requested`), inside an operation of its cache, with a load and a
    /// store (a thread that takes the index after its holder exited takes the role too: the
    /// index's hand-over orders their accesses); otherwise every writer
    /// uses one read-modify-write per change. A thread that finds another one named there
    /// moves `solo` to [`SOLO_SWITCHING`], fences heavily, waits out the named thread's
    /// operation in flight and only then stores [`SOLO_SHARED`]; the named index's thread checks
    /// `solo` inside each operation, after the operation's light fence, so it either sees
    /// the switch or is waited out (the handshake of `crate::handshake`).
    pub(in crate::pool) in_use: AtomicU64,
    /// Requested bytes of the blocks handed out (same rule).
    pub(in crate::pool) requested: AtomicU64,
    /// Who may write `in_use` and `requested`: [`SOLO_NONE`] (nobody yet), a thread index
    /// plus one (that thread alone, with loads and stores: a pool one thread uses pays no
    /// locked instruction for its exact counts), [`SOLO_SWITCHING`], or [`SOLO_SHARED`].
    /// Moves only forward (none, a thread, switching, shared) by compare-exchange, and to
    /// shared by a `Release` store after the wait; a thread joins (see
    /// `PoolInner::join_exact_counters`) before it first counts.
    ///
    /// On a cache line of its own: every operation reads it, and only a joining thread
    /// writes it. On the counters' line, its load fetched a line the other thread had just
    /// written for reading, and the add then had to take it again for writing.
    pub(in crate::pool) solo: CachePadded<AtomicU32>,
    /// Invariant: the largest value `in_use` took since the last reset, as far as its
    /// movers and readers raised it (an allocation raises it with the value its add gave, a
    /// read with the value it reports); never a value `in_use` did not take.
    pub(in crate::pool) peak_in_use: AtomicU64,
    /// The same for `requested`.
    pub(in crate::pool) peak_requested: AtomicU64,
}

impl PoolCounters {
    /// How the calling thread, `thread` (with a cache, inside one of its operations),
    /// writes the exact counters `config` keeps: alone with loads and stores when it is
    /// their sole writer, else with read-modify-writes. (Without exact counters the answer
    /// is never used, and nothing is loaded.)
    #[inline(always)]
    pub(in crate::pool) fn exact_writers(&self, config: &PoolConfig, thread: u32) -> Writers {
        if config.exact_counters()
            && solo_value(thread) == Some(self.live.solo.load(Ordering::Relaxed))
        {
            Writers::Owner
        } else {
            Writers::Shared
        }
    }

    /// Counts an allocation of `bytes` (`requested`) in the exact counters `config` keeps,
    /// written as `writers` says ([`exact_writers`](Self::exact_writers)).
    #[inline]
    pub(in crate::pool) fn exact_alloc(
        &self,
        config: &PoolConfig,
        bytes: u64,
        requested: u64,
        writers: Writers,
    ) {
        // Wrapping: inside a pool operation nothing may panic (a panic there would leave
        // the thread's cache busy for good); the counts never exceed the bytes held.
        let live = &self.live;
        if config.exact_peaks {
            raise(
                &live.peak_in_use,
                add(&live.in_use, bytes, writers, Ordering::Relaxed),
            );
        }
        if config.exact_requested {
            raise(
                &live.peak_requested,
                add(&live.requested, requested, writers, Ordering::Relaxed),
            );
        }
    }

    /// Counts a free in the exact counters `config` keeps.
    #[inline]
    pub(in crate::pool) fn exact_free(
        &self,
        config: &PoolConfig,
        bytes: u64,
        requested: u64,
        writers: Writers,
    ) {
        if config.exact_peaks {
            add(
                &self.live.in_use,
                bytes.wrapping_neg(),
                writers,
                Ordering::Relaxed,
            );
        }
        if config.exact_requested {
            add(
                &self.live.requested,
                requested.wrapping_neg(),
                writers,
                Ordering::Relaxed,
            );
        }
    }

    /// Moves the requested bytes of a block handed out from `old` to `new` (an in-place
    /// reallocation), in the exact counter of requested bytes if `config` keeps it.
    #[inline]
    pub(in crate::pool) fn exact_resize(
        &self,
        config: &PoolConfig,
        old: u64,
        new: u64,
        writers: Writers,
    ) {
        if !config.exact_requested {
            return;
        }
        let requested = add(
            &self.live.requested,
            new.wrapping_sub(old),
            writers,
            Ordering::Relaxed,
        );
        if new >= old {
            raise(&self.live.peak_requested, requested);
        }
    }

    /// Starts the peaks again from the current values. A concurrent allocation may raise a
    /// peak just before the store, and lose that raise: the peak then starts from the value
    /// the reset read, and the next allocation or read raises it again.
    pub(in crate::pool) fn reset_peaks(&self, config: &PoolConfig) {
        let restart = |peak: &AtomicU64, current: &AtomicU64| {
            peak.store(current.load(Ordering::Relaxed), Ordering::Relaxed);
            raise(peak, current.load(Ordering::Relaxed));
        };
        if config.exact_peaks {
            restart(&self.live.peak_in_use, &self.live.in_use);
        }
        if config.exact_requested {
            restart(&self.live.peak_requested, &self.live.requested);
        }
    }
}

/// Raises a high-water mark to `value` (a load first: in steady state no write at all).
#[inline]
pub(in crate::pool) fn raise(peak: &AtomicU64, value: u64) -> u64 {
    let seen = peak.load(Ordering::Relaxed);
    if value > seen {
        peak.fetch_max(value, Ordering::Relaxed).max(value)
    } else {
        seen
    }
}
