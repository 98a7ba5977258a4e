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

use crate::stack::Link;
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
pub(super) fn flush_due() -> bool {
    DEFERRED
        .try_with(|deferred| {
            let count = deferred.get().wrapping_add(1);
            deferred.set(count);
            count % FLUSH_EVERY == 0
        })
        .unwrap_or(true)
}

#[cfg(loom)]
pub(super) fn flush_due() -> bool {
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
