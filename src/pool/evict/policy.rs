//! Evictable blocks: buffers whose owner lets the pool take them back when its budget refuses
//! a request, and which the owner rebuilds when it next needs them (see
//! [`RetainedValue::evictable`](crate::RetainedValue::evictable), which builds on this).
//!
//! The pool keeps a registry of them. When an allocation through a handle
//! ([`BufferPool::alloc`](super::super::BufferPool::alloc) and friends, never the global
//! allocator's front end) is refused by the budget, the allocation entry in `engine/inner.rs` calls
//! this file's one hook, `make_room`, and retries. `make_room` first takes Coop's step for a
//! request of 256 KiB or more (which the page layer serves): it evicts the cheapest *window*, a run
//! of values whose blocks, with the free pages beside and between them, make one free range the
//! request fits in, so that it takes those pages rather than new ones (see `evict_window` for when
//! it does not). Then, until the budget has room, it evicts one value at a time, the one with the
//! lowest score among those no reader pins: first among the values whose block is of the class the
//! request needs (the freed block serves it directly, so what the pool reserves stays what is
//! live), then among all. The score is Dynamic Tensor Rematerialization's: the cost of recomputing
//! the value, evicted inputs included, over its bytes times its staleness (pool clock ticks since
//! its last pin).
//!
//! Each value's state is a small lock (`Mutex` and `Condvar`), taken by readers, the
//! recomputing thread and the evicting thread, never while allocating or running user code,
//! so no lock is held across a recursive request. The allocation fast path is untouched:
//! eviction starts only once the budget has refused a request.

use super::super::inner::PoolInner;
use super::super::pages::Beside;
use super::super::{OutOfMemory, PoolBuffer, PoolError, PoolEventKind};
use super::value::{Evictable, Evictor, Held, Residence};
use crate::sync::{Arc, Ordering};
use crate::thread;

impl Evictor {
    /// Registers a resident value of `buffer`'s block, recomputed at `cost` from `parents`.
    pub(in crate::pool) fn register_evictable(
        &self,
        buffer: PoolBuffer,
        cost: u64,
        parents: Box<[Arc<Evictable>]>,
    ) -> Arc<Evictable> {
        // The registry's own tables are bookkeeping: never from this pool (or any pool
        // behind the global allocator).
        let _scope = thread::Bookkeeping::open();
        let mut registry = self.lock();
        let slot = match registry.vacant.pop() {
            Some(slot) => slot,
            None => {
                registry.slots.push(None);
                registry.slots.len() - 1
            }
        };
        let value = Arc::new(Evictable::new(slot, buffer, cost, parents, self.tick()));
        registry.slots[slot] = Some(Arc::clone(&value));
        self.registered.fetch_add(1, Ordering::Relaxed);
        value
    }

    /// Takes a value out of the registry (its owner is dropping it); its block goes back to
    /// the pool when the last reference drops.
    pub(in crate::pool) fn unregister_evictable(&self, value: &Evictable) {
        let entry = {
            let _scope = thread::Bookkeeping::open();
            let mut registry = self.lock();
            // Only this value's own entry (its slot is fixed at registration, and vacant
            // slots are reused).
            let entry = registry
                .slots
                .get_mut(value.slot)
                .filter(|entry| {
                    entry
                        .as_deref()
                        .is_some_and(|held| std::ptr::eq(held, value))
                })
                .and_then(Option::take);
            if entry.is_some() {
                registry.vacant.push(value.slot);
                self.registered.fetch_sub(1, Ordering::Relaxed);
            }
            entry
        };
        drop(entry); // outside the lock: it may be the last reference, and free the block
    }

    /// Evicts the value of `value` now if it is resident and unpinned; whether it did.
    pub(in crate::pool) fn evict_now(&self, pool: &PoolInner, value: &Evictable) -> bool {
        let taken = value.take(&mut value.lock());
        self.evicted(pool, taken)
    }

    /// Counts an eviction and gives its block back (no lock held).
    fn evicted(&self, pool: &PoolInner, taken: Option<PoolBuffer>) -> bool {
        let Some(buffer) = taken else {
            return false;
        };
        let (bytes, class) = (buffer.capacity() as u64, buffer.class());
        drop(buffer);
        self.evictions.fetch_add(1, Ordering::Relaxed);
        self.evicted_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(count) = self.evicted_by_class.get(class) {
            count.add(1);
        }
        pool.books.trace(PoolEventKind::Evict, bytes, class);
        true
    }

    /// Counts a recompute of `bytes` that took `ns` nanoseconds.
    pub(in crate::pool) fn count_recompute(&self, bytes: u64, ns: u64) {
        self.recomputations.fetch_add(1, Ordering::Relaxed);
        self.recomputed_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.recompute_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Evicts the unpinned resident value with the lowest score, preferring blocks of
    /// `class`; the bytes and class of the block given back, or `None` if no value could be
    /// evicted. The look waits for each value's lock; a value that a reader pins between the
    /// choice and the take makes it look again, a bounded number of times.
    fn evict_one(&self, pool: &PoolInner, class: usize) -> Option<(u64, usize)> {
        const LOOKS: usize = 64;
        for _ in 0..LOOKS {
            match self.try_evict_one(pool, class) {
                Looked::Evicted(freed) => return Some(freed),
                Looked::Nothing => return None,
                Looked::Busy => crate::sync::yield_now(),
            }
        }
        None
    }

    /// One look at the registry for [`evict_one`](Self::evict_one).
    fn try_evict_one(&self, pool: &PoolInner, class: usize) -> Looked {
        let buffer = {
            let registry = self.lock();
            let now = self.clock.load(Ordering::Relaxed);
            // (score, same class, value): the lowest score among the values of `class`, or
            // among all if none of `class` can go.
            let mut best: Option<(f64, bool, &Arc<Evictable>)> = None;
            for value in registry.slots.iter().flatten() {
                // Waits for the value's lock: it is held only for a few instructions (a pin,
                // an unpin, a query, the start or end of a recompute; never across user code
                // or an allocation), and no thread that holds it takes the registry's lock,
                // so the wait is short and cannot deadlock. Skipping a value whose lock was
                // busy made a refusal depend on another thread's timing: a thread querying
                // `is_resident` in a loop, preempted with the lock held, made 5 of every
                // 81-218 requests fail.
                let state = value.lock();
                if state.phase != Residence::Resident || state.readers > 0 {
                    continue;
                }
                drop(state);
                let (cost, stale) = value.cost_and_staleness(now);
                let score = cost / (value.bytes() as f64 * stale);
                let same = value.class() == class;
                let better = match best {
                    None => true,
                    Some((s, best_same, _)) => (same, -score) > (best_same, -s),
                };
                if better {
                    best = Some((score, same, value));
                }
            }
            let Some((_, _, value)) = best else {
                return Looked::Nothing;
            };
            let taken = value.take(&mut value.lock());
            // Pinned since it was chosen: look again.
            let Some(buffer) = taken else {
                return Looked::Busy;
            };
            buffer
        };
        let freed = (buffer.capacity() as u64, buffer.class());
        self.evicted(pool, Some(buffer));
        Looked::Evicted(freed)
    }

    /// Coop's step, before DTR's, for a request of `need` bytes (of `class`) that the page
    /// layer serves and merges on free (256 KiB and more, under a budget) and for which the
    /// budget lacks `short` bytes: evicts the cheapest *window*, a run of values whose
    /// blocks, with the free pages beside and between them, make one free range of at
    /// least `need` bytes, so that the request takes those pages rather than mapping or
    /// faulting in others while the budget purges the freed ones. Only values whose blocks
    /// go straight back to the page layer when evicted count (`PoolInner::freed_to_pages`:
    /// not the classes the thread caches keep, by default those up to 1 MiB), and a window
    /// evicts at most `max(need, short)` bytes (a window is never a large value evicted
    /// for a small request). A window weighs the sum of its values' recompute costs, each
    /// over its staleness (DTR's score without the bytes, which the bound caps); the
    /// lightest wins, then the shortest.
    ///
    /// Nothing is evicted when the budget lacks nothing, when an unpinned value of the
    /// request's own class is resident (its block serves the request directly: DTR's
    /// same-class step), when a free range already holds `need` resident pages in a run,
    /// or when no window exists; nor when a window's value was pinned, evicted or moved
    /// since the look: the window is taken whole or not at all. Returns the bytes evicted.
    fn evict_window(&self, pool: &PoolInner, class: usize, need: usize, short: u64) -> u64 {
        if short == 0 || !pool.merges_on_free(need) || pool.memory.pages.has_dirty_run(need) {
            return 0;
        }
        let cap = u64::try_from(need).unwrap_or(u64::MAX).max(short);
        let registry = self.lock();
        let now = self.clock.load(Ordering::Relaxed);
        // (block, weight, value) of each value the window may take, by address.
        let mut found: Vec<(Beside, f64, &Arc<Evictable>)> = Vec::new();
        for value in registry.slots.iter().flatten() {
            let state = value.lock();
            let Some(start) = value.block_start(&state).filter(|_| state.readers == 0) else {
                continue;
            };
            let (value_class, bytes) = (value.class(), value.bytes());
            drop(state);
            if value_class == class {
                return 0;
            }
            if !pool.freed_to_pages(value_class) {
                continue;
            }
            let (cost, stale) = value.cost_and_staleness(now);
            let block = Beside {
                start,
                len: usize::try_from(bytes).unwrap_or(usize::MAX),
                ..Beside::default()
            };
            found.push((block, cost / stale, value));
        }
        found.sort_by_key(|(block, ..)| block.start);
        let mut blocks: Vec<Beside> = found.iter().map(|(block, ..)| *block).collect();
        pool.memory.pages.free_beside(&mut blocks);
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let Some((first, last)) = lightest_window(&blocks, |i| found[i].1, need, cap) else {
            return 0;
        };
        // Whole or not at all: every value of the window still resident, unpinned and at
        // the address looked at. (Several value locks at once: no other thread holds one
        // value's lock while it takes another's, so this cannot deadlock.)
        let window = &found[first..=last];
        let mut states: Vec<_> = window.iter().map(|(_, _, value)| value.lock()).collect();
        let unchanged = window
            .iter()
            .zip(&states)
            .all(|((block, _, value), state)| {
                state.readers == 0 && value.block_start(state) == Some(block.start)
            });
        if !unchanged {
            return 0;
        }
        let taken: Vec<PoolBuffer> = window
            .iter()
            .zip(&mut states)
            .filter_map(|((_, _, value), state)| value.take(state))
            .collect();
        drop(states);
        drop(registry);
        let mut freed = 0u64;
        for buffer in taken {
            freed = freed.saturating_add(buffer.capacity() as u64);
            if self.evicted(pool, Some(buffer)) {
                self.window_evictions.add(1);
            }
        }
        freed
    }

    /// What the registered values hold: pinned bytes, and unpinned resident bytes.
    pub(in crate::pool) fn evictables_held(&self) -> Held {
        let mut held = Held::default();
        if self.registered.load(Ordering::Relaxed) == 0 {
            return held;
        }
        let registry = self.lock();
        for value in registry.slots.iter().flatten() {
            let state = value.lock();
            match (state.phase, state.readers) {
                (Residence::Resident, 0) => held.evictable += value.bytes(),
                (Residence::Resident, _) => held.pinned += value.bytes(),
                _ => {}
            }
        }
        held
    }

    /// The eviction's hook in the allocation path (see `engine/inner.rs`): a request of
    /// `class` that the budget refused with `report`, from a door that evicts. Evicts values
    /// until the request may fit: what the budget lacked, unless a block of the class itself
    /// comes back (it serves the request directly). Whether the request should try again:
    /// false once no value is left to evict, and at once (`first`) for a request that would
    /// not fit with every unpinned value evicted, which evicts none: what no eviction can
    /// free (plain buffers, pinned values) plus the request must fit.
    pub(in crate::pool) fn make_room(
        &self,
        pool: &PoolInner,
        class: usize,
        report: &OutOfMemory,
        first: bool,
    ) -> bool {
        // Whatever the eviction allocates (the search's short list) goes to the global
        // front end's fallback, if that front end is ferropool's: never back into this pool
        // while this thread holds the registry's lock.
        let _scope = thread::Bookkeeping::open();
        let block_bytes = report.block_bytes as u64;
        if first {
            if self.registered.load(Ordering::Relaxed) == 0 {
                return false;
            }
            let evictable = self.evictables_held().evictable;
            if self.short_with_every_eviction(pool, block_bytes, report.budget, evictable) > 0 {
                return false;
            }
        }
        let short = report
            .reserved
            .saturating_add(block_bytes)
            .saturating_sub(report.budget.unwrap_or(u64::MAX));
        let mut freed = self.evict_window(pool, class, report.block_bytes, short);
        if freed > 0 && freed >= short {
            return true;
        }
        while let Some((bytes, evicted_class)) = self.evict_one(pool, class) {
            freed = freed.saturating_add(bytes);
            if evicted_class == class || freed >= short {
                return true;
            }
        }
        false
    }

    /// The error of a request the budget refused with `report` and no eviction served: the
    /// report says what the evictable values still hold.
    pub(in crate::pool) fn refused(
        &self,
        pool: &PoolInner,
        mut report: Box<OutOfMemory>,
    ) -> PoolError {
        let held = self.evictables_held();
        report.evictable_pinned = held.pinned;
        report.evictable_unpinned = held.evictable;
        report.short_with_every_eviction = self.short_with_every_eviction(
            pool,
            report.block_bytes as u64,
            report.budget,
            held.evictable,
        );
        PoolError::BudgetExceeded(report)
    }

    /// The bytes a request of `block_bytes` lacks under `budget` even were every unpinned
    /// evictable value (`evictable` bytes, from [`evictables_held`](Self::evictables_held))
    /// evicted; 0: evicting would make room. The bytes in use that no eviction can free,
    /// plain buffers and pinned values, plus the request.
    fn short_with_every_eviction(
        &self,
        pool: &PoolInner,
        block_bytes: u64,
        budget: Option<u64>,
        evictable: u64,
    ) -> u64 {
        let (in_use, _) = pool.in_use_now();
        in_use
            .saturating_sub(evictable)
            .saturating_add(block_bytes)
            .saturating_sub(budget.unwrap_or(u64::MAX))
    }
}

/// The lightest window over `blocks` (sorted by address, with the free bytes beside each
/// filled in): a run `first..=last` of blocks each of which reaches the next (its free
/// bytes after end where the next starts, in one segment), whose span (the free bytes
/// before the first, the run, the free bytes after the last) holds `need` bytes and whose
/// blocks hold at most `cap` bytes, with the least sum of `weight(i)`, then the shortest
/// span. `None` if no such run exists.
///
/// Linear: only the shortest spanning run from each first block can win (a longer one
/// weighs and holds more), and it ends no earlier than the previous first block's (a run
/// spans less from a later first block), so `last` only moves forward.
fn lightest_window(
    blocks: &[Beside],
    weight: impl Fn(usize) -> f64,
    need: usize,
    cap: usize,
) -> Option<(usize, usize)> {
    // Sums over `first..=last` as differences of prefix sums.
    let mut weights = vec![0.0];
    let mut lens = vec![0usize];
    for (i, block) in blocks.iter().enumerate() {
        weights.push(weights[i] + weight(i));
        lens.push(lens[i].saturating_add(block.len));
    }
    let span = |first: usize, last: usize| {
        let run = (blocks[last].start + blocks[last].len).saturating_sub(blocks[first].start);
        blocks[first]
            .before
            .saturating_add(run)
            .saturating_add(blocks[last].after)
    };
    let mut best: Option<(f64, usize, usize, usize)> = None;
    let mut last = 0;
    for first in 0..blocks.len() {
        last = last.max(first);
        while span(first, last) < need
            && last + 1 < blocks.len()
            && blocks[last].reaches(&blocks[last + 1])
        {
            last += 1;
        }
        let (sum, held, spanned) = (
            weights[last + 1] - weights[first],
            lens[last + 1] - lens[first],
            span(first, last),
        );
        if spanned >= need && held <= cap && best.is_none_or(|(w, s, ..)| (sum, spanned) < (w, s)) {
            best = Some((sum, spanned, first, last));
        }
    }
    best.map(|(_, _, first, last)| (first, last))
}

/// What one look at the registry did.
enum Looked {
    /// Evicted a value: the bytes and class of its block.
    Evicted((u64, usize)),
    /// Found no value to evict.
    Nothing,
    /// The value it chose was pinned before it could take it: look again.
    Busy,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::lightest_window;
    use crate::pool::pages::Beside;

    const MIB: usize = 1 << 20;

    /// Blocks of 1 MiB at the given MiB offsets of one segment, with the free MiB beside.
    fn blocks(layout: &[(usize, usize, usize)]) -> Vec<Beside> {
        layout
            .iter()
            .map(|&(at, before, after)| Beside {
                start: (64 + at) * MIB,
                len: MIB,
                before: before * MIB,
                after: after * MIB,
                segment: 64 * MIB,
            })
            .collect()
    }

    #[test]
    fn the_lightest_run_that_spans_the_request_wins() {
        let any = usize::MAX;
        // 0 1 2 3 held end to end: a 2 MiB request takes two neighbours, the lighter pair.
        let four = blocks(&[(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)]);
        let weights = [1.0, 9.0, 1.0, 2.0];
        assert_eq!(
            lightest_window(&four, |i| weights[i], 2 * MIB, any),
            Some((2, 3))
        );
        // A block with a free MiB beside it spans 2 MiB alone: the lighter of the two that do.
        let lone = blocks(&[(0, 0, 1), (2, 1, 0)]);
        let weights = [2.0, 1.0];
        assert_eq!(
            lightest_window(&lone, |i| weights[i], 2 * MIB, any),
            Some((1, 1))
        );
        // A held block in between (not a candidate) breaks the run: no window.
        let split = blocks(&[(0, 0, 0), (2, 0, 0)]);
        assert_eq!(lightest_window(&split, |_| 1.0, 2 * MIB, any), None);
        // Free pages between two blocks join them.
        let gap = blocks(&[(0, 0, 1), (2, 1, 0)]);
        assert_eq!(lightest_window(&gap, |_| 1.0, 3 * MIB, any), Some((0, 1)));
        // The run restarts past a break, and a later run can win.
        let runs = blocks(&[(0, 0, 0), (1, 0, 0), (3, 0, 0), (4, 0, 0)]);
        let weights = [5.0, 5.0, 1.0, 1.0];
        assert_eq!(
            lightest_window(&runs, |i| weights[i], 2 * MIB, any),
            Some((2, 3))
        );
    }

    #[test]
    fn a_window_never_holds_more_than_its_cap() {
        // Two 1 MiB neighbours for a 2 MiB request: within a cap of 2 MiB, not of 1 MiB.
        let two = blocks(&[(0, 0, 0), (1, 0, 0)]);
        assert_eq!(
            lightest_window(&two, |_| 1.0, 2 * MIB, 2 * MIB),
            Some((0, 1))
        );
        assert_eq!(lightest_window(&two, |_| 1.0, 2 * MIB, MIB), None);
        // A 1 MiB request: either block alone, never both.
        assert_eq!(
            lightest_window(&two, |i| [3.0, 1.0][i], MIB, MIB),
            Some((1, 1))
        );
    }

    /// Every run tried, for each first block every last one: what the linear search must
    /// agree with.
    fn every_run(
        blocks: &[Beside],
        weight: &[f64],
        need: usize,
        cap: usize,
    ) -> Option<(usize, usize)> {
        let mut best: Option<(f64, usize, usize, usize)> = None;
        for first in 0..blocks.len() {
            let (mut sum, mut held) = (0.0, 0);
            for last in first..blocks.len() {
                if last > first && !blocks[last - 1].reaches(&blocks[last]) {
                    break;
                }
                sum += weight[last];
                held += blocks[last].len;
                let run = blocks[last].start + blocks[last].len - blocks[first].start;
                let span = blocks[first].before + run + blocks[last].after;
                if span >= need {
                    if held <= cap && best.is_none_or(|(w, s, ..)| (sum, span) < (w, s)) {
                        best = Some((sum, span, first, last));
                    }
                    break;
                }
            }
        }
        best.map(|(_, _, first, last)| (first, last))
    }

    proptest::proptest! {
        #[test]
        fn the_linear_search_finds_the_lightest_run(
            // (free MiB before, held MiB, weight) for each block, end to end in a segment,
            // or (a zero length) a held block between that is no candidate.
            layout in proptest::collection::vec((0usize..3, 0usize..4, 1u32..9), 0..12),
            need in 1usize..10,
            cap in 1usize..12,
        ) {
            let mut blocks: Vec<Beside> = Vec::new();
            let mut weights = Vec::new();
            let mut at = 64 * MIB;
            // Free bytes since the last held block (candidate or not), and whether that
            // block was a candidate (then those bytes are its `after`).
            let mut free_run = 0;
            let mut after_candidate = false;
            for (free, len, weight) in layout {
                at += free * MIB;
                free_run += free * MIB;
                if after_candidate {
                    blocks.last_mut().unwrap().after = free_run;
                }
                if len == 0 {
                    at += MIB; // a held block that is no candidate
                    (free_run, after_candidate) = (0, false);
                    continue;
                }
                blocks.push(Beside {
                    start: at,
                    len: len * MIB,
                    before: free_run,
                    after: 0,
                    segment: 64 * MIB,
                });
                weights.push(f64::from(weight));
                at += len * MIB;
                (free_run, after_candidate) = (0, true);
            }
            proptest::prop_assert_eq!(
                lightest_window(&blocks, |i| weights[i], need * MIB, cap * MIB),
                every_run(&blocks, &weights, need * MIB, cap * MIB)
            );
        }
    }

    #[test]
    fn blocks_of_two_segments_never_make_one_window() {
        let mut two = blocks(&[(0, 0, 0), (1, 0, 0)]);
        two[1].segment += MIB; // end to end in memory, but another segment
        assert_eq!(lightest_window(&two, |_| 1.0, 2 * MIB, usize::MAX), None);
        assert_eq!(
            lightest_window(&two, |_| 1.0, MIB, usize::MAX),
            Some((0, 0))
        );
    }
}
