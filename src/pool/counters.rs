//! The counts of the pool's operations. Every thread cache has one [`OpCounters`], written by
//! its owner alone; the threads without a cache share one more, written with
//! read-modify-writes. `stats()`, `sum_in_use` and the close add them up through one
//! function, [`PoolInner::op_totals`](super::PoolInner::op_totals).

use crate::sync::{AtomicU64, Ordering};

/// The thread of operations made by a thread without a cache (it matches no cache; one less
/// than `u32::MAX`, so that a record's `holder`, the thread plus one, does not wrap).
pub(super) const CACHELESS: u32 = u32::MAX - 1;

/// Who writes an [`OpCounters`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Writers {
    /// Its owner alone, inside its operations (a thread cache's set): a load and a store.
    Owner,
    /// Any thread (the set of the threads without a cache): read-modify-writes.
    Shared,
}

/// What a thread (or the threads without a cache) counted of its allocations and frees.
///
/// Invariant: written as its [`Writers`] say (the owner's set by its owner alone, inside an
/// operation); read by any thread with relaxed loads, or with acquire loads by the close
/// once every writer is out.
#[derive(Default, Debug)]
pub(super) struct OpCounters {
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
pub(super) struct OpTotals {
    pub(super) misses: u64,
    pub(super) hits: u64,
    pub(super) allocated_bytes: u64,
    pub(super) allocated_requested: u64,
    pub(super) frees: u64,
    pub(super) freed_bytes: u64,
    pub(super) freed_requested: u64,
}

impl OpTotals {
    /// Blocks handed out.
    pub(super) fn allocations(&self) -> u64 {
        self.misses.wrapping_add(self.hits)
    }
}

/// Adds `delta` to a counter its owner alone writes: a load and a store, no read-modify-write.
#[inline(always)]
pub(super) fn bump(counter: &AtomicU64, delta: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(delta),
        Ordering::Relaxed,
    );
}

/// Adds `counter`'s value to `total`.
fn add_load(total: &mut u64, counter: &AtomicU64, order: Ordering) {
    *total = total.wrapping_add(counter.load(order));
}

impl OpCounters {
    /// Adds `delta` to `counter` as `writers` may.
    #[inline(always)]
    fn add(counter: &AtomicU64, delta: u64, writers: Writers) {
        match writers {
            Writers::Owner => bump(counter, delta),
            Writers::Shared => {
                counter.fetch_add(delta, Ordering::Relaxed);
            }
        }
    }

    /// Counts a block handed out (`hit`: from the thread's cache).
    #[inline(always)]
    pub(super) fn count_alloc(&self, hit: bool, class_bytes: usize, requested: usize, w: Writers) {
        Self::add(if hit { &self.hits } else { &self.misses }, 1, w);
        Self::add(&self.allocated_bytes, class_bytes as u64, w);
        Self::add(&self.allocated_requested, requested as u64, w);
    }

    /// Counts a block given back.
    #[inline(always)]
    pub(super) fn count_free(&self, class_bytes: usize, requested: usize, w: Writers) {
        Self::add(&self.frees, 1, w);
        Self::add(&self.freed_bytes, class_bytes as u64, w);
        Self::add(&self.freed_requested, requested as u64, w);
    }

    /// Counts a block's requested size changed from `old` to `new` bytes, as a free of `old`
    /// requested bytes and an allocation of `new` would, without counting a block.
    pub(super) fn count_resize(&self, old: usize, new: usize, w: Writers) {
        Self::add(&self.allocated_requested, new as u64, w);
        Self::add(&self.freed_requested, old as u64, w);
    }

    /// Adds this set's frees (blocks and bytes) to `totals`.
    pub(super) fn add_frees_to(&self, totals: &mut OpTotals, order: Ordering) {
        add_load(&mut totals.frees, &self.frees, order);
        add_load(&mut totals.freed_bytes, &self.freed_bytes, order);
        add_load(&mut totals.freed_requested, &self.freed_requested, order);
    }

    /// Adds this set's allocations (blocks and bytes) to `totals`; each counter is read once,
    /// so hits and misses add up to the allocations however the owner moves on meanwhile.
    pub(super) fn add_allocations_to(&self, totals: &mut OpTotals, order: Ordering) {
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
            set.count_alloc(true, 64, 50, w);
            set.count_alloc(false, 128, 100, w);
            set.count_free(64, 50, w);
            set.count_resize(100, 120, w);
        }
        let mut totals = OpTotals::default();
        for set in [&owner, &shared] {
            set.add_frees_to(&mut totals, Ordering::Relaxed);
            set.add_allocations_to(&mut totals, Ordering::Relaxed);
        }
        assert_eq!(
            totals,
            OpTotals {
                misses: 2,
                hits: 2,
                allocated_bytes: 384,
                allocated_requested: 540,
                frees: 2,
                freed_bytes: 128,
                freed_requested: 300,
            }
        );
        assert_eq!(totals.allocations(), 4);
    }
}
