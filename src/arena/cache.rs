//! Thread caches: each thread's private front of an arena, named by its thread index (see
//! `crate::thread`: a small number held by one live thread at a time, reused after the thread
//! exits). A cache holds the thread's *hand* (vacant slots its next inserts take) and its *removal
//! batch* (slots it removed, not yet handed to the epoch collector). Its owner works on them with
//! plain loads and stores, no read-modify-write, inside operations of the cache's [`Handshake`]; a
//! `flush`, `trim` or `shrink` takes them back from any thread, idle or exited ones included, and
//! so does a *sweep*: every 64th refill of a thread in an arena takes the caches whose hand or
//! batch did not change since its previous sweep. So nothing waits in a cache for its owner to come
//! back while other threads use the arena. A hand holds at most a chunk (64 slots): chains are
//! never longer.
//!
//! Without caches every insert popped a shared free list and every removal pushed onto a
//! shared batch, each a compare-exchange; with them an insert pays one for a whole chain of
//! slots (a removal batch recycled, or a fresh chunk), and a removal one per full batch (when
//! the batch is deferred).
//!
//! A thread without an index (its thread-locals are being destroyed), or whose cache a drainer
//! holds right now, uses the shard's shared lists instead.

use crossbeam_utils::CachePadded;

use crate::handshake::Busy;
use crate::handshake::Handshake;
use crate::roster::Roster;
use crate::stack::{Link, NIL};
use crate::sync::{AtomicU32, Ordering};

/// Thread caches in the first page of an arena's roster (later pages double).
pub(super) const FIRST_CACHES: u32 = 4;

/// Refills of a thread in an arena between two of its sweeps.
const SWEEP_EVERY: u32 = 64;

/// One thread's cache in one arena.
pub(super) struct ArenaThreadCache {
    /// The shard of the cache's threads: its number in the arena's roster modulo the shard
    /// count, so threads spread over the shards in the order they first used the arena.
    /// Fixed when the cache's page is built.
    shard: usize,
    /// The owner's operations and the drainers' flag.
    handshake: Handshake,
    /// Vacant slots for the owner's next inserts: a chain linked through `ArenaInner::links`,
    /// ending in `NIL`.
    ///
    /// Invariant (also for `removed_len`, and for `removed` with the exception written
    /// there): read or written only by the owner inside an operation that found the
    /// handshake free to use, or by a drainer that claimed the handshake once the owner is
    /// out, or under exclusive access to the arena.
    hand: AtomicU32,
    /// The owner's removal batch being filled: the indices of `REMOVED` slots, in
    /// `removed[..removed_len]` (`removal_batch` entries in all).
    ///
    /// Invariant: as on `hand`, with one exception. When an operation of the owner fills the
    /// batch, it sets `removed_len` to 0, and the entries keep the full batch until the
    /// owner's next operation; the owner copies them out before that, outside any operation
    /// ([`full_batch`](Self::full_batch)). Only the owner writes entries, and a drainer reads
    /// only the first `removed_len`, so the copy races with nobody.
    removed: Box<[AtomicU32]>,
    /// Slots in `removed`. Drainers and sweeps also read it without a claim, as a hint (a
    /// cache that seems empty is skipped, as with `hand`).
    removed_len: AtomicU32,
    /// `hand` and [`newest_removed`](Self::newest_removed) as a sweep last saw them (written
    /// by sweepers only; racing sweepers at worst take a cache one sweep later, or earlier).
    seen_hand: AtomicU32,
    seen_removed: AtomicU32,
    /// The owner's refills of this arena, for its sweeps (the owner's alone: a plain load
    /// and store).
    refills: AtomicU32,
}

/// What [`ArenaThreadCache::add_removed`] (or `remove_into_batch`) did with a removed slot.
pub(super) enum Added<'c> {
    /// The slot joined the cache's batch.
    Kept,
    /// The slot filled the batch of this cache, whose owner takes it next, with
    /// [`ArenaThreadCache::full_batch`], and defers it.
    Full(&'c ArenaThreadCache),
    /// The cache's batch is not at hand (a drainer holds the cache, or the thread has
    /// none): the caller uses the shard's shared batch.
    Busy,
}

impl ArenaThreadCache {
    /// A cache of shard `shard` whose batches hold `removal_batch` slots.
    pub(super) fn new(shard: usize, removal_batch: u32) -> Self {
        Self {
            shard,
            handshake: Handshake::new(),
            hand: AtomicU32::new(NIL),
            removed: (0..removal_batch).map(|_| AtomicU32::new(NIL)).collect(),
            removed_len: AtomicU32::new(0),
            seen_hand: AtomicU32::new(NIL),
            seen_removed: AtomicU32::new(NIL),
            refills: AtomicU32::new(0),
        }
    }

    /// The shard of the cache's threads.
    #[inline(always)]
    pub(super) fn shard(&self) -> usize {
        self.shard
    }

    /// Takes a slot from the hand (the owner only): its index, with `next_of(index)` read as
    /// the hand's next head (the slot's link, which the caller reads from its table).
    #[inline]
    pub(super) fn pop_hand(&self, next_of: impl FnOnce(u32) -> u32) -> Option<u32> {
        let busy = self.handshake.begin();
        let mut taken = None;
        if self.handshake.may_use() {
            let head = self.hand.load(Ordering::Relaxed);
            if head != NIL {
                // The slot is the caller's from here on (popped), which keeps its page.
                self.hand.store(next_of(head - 1), Ordering::Relaxed);
                taken = Some(head - 1);
            }
        }
        self.handshake.end(busy);
        taken
    }

    /// Puts the vacant chain `head` into the empty hand (the owner only); whether it did. A
    /// full hand (filled by an insert that a value's drop made meanwhile) or a drain under
    /// way leaves the chain to the caller.
    pub(super) fn fill_hand(&self, head: Link) -> bool {
        let busy = self.handshake.begin();
        let kept = self.handshake.may_use() && self.hand.load(Ordering::Relaxed) == NIL;
        if kept {
            self.hand.store(head, Ordering::Relaxed);
        }
        self.handshake.end(busy);
        kept
    }

    /// Takes the whole hand (the owner only): its vacant chain, or `NIL` (also while a drain
    /// is under way: the drainer takes it).
    pub(super) fn take_hand(&self) -> Link {
        let busy = self.handshake.begin();
        let mut hand = NIL;
        if self.handshake.may_use() {
            hand = self.hand.load(Ordering::Relaxed);
            self.hand.store(NIL, Ordering::Relaxed);
        }
        self.handshake.end(busy);
        hand
    }

    /// Adds the removed slot `index` to the batch (the owner only).
    #[inline]
    pub(super) fn add_removed(&self, index: u32) -> Added<'_> {
        let busy = self.handshake.begin();
        let added = self.add_removed_in(&busy, index);
        self.handshake.end(busy);
        added
    }

    /// Runs `remove` (which marks a slot removed and returns its index) and adds the slot to
    /// the batch, all inside one operation (the owner only): the operation is what keeps a
    /// stale key's page allocated while `remove` reads it (see
    /// `ArenaInner::wait_out_operations`).
    #[inline]
    pub(super) fn remove_into_batch<E>(
        &self,
        remove: impl FnOnce() -> Result<u32, E>,
    ) -> Result<Added<'_>, E> {
        let busy = self.handshake.begin();
        let added = remove().map(|index| self.add_removed_in(&busy, index));
        self.handshake.end(busy);
        added
    }

    /// [`add_removed`](Self::add_removed) inside the operation `_busy`.
    #[inline(always)]
    fn add_removed_in(&self, _busy: &Busy, index: u32) -> Added<'_> {
        if !self.handshake.may_use() {
            return Added::Busy;
        }
        let len = self.removed_len.load(Ordering::Relaxed);
        let Some(entry) = self.removed.get(len as usize) else {
            // Never: a batch that fills is taken at once (invariant on `removed`).
            return Added::Busy;
        };
        entry.store(index, Ordering::Relaxed);
        let len = len + 1;
        if len as usize == self.removed.len() {
            self.removed_len.store(0, Ordering::Relaxed);
            Added::Full(self)
        } else {
            self.removed_len.store(len, Ordering::Relaxed);
            Added::Kept
        }
    }

    /// Counts a refill of the owner (the owner only); whether it should sweep. Every
    /// [`SWEEP_EVERY`]th refill of each thread in each arena: a sweep reads every cache of
    /// the arena (and issues a `membarrier` when it takes one), while a refill comes once per
    /// chain of inserts.
    pub(super) fn sweep_due(&self) -> bool {
        let refills = self.refills.load(Ordering::Relaxed).wrapping_add(1);
        self.refills.store(refills, Ordering::Relaxed);
        refills.is_multiple_of(SWEEP_EVERY)
    }

    /// Whether the hand or the batch has not changed since the previous sweep looked (an
    /// idle or exited thread's, or the batch of a thread that inserts without removing);
    /// remembers what it saw for the next sweep. Parts in use change between sweeps (a hand
    /// shrinks with every insert, a batch grows with every removal).
    pub(super) fn unchanged_since_last_sweep(&self) -> bool {
        let hand = self.hand.load(Ordering::Relaxed);
        let removed = self.newest_removed();
        let stale = (hand != NIL && self.seen_hand.load(Ordering::Relaxed) == hand)
            || (removed != NIL && self.seen_removed.load(Ordering::Relaxed) == removed);
        self.seen_hand.store(hand, Ordering::Relaxed);
        self.seen_removed.store(removed, Ordering::Relaxed);
        stale
    }

    /// Whether the hand or the batch holds something (a racy look, a hint: a cache that
    /// seems empty is skipped by drainers).
    pub(super) fn holds(&self) -> bool {
        self.hand.load(Ordering::Relaxed) != NIL || self.removed_len.load(Ordering::Relaxed) != 0
    }

    /// Claims the cache for a drainer: its owner's later operations leave it alone; whether
    /// this call claimed it (another drainer may hold it).
    pub(super) fn claim(&self) -> bool {
        self.handshake.claim()
    }

    /// Whether a drainer holds the cache now.
    pub(super) fn is_claimed(&self) -> bool {
        self.handshake.is_claimed()
    }

    /// Waits until the owner is out of the operation it may be in.
    pub(super) fn wait_out(&self) {
        self.handshake.wait_out();
    }

    /// Takes the hand and the batch of a cache this drainer claimed, once the owner is out
    /// of the operation it was in (after the caller's heavy fence): the hand's chain, and a
    /// copy of the batch's slots. The cache stays claimed until
    /// [`hand_back`](Self::hand_back).
    pub(super) fn take_claimed(&self) -> (Link, Box<[u32]>) {
        self.handshake.wait_out();
        // The owner is out, and its later operations see the claim: ours.
        let hand = self.hand.load(Ordering::Relaxed);
        let removed = self.first_removed(self.removed_len.load(Ordering::Relaxed) as usize);
        self.hand.store(NIL, Ordering::Relaxed);
        self.removed_len.store(0, Ordering::Relaxed);
        (hand, removed)
    }

    /// Ends a drainer's claim.
    pub(super) fn hand_back(&self) {
        self.handshake.hand_back();
    }

    /// The batch that the owner's last operation filled ([`Added::Full`]): a copy of its
    /// indices, taken by the owner before its next operation on the cache (invariant on
    /// `removed`).
    pub(super) fn full_batch(&self) -> Box<[u32]> {
        self.first_removed(self.removed.len())
    }

    /// A copy of the first `len` entries of `removed` (at most all of them).
    fn first_removed(&self, len: usize) -> Box<[u32]> {
        self.removed[..len.min(self.removed.len())]
            .iter()
            .map(|entry| entry.load(Ordering::Relaxed))
            .collect()
    }

    /// The link of the slot last added to the batch (`NIL` when it is empty), read without
    /// a claim: for sweeps, whether the batch changed since they last looked. A hint, as
    /// `seen_removed` says; it is derived from the batch, so removals store nothing more.
    fn newest_removed(&self) -> u32 {
        let len = self.removed_len.load(Ordering::Relaxed) as usize;
        len.checked_sub(1)
            .and_then(|last| self.removed.get(last))
            .map_or(NIL, |entry| entry.load(Ordering::Relaxed).wrapping_add(1))
    }
}

/// The caches of an arena: one per thread index that used it (see `crate::roster`).
pub(super) type ArenaThreadCaches = Roster<CachePadded<ArenaThreadCache>>;
