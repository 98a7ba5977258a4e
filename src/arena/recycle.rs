//! Recycling removed slots: batches, ready lists, and the rules for running the values'
//! destructors.
//!
//! A full removal batch is handed to the epoch collector as a tiny deferred function that
//! only moves the batch onto its shard's *ready list*; it never runs user code. The values
//! are dropped later, by an arena call that needs slots (an `insert` whose shard has none
//! vacant, `flush`, `shrink`, or the arena's drop), which *recycles* ready batches: it marks
//! each slot vacant, drops its value, and publishes the batch's slots on a free list.
//!
//! Two rules make that safe against user destructors:
//! - a destructor that panics is caught; the recycling finishes (every other value dropped,
//!   every slot vacant) and the first panic is resumed from the arena call once the arena is
//!   consistent again ([`Panics`]);
//! - a destructor that re-enters the arena never recycles again on the same thread
//!   ([`recycling`]): its inserts take vacant or fresh slots, so recursion is at most one
//!   level deep.

use std::ptr;

use crossbeam_utils::CachePadded;

use super::cache::{Added, ArenaThreadCache};
use super::panics::Panics;
use super::ArenaError;
use crate::stack::Link;
use crate::sync::epoch::Guard;
use crate::sync::Arc;
use crate::sync::{thread_local, AtomicPtr, AtomicU32, Ordering};

/// The slots of a removal batch.
pub(super) enum BatchSlots {
    /// A chain linked through the arena's link table, from its first link: a shard's
    /// shared batch, built with compare-exchanges by threads without their cache at hand.
    Chain(Link),
    /// The slots' indices: a thread cache's batch. Recycling finds each slot from its index
    /// alone, so the slots' loads overlap; following a chain waits for each link before it
    /// can find the next slot.
    Indices(Box<[u32]>),
}

/// A removal batch handed to the epoch collector.
pub(super) struct Batch {
    pub(super) slots: BatchSlots,
    /// The next batch on a ready list.
    next: *mut Batch,
}

/// A batch in transit through the epoch collector.
pub(super) struct PendingBatch(*mut Batch);

// SAFETY: a `PendingBatch` owns its `Batch` (a `Box` of plain data) until it is pushed on a
// ready list; moving it to the collecting thread moves that ownership.
unsafe impl Send for PendingBatch {}

impl PendingBatch {
    pub(super) fn new(slots: BatchSlots) -> Self {
        Self(Box::into_raw(Box::new(Batch {
            slots,
            next: ptr::null_mut(),
        })))
    }
}

/// The ready lists of an arena, one per shard, shared with the batches in transit (which
/// may outlive the arena: they then land on lists nobody reads, and are freed with them).
pub(super) struct ReadyLists {
    lists: Box<[CachePadded<ReadyList>]>,
}

struct ReadyList {
    /// Batches whose grace period has passed, newest first.
    ///
    /// Invariant: every batch on the list came from [`PendingBatch::new`] and is owned by
    /// the list. Pushed with a compare-exchange, emptied only by a swap with null, so a
    /// push never suffers ABA: a head it read and finds again is the head it linked to.
    head: AtomicPtr<Batch>,
    /// Batches handed to the collector and not on the list yet: a hint for when prodding
    /// the collector can help, never a safety matter.
    pending: AtomicU32,
    /// `head` as a sweep last saw it (written by sweepers only; compared, never followed).
    seen: AtomicPtr<Batch>,
}

impl ReadyLists {
    pub(super) fn new(shards: usize) -> Self {
        Self {
            lists: (0..shards)
                .map(|_| {
                    CachePadded::new(ReadyList {
                        head: AtomicPtr::new(ptr::null_mut()),
                        pending: AtomicU32::new(0),
                        seen: AtomicPtr::new(ptr::null_mut()),
                    })
                })
                .collect(),
        }
    }

    /// Counts a batch handed to the collector for `shard`.
    pub(super) fn note_pending(&self, shard: usize) {
        self.lists[shard].pending.fetch_add(1, Ordering::Relaxed);
    }

    /// Batches in transit, on every shard.
    pub(super) fn pending(&self) -> u64 {
        self.lists
            .iter()
            .map(|list| u64::from(list.pending.load(Ordering::Relaxed)))
            .sum()
    }

    /// Whether `shard` has batches in transit.
    pub(super) fn has_pending(&self, shard: usize) -> bool {
        self.lists[shard].pending.load(Ordering::Relaxed) > 0
    }

    /// Puts a batch whose grace period has passed on the ready list of `shard`. Runs inside
    /// the epoch collector: no user code, no panic.
    pub(super) fn push(&self, shard: usize, batch: PendingBatch) {
        let list = &self.lists[shard];
        let node = batch.0;
        let mut head = list.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` is ours until the compare-exchange below publishes it.
            unsafe { (*node).next = head };
            match list
                .head
                .compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => head = actual,
            }
        }
        list.pending.fetch_sub(1, Ordering::Relaxed);
    }

    /// Takes the list of `shard` if its head has not changed since the previous sweep
    /// looked: batches that no thread of the shard came to recycle meanwhile.
    pub(super) fn take_if_stale(&self, shard: usize) -> TakenBatches {
        let list = &self.lists[shard];
        let head = list.head.load(Ordering::Relaxed);
        let seen = list.seen.load(Ordering::Relaxed);
        list.seen.store(head, Ordering::Relaxed);
        if head.is_null() || head != seen {
            return TakenBatches(ptr::null_mut());
        }
        TakenBatches(list.head.swap(ptr::null_mut(), Ordering::Acquire))
    }

    /// Takes every ready batch of `shard`; the iterator yields their slots.
    pub(super) fn take(&self, shard: usize) -> TakenBatches {
        let list = &self.lists[shard];
        if list.head.load(Ordering::Relaxed).is_null() {
            return TakenBatches(ptr::null_mut());
        }
        TakenBatches(list.head.swap(ptr::null_mut(), Ordering::Acquire))
    }
}

/// Batches taken off a ready list, owned by this value (freed as they are yielded, or when
/// it drops).
pub(super) struct TakenBatches(*mut Batch);

impl Iterator for TakenBatches {
    type Item = BatchSlots;

    fn next(&mut self) -> Option<BatchSlots> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: the swap in `take` made the whole list ours (invariant on
        // `ReadyList::head`); each node came from `Box::into_raw` in `PendingBatch::new`.
        let batch = unsafe { Box::from_raw(self.0) };
        self.0 = batch.next;
        Some(batch.slots)
    }
}

impl Drop for TakenBatches {
    fn drop(&mut self) {
        self.for_each(drop);
    }
}

impl Drop for ReadyLists {
    fn drop(&mut self) {
        for shard in 0..self.lists.len() {
            drop(self.take(shard)); // frees the nodes; their slots died with the arena
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    /// Whether this thread is recycling a batch right now (then a destructor re-entered).
    static RECYCLING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
#[cfg(loom)]
thread_local! {
    static RECYCLING: std::cell::Cell<bool> = std::cell::Cell::new(false);
}

/// A thread pushes its epoch bag (up to 64 deferred functions, each here a whole removal
/// batch) to the collector's shared queue once every this many full batches it defers, on
/// any arena, rather than after each: each push allocates a bag and passes through state
/// that every thread of the collector shares, and pushing after every batch cost two threads
/// churning one arena about a quarter of their throughput. A batch left in the bag waits
/// until the thread defers more, refills with its batches in transit, flushes or exits; on
/// one collector an idle thread holds at most `FLUSH_EVERY - 1` full batches.
/// Under loom every batch is pushed at once: the models count on it.
#[cfg(not(loom))]
const FLUSH_EVERY: u32 = 8;

#[cfg(not(loom))]
thread_local! {
    /// Full removal batches this thread has deferred, on any arena.
    static DEFERRED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether the thread that just deferred a full batch should push its epoch bag to the
/// collector's shared queue: once every [`FLUSH_EVERY`] batches it defers (always under
/// loom, and while its thread-locals are being destroyed).
#[cfg(not(loom))]
#[inline]
fn flush_due() -> bool {
    DEFERRED
        .try_with(|deferred| {
            let count = deferred.get().wrapping_add(1);
            deferred.set(count);
            count % FLUSH_EVERY == 0
        })
        .unwrap_or(true)
}

#[cfg(loom)]
fn flush_due() -> bool {
    true
}

/// Runs `recycle` unless this thread is already recycling; returns whether it ran. While it
/// runs, nested calls (from destructors it runs) do not recycle.
pub(super) fn recycling(recycle: impl FnOnce()) -> bool {
    let entered = RECYCLING
        .try_with(|flag| !flag.replace(true))
        // Thread-locals being destroyed: recycle anyway. Every nested level takes a batch
        // off a ready list for good, so even then the nesting is bounded.
        .unwrap_or(true);
    if !entered {
        return false;
    }
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let _ = RECYCLING.try_with(|flag| flag.set(false));
        }
    }
    let _leave = Leave;
    recycle();
    true
}

impl<T: Send + 'static> super::SlotArena<T> {
    /// A vacant slot for `shard`, whose free list is empty: recycled (this shard's batches,
    /// then other shards', unless this shard's own are on their way back), fresh while this
    /// shard's growth is within `ArenaConfig::growth_before_stealing`, else another shard's
    /// ready batch or vacant slot, else fresh.
    #[cold]
    #[inline(never)]
    pub(super) fn refill(
        &self,
        cache: Option<&ArenaThreadCache>,
        shard: usize,
        panics: &mut Panics,
    ) -> Result<u32, ArenaError> {
        let arena = &self.arena;
        let shards = arena.shards.len();
        let others = || (1..shards).map(move |k| (shard + k) & (shards - 1));
        let grown = &arena.shards[shard].grown;
        let allowance = || {
            arena
                .shape
                .growth_before_stealing
                .saturating_sub(grown.load(Ordering::Relaxed))
        };
        let recycle_others = |panics: &mut Panics| {
            for from in others() {
                if self.recycle_ready(from, shard, panics) {
                    break;
                }
            }
        };
        // Under loom never: the sweep takes caches with the same handshake as `flush`, which
        // the models check.
        let sweep = !cfg!(loom) && cache.is_some_and(|cache| arena.sweep_due(cache));
        let mut awaiting_own = false;
        recycling(|| {
            if sweep {
                self.sweep(panics);
            }
            // This shard's own batches first: its slots stay on its threads' cache lines.
            self.recycle_ready(shard, shard, panics);
            if arena.shards[shard].free.is_empty() && self.ready.has_pending(shard) {
                // Some are in transit: let the collector move what has passed its grace
                // period (no user code runs there), and recycle that.
                self.pin().flush();
                self.recycle_ready(shard, shard, panics);
            }
            // Then other shards' batches (a thread that only removes leaves them there),
            // unless this shard's own are still on their way back and it may grow: another
            // shard's slots would move onto this thread's cache lines (and its own onto the
            // other's, once they come back), where a fresh chunk costs what the grace period
            // holds back, within the growth bound.
            awaiting_own = self.ready.has_pending(shard) && allowance() > 0;
            if arena.shards[shard].free.is_empty() && !awaiting_own {
                recycle_others(panics);
            }
        });
        if let Some(index) = arena.pop_chain(shard) {
            return Ok(arena.first_of_chain(index, cache, shard));
        }
        // Other shards' vacant slots are the last resort, up to a bound: a fresh chunk keeps
        // this thread off the cache lines of slots other threads use.
        let room = allowance();
        if room > 0 && (awaiting_own || others().any(|from| !arena.shards[from].free.is_empty())) {
            if let Ok(Some((index, cost))) = arena.claim_chain_within(shard, room) {
                grown.fetch_add(cost, Ordering::Relaxed);
                return Ok(arena.first_of_chain(index, cache, shard));
            }
        }
        if awaiting_own {
            // No fresh chunk within the bound: the other shards' ready batches after all.
            recycling(|| recycle_others(panics));
            if let Some(index) = arena.pop_chain(shard) {
                return Ok(arena.first_of_chain(index, cache, shard));
            }
        }
        if let Some(index) = others().find_map(|from| arena.pop_chain(from)) {
            return Ok(arena.first_of_chain(index, cache, shard));
        }
        match arena.claim_fresh(cache, shard) {
            Err(ArenaError::Full { .. }) => self.refill_at_the_cap(cache, shard, panics),
            claimed => claimed,
        }
    }

    /// [`refill`](Self::refill) once every index below `ArenaConfig::max_slots` has been
    /// claimed: before [`ArenaError::Full`], the vacant slots the paths above do not look
    /// at. Those in other threads' hands (up to a chunk each, kept by idle threads too),
    /// removals past their grace period still in a batch, and those a concurrent `trim` held
    /// off the free lists (see `ArenaInner::pop_at_the_cap`). Cold: at the cap only.
    #[cold]
    #[inline(never)]
    fn refill_at_the_cap(
        &self,
        cache: Option<&ArenaThreadCache>,
        shard: usize,
        panics: &mut Panics,
    ) -> Result<u32, ArenaError> {
        let arena = &self.arena;
        // As `flush` does, less resuming panics (the caller handles them), and pinned afresh
        // between collections: a batch deferred now is ready two epochs later, and this
        // thread's own pin would hold the epoch back after one (another thread's pin, or an
        // outer one of this thread's, holds it back as it must).
        let mut guard = self.pin();
        self.defer_every_batch(&guard);
        for _ in 0..3 {
            guard.flush();
            self.collect_backlog(&guard);
            if self.ready.pending() == 0 {
                break;
            }
            guard.repin();
        }
        drop(guard);
        self.recycle_every_ready(panics);
        match arena.pop_at_the_cap(shard)? {
            Some(index) => Ok(arena.first_of_chain(index, cache, shard)),
            // A trim lowered the frontier meanwhile.
            None => arena.claim_fresh(cache, shard),
        }
    }

    /// Takes what waits for a thread that may never come back: the caches unchanged since the
    /// previous sweep (see `drain_idle_caches`; their hands go back to their shards, their
    /// batches to the collector), the shards' shared batches unchanged since then, and the
    /// ready batches that no thread of their shard recycled since then (a shard whose
    /// threads are gone recycles nothing; recycled onto their own shard). So the values
    /// removed by idle or exited threads are dropped, and the vacant slots they held used,
    /// while other threads keep using the arena, without a `flush`. Runs while recycling (it
    /// drops values).
    #[cold]
    fn sweep(&self, panics: &mut Panics) {
        for shard in 0..self.arena.shards.len() {
            for slots in self.ready.take_if_stale(shard) {
                self.arena.recycle(slots, shard, panics);
            }
        }
        let caches = self.arena.drain_idle_caches();
        let guard = self.pin();
        for (shard, slots) in caches
            .into_iter()
            .chain(self.arena.take_stale_partial_batches())
        {
            self.defer_batch(shard, slots, &guard);
        }
        // Into the collector's shared queue (in this thread's bag they would wait for this
        // thread to flush, which a thread that only inserts rarely does), and a collection:
        // it advances the epoch, so batches deferred by earlier sweeps become ready for the
        // next one even when no other thread pins.
        guard.flush();
    }

    pub(super) fn recycle_ready(&self, from: usize, to: usize, panics: &mut Panics) -> bool {
        let mut any = false;
        for slots in self.ready.take(from) {
            self.arena.recycle(slots, to, panics);
            any = true;
        }
        any
    }

    /// Adds `index`, just removed, to the calling thread's removal batch (in its cache; in
    /// its shard's shared batch when it has no cache or a drainer holds it); hands the batch
    /// to the collector when it is full.
    pub(super) fn add_to_batch(&self, index: u32, guard: &Guard) {
        let arena = &self.arena;
        let (added, shard) = match arena.my_cache() {
            Some((cache, shard)) => (arena.add_removed(cache, index), shard),
            None => (Added::Busy, arena.my_shard()),
        };
        if let Some(slots) = self.batch_to_defer(added, shard, index) {
            self.defer_full_batch(shard, slots, guard);
        }
    }

    /// The batch to defer after the removed slot `index` went where `added` says: the
    /// cache's batch it filled, or, when the cache's batch was not at hand, the shard's
    /// shared batch if the slot filled that one.
    #[inline(always)]
    pub(super) fn batch_to_defer(
        &self,
        added: Added<'_>,
        shard: usize,
        index: u32,
    ) -> Option<BatchSlots> {
        match added {
            Added::Kept => None,
            Added::Full(cache) => Some(BatchSlots::Indices(cache.full_batch())),
            Added::Busy => self
                .arena
                .add_shared_removed(shard, index)
                .map(BatchSlots::Chain),
        }
    }

    /// Defers a batch that just filled up, and every `FLUSH_EVERY`th one of the thread's
    /// also flushes the thread's epoch bag.
    pub(super) fn defer_full_batch(&self, shard: usize, slots: BatchSlots, guard: &Guard) {
        self.defer_batch(shard, slots, guard);
        // An arena with a cap pushes every batch: one left in an idle thread's bag would
        // keep its slots from an insert at the cap for as long as that thread stays idle.
        if flush_due() || self.arena.shape.max_slots < u64::from(u32::MAX) {
            guard.flush();
        }
    }

    /// Hands the removal batch of `slots` to the collector; after its grace period it lands
    /// on the ready list of `shard`.
    pub(super) fn defer_batch(&self, shard: usize, slots: BatchSlots, guard: &Guard) {
        self.ready.note_pending(shard);
        let ready = Arc::clone(&self.ready);
        let batch = PendingBatch::new(slots);
        let to_ready_list = move || ready.push(shard, batch);
        // SAFETY: the closure owns what it touches (an `Arc` of the ready lists and the batch
        // node; it reads no slot), so it may run on any thread at any later time. `guard` is
        // pinned on the arena's collector (checked by every caller), so it runs only after
        // every reader that could have resolved one of the batch's slots has unpinned.
        unsafe { guard.defer_unchecked(to_ready_list) };
    }
}
