//! Per-thread slots: in every pool a thread uses, the thread's *thread index* (the arena's
//! small, reused per-thread number) names one slot, found with one table lookup. A slot holds
//! the thread's cache of blocks (a *bin* per small class: blocks this thread allocated and
//! freed again) and its counters.
//!
//! # Who touches a slot
//!
//! Its *owner* (the thread with its index) reads and writes it, with plain (relaxed) atomic
//! accesses, inside an operation bracketed by [`Slot::enter`] and [`Slot::leave`]. Other
//! threads *drain* it (trim, budget pressure, the pool's close) without waiting for the owner
//! to come back: a Dekker handshake between the owner's `busy` flag and the drainer's `drain`
//! flag, each side storing its own flag, fencing, then loading the other's. The owner's fence
//! is [`asymmetric::light`] (free on Linux) and the drainer's [`asymmetric::heavy`] (a
//! `membarrier`), since owners run millions of operations for every drain. Afterwards either
//! the drainer sees `busy` (and waits for that one operation to end) or the owner sees
//! `drain` (and leaves the bins alone while it is set).
//!
//! The counters are the owner's alone (single writer: a load and a store, no read-modify-
//! write); readers sum them across slots. Closing the pool reads them for the last time once
//! every owner is out of its operation (see `lifetime`).

use super::blocks::{BlockTable, Record};
use super::config::BIN_CLASSES;
use crate::stack::{Link, NIL};
use crate::sync::{asymmetric, yield_now, AtomicBool, AtomicU32, AtomicU64, Ordering};

/// One thread's slot in one pool.
pub(super) struct Slot {
    /// 1 while the owner runs an operation on the pool.
    busy: AtomicU32,
    /// Set (by compare-exchange) by a thread draining the bins; the owner leaves the bins
    /// alone while it is set.
    drain: AtomicU32,
    /// Bins by class: `count << 32 | link` of a stack of block records, linked through their
    /// `next`. Invariant: read or written only by the owner inside an operation that found
    /// `drain` clear, or by the drainer that holds `drain` once the owner is out.
    bins: [AtomicU64; BIN_CLASSES],
    /// Bytes in the bins (same rule as `bins`).
    binned: AtomicU64,
    /// The owner's counters.
    pub(super) counters: SlotCounters,
}

/// What one thread counted in one pool: each written by the slot's owner only.
#[derive(Default)]
pub(super) struct SlotCounters {
    /// Blocks handed out by this thread, and bytes (class sizes) and requested bytes of them.
    pub(super) allocations: AtomicU64,
    pub(super) allocated_bytes: AtomicU64,
    pub(super) allocated_requested: AtomicU64,
    /// Blocks this thread gave back (whoever allocated them), and their bytes.
    pub(super) frees: AtomicU64,
    pub(super) freed_bytes: AtomicU64,
    pub(super) freed_requested: AtomicU64,
    /// Allocations served by this thread's bins.
    pub(super) hits: AtomicU64,
    /// Operations so far (for the idle policy).
    pub(super) operations: AtomicU64,
    /// `operations` when the idle policy last looked.
    pub(super) seen_operations: AtomicU64,
}

/// Adds `delta` to a counter only the calling thread writes.
#[inline(always)]
pub(super) fn bump(counter: &AtomicU64, delta: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(delta),
        Ordering::Relaxed,
    );
}

/// The outcome of [`Slot::enter`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Entry {
    /// The pool is open; `bins` says whether the bins may be used.
    Open { bins: bool },
    /// The pool is closed: the operation must not touch the slot (the owner is not busy).
    Closed,
}

impl Slot {
    pub(super) fn new() -> Self {
        Self {
            busy: AtomicU32::new(0),
            drain: AtomicU32::new(0),
            bins: std::array::from_fn(|_| AtomicU64::new(0)),
            binned: AtomicU64::new(0),
            counters: SlotCounters::default(),
        }
    }

    /// Starts an operation of the owner.
    #[inline(always)]
    pub(super) fn enter(&self, closed: &AtomicBool) -> Entry {
        self.busy.store(1, Ordering::Relaxed);
        // Numbered before the fence, so a drainer that sees this operation busy also sees its
        // number, and knows it ended once the number moves on (see `wait_out`).
        let operations = &self.counters.operations;
        operations.store(operations.load(Ordering::Relaxed) + 1, Ordering::Release);
        asymmetric::light();
        if closed.load(Ordering::Acquire) {
            self.busy.store(0, Ordering::Release);
            return Entry::Closed;
        }
        Entry::Open {
            bins: self.drain.load(Ordering::Acquire) == 0,
        }
    }

    /// Ends an operation of the owner: everything it did is visible to a drainer or closer
    /// that then sees the slot idle.
    #[inline(always)]
    pub(super) fn leave(&self) {
        self.busy.store(0, Ordering::Release);
    }

    /// Pops a cached block of `class` (owner, inside an operation with bins usable): its
    /// record's index and the record.
    #[inline(always)]
    pub(super) fn pop<'b>(
        &self,
        class: usize,
        class_bytes: usize,
        blocks: &'b BlockTable,
    ) -> Option<(u32, &'b Record)> {
        let bin = &self.bins[class];
        let head = bin.load(Ordering::Relaxed);
        let link = head as Link;
        if link == NIL {
            return None;
        }
        let record = blocks.record(link - 1);
        let next = record.next.load(Ordering::Relaxed);
        bin.store(
            ((head >> 32) - 1) << 32 | u64::from(next),
            Ordering::Relaxed,
        );
        bump(&self.binned, (class_bytes as u64).wrapping_neg());
        Some((link - 1, record))
    }

    /// Caches block `index` (its record `record`) in the bin of `class` if it fits
    /// `max_blocks` and `max_bytes` (owner, inside an operation with bins usable); whether it
    /// did.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // the free path's locals, passed on as they are
    pub(super) fn push(
        &self,
        class: usize,
        class_bytes: usize,
        index: u32,
        record: &Record,
        max_blocks: usize,
        max_bytes: usize,
    ) -> bool {
        let bin = &self.bins[class];
        let head = bin.load(Ordering::Relaxed);
        let count = head >> 32;
        let binned = self.binned.load(Ordering::Relaxed);
        if count >= max_blocks as u64 || binned + class_bytes as u64 > max_bytes as u64 {
            return false;
        }
        record.next.store(head as Link, Ordering::Relaxed);
        bin.store((count + 1) << 32 | u64::from(index + 1), Ordering::Relaxed);
        self.binned
            .store(binned + class_bytes as u64, Ordering::Relaxed);
        true
    }

    /// Takes every cached block, as another thread (or the owner, outside an operation):
    /// calls `each(class, record)` for each and returns the bytes taken. Waits only for an
    /// operation the owner is running right now; returns 0 if another drain is under way
    /// (that one takes the blocks).
    pub(super) fn drain(&self, mut each: impl FnMut(usize, u32), blocks: &BlockTable) -> u64 {
        if self
            .drain
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return 0;
        }
        asymmetric::heavy();
        self.wait_out();
        // The owner is out of the operation it was in, and every later one sees `drain` set:
        // the bins are ours.
        let taken = self.binned.load(Ordering::Relaxed);
        for (class, bin) in self.bins.iter().enumerate() {
            let mut link = bin.swap(0, Ordering::Relaxed) as Link;
            while link != NIL {
                let next = blocks.record(link - 1).next.load(Ordering::Relaxed);
                each(class, link - 1);
                link = next;
            }
        }
        self.binned.store(0, Ordering::Relaxed);
        self.drain.store(0, Ordering::Release);
        taken
    }

    /// After a heavy fence that followed the caller's store of its flag (`drain`, or the
    /// pool's `closed`): waits until the owner is out of the operation it was in at the
    /// fence, if any. Later operations see the flag, so they need no waiting: the owner's
    /// operation number moving on means the one in flight has ended (and its effects are
    /// visible: the number is stored with `Release` after the previous `leave`).
    pub(super) fn wait_out(&self) {
        let operations = &self.counters.operations;
        let in_flight = operations.load(Ordering::Acquire);
        while self.busy.load(Ordering::Acquire) != 0
            && operations.load(Ordering::Acquire) == in_flight
        {
            yield_now(); // the owner is inside one short operation
        }
    }

    /// Bytes cached in the bins (a snapshot).
    pub(super) fn binned(&self) -> u64 {
        self.binned.load(Ordering::Relaxed)
    }
}
