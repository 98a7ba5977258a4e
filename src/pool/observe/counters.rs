//! The counts of a thread's operations. Every thread cache has one [`OpCounters`], written by
//! its owner alone; the threads without a cache share one more (in the pool's books),
//! written with read-modify-writes. The statistics, the bytes in use without exact counters
//! and the close add them up through one function, `ThreadCaches::op_totals`
//! (`engine/cache.rs`). The pool-wide counts (the slow paths', the exact bytes in use with
//! their peaks) are the books' (`books.rs`).

use crate::sync::{AtomicU64, Ordering};

/// The thread of operations made by a thread without a cache (it matches no cache; one less
/// than `u32::MAX`, so that a record's `holder`, the thread plus one, does not wrap).
pub(in crate::pool) const CACHELESS: u32 = u32::MAX - 1;

/// Who writes an [`OpCounters`], or the pool's exact counters (`LiveBytes`, in `books.rs`).
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
pub(super) fn add(counter: &AtomicU64, delta: u64, writers: Writers, order: Ordering) -> u64 {
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

/// A high-water mark that [`reset`](ResetPeak::reset) starts again, whose raises never carry
/// a value read before the latest reset: its word holds the reset's generation in its top
/// 16 bits and the mark in the low 48 (a mark past 256 TiB saturates there). A raise reads
/// the word first ([`since`](ResetPeak::since)), then the value it raises with, and lands
/// only in the generation it read: so a reader that loaded the bytes in use just before a
/// reset (the step's old high-water mark) cannot raise the new mark with them, which a plain
/// `fetch_max` did. A reader that read the word after a reset reads a value at or after the
/// reset's own (the reset reads the counter before it publishes its word, and a raise
/// acquires the word before it reads the counter). An allocation racing a reset may lose its
/// raise (a later read raises the mark again while the block lives); it never lands a value
/// of before the reset. A generation wraps after 65,536 resets; a raise stalled through all
/// of them could land.
#[derive(Debug, Default)]
pub(in crate::pool) struct ResetPeak(AtomicU64);

/// A [`ResetPeak`]'s word as a raise read it before reading its value.
#[derive(Debug, Clone, Copy)]
pub(in crate::pool) struct Since(u64);

/// The bits of a [`ResetPeak`]'s word below its generation: the mark.
const MARK: u64 = (1 << 48) - 1;

impl ResetPeak {
    /// The word a raise starts from: read it before the value to raise with.
    #[inline(always)]
    pub(in crate::pool) fn since(&self) -> Since {
        Since(self.0.load(Ordering::Acquire))
    }

    /// Raises the mark to `value` (read after `since`) unless a reset came between; the mark
    /// of `since`'s generation, or `Err` with the current mark when a reset came.
    #[inline(always)]
    pub(in crate::pool) fn raise(&self, since: Since, value: u64) -> Result<u64, u64> {
        // In steady state the mark holds the value already: one comparison, no write.
        if since.0 & MARK >= value {
            return Ok(since.0 & MARK);
        }
        self.raise_past(since, value)
    }

    /// [`raise`](Self::raise) where `since` holds less than `value`.
    #[inline(never)]
    fn raise_past(&self, since: Since, value: u64) -> Result<u64, u64> {
        let value = value.min(MARK);
        let mut seen = since.0;
        loop {
            if seen & !MARK != since.0 & !MARK {
                return Err(seen & MARK);
            }
            if seen & MARK >= value {
                return Ok(seen & MARK);
            }
            match self.0.compare_exchange_weak(
                seen,
                (seen & !MARK) | value,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(value),
                Err(actual) => seen = actual,
            }
        }
    }

    /// Starts the mark again from `current`'s value, in a new generation.
    pub(in crate::pool) fn reset(&self, current: &AtomicU64) {
        let mut seen = self.0.load(Ordering::Relaxed);
        loop {
            // Read before the word is published: a raise that acquires the word reads the
            // counter at or after this value.
            let start = current.load(Ordering::Relaxed).min(MARK);
            let generation = ((seen >> 48).wrapping_add(1) & 0xFFFF) << 48;
            match self.0.compare_exchange_weak(
                seen,
                generation | start,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => seen = actual,
            }
        }
    }

    /// Reads `current` and raises the mark to it, as a read that reports both does: the
    /// value and the mark, read again when a reset came between (a few times at most; then
    /// the value and the reset's mark, raised in its generation).
    pub(in crate::pool) fn read(&self, current: &AtomicU64) -> (u64, u64) {
        for _ in 0..4 {
            let since = self.since();
            let value = current.load(Ordering::Relaxed);
            if let Ok(mark) = self.raise(since, value) {
                return (value, mark);
            }
        }
        let since = self.since();
        let value = current.load(Ordering::Relaxed);
        (value, self.raise(since, value).unwrap_or_else(|mark| mark))
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

    #[test]
    fn a_reset_peak_lands_raises_of_its_own_generation_only() {
        let (peak, counter) = (ResetPeak::default(), AtomicU64::new(300));
        let stale = peak.since();
        assert_eq!(peak.raise(peak.since(), 300), Ok(300));
        counter.store(100, Ordering::Relaxed);
        peak.reset(&counter);
        assert_eq!(peak.raise(stale, 500), Err(100), "read before the reset");
        assert_eq!(peak.read(&counter), (100, 100));
        assert_eq!(peak.raise(peak.since(), 120), Ok(120));
        assert_eq!(peak.raise(peak.since(), 110), Ok(120));
        assert_eq!(peak.raise(peak.since(), u64::MAX), Ok(MARK), "saturates");
        // The generation wraps: 65,536 resets later a stale word matches again.
        counter.store(5, Ordering::Relaxed);
        peak.reset(&counter);
        let stale = peak.since();
        counter.store(100, Ordering::Relaxed);
        for _ in 0..(1 << 16) {
            peak.reset(&counter);
        }
        assert_eq!(peak.raise(stale, 7), Ok(100));
    }
}
