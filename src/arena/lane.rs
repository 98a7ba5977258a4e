//! Lanes: each thread's private front of an arena, named by its thread index (see
//! `crate::thread`: a small number held by one live thread at a time, reused after the thread
//! exits). A lane holds the thread's *hand* (vacant slots its next inserts take) and its
//! *removal batch* (slots it removed, not yet handed to the epoch collector). Its owner works
//! on them with plain loads and stores, no read-modify-write, inside operations of the lane's
//! [`Handshake`]; a `flush`, `trim` or `shrink` takes them back from any thread, idle or
//! exited ones included, and so does a *sweep*: every 64th refill of a thread in an arena
//! takes the lanes whose hand or batch did not change since its previous sweep. So nothing
//! waits in a lane for its owner to come back while other threads use the arena. A hand holds at most a chunk
//! (64 slots): chains are never longer.
//!
//! Without lanes every insert popped a shared free list and every removal pushed onto a
//! shared batch, each a compare-exchange; with them an insert pays one for a whole chain of
//! slots (a removal batch recycled, or a fresh chunk), and a removal one per full batch (when
//! the batch is deferred).
//!
//! A thread without an index (its thread-locals are being destroyed), or whose lane a drainer
//! holds right now, uses the shard's shared lists instead.

use crossbeam_utils::CachePadded;

use super::table::Arena;
use crate::handshake::Handshake;
use crate::roster::Roster;
use crate::stack::{Link, NIL};
use crate::sync::{AtomicU32, Ordering};

/// Lanes in the first page of an arena's roster (later pages double).
pub(super) const FIRST_LANES: u32 = 4;

/// Refills of a thread in an arena between two of its sweeps.
const SWEEP_EVERY: u32 = 64;

/// One thread's lane in one arena.
pub(super) struct Lane {
    /// The shard of the lane's threads: its number in the arena's roster modulo the shard
    /// count, so threads spread over the shards in the order they first used the arena.
    /// Fixed when the lane's page is built.
    shard: usize,
    /// The owner's operations and the drainers' flag.
    handshake: Handshake,
    /// Vacant slots for the owner's next inserts: a chain linked through `Arena::links`,
    /// ending in `NIL`.
    ///
    /// Invariant (also for `removed` and `removed_len`): read or written only by the owner
    /// inside an operation that found the handshake free to use, or by a drainer that claimed
    /// the handshake once the owner is out, or under exclusive access to the arena.
    hand: AtomicU32,
    /// The owner's removal batch being filled: a chain of `REMOVED` slots linked through
    /// `Arena::links`, ending in `NIL`.
    removed: AtomicU32,
    /// Slots in `removed`.
    removed_len: AtomicU32,
    /// `hand` and `removed` as a sweep last saw them (written by sweepers only; racing
    /// sweepers at worst take a lane one sweep later, or earlier).
    seen_hand: AtomicU32,
    seen_removed: AtomicU32,
    /// The owner's refills of this arena, for its sweeps (the owner's alone: a plain load
    /// and store).
    refills: AtomicU32,
}

/// What [`Arena::add_removed`] did.
pub(super) enum Added {
    /// The slot joined the lane's batch.
    Kept,
    /// The batch is full: the chain starting here is the caller's to defer.
    Full(Link),
    /// A drainer holds the lane: the caller uses the shard's batch.
    Busy,
}

impl Lane {
    pub(super) fn new(shard: usize) -> Self {
        Self {
            shard,
            handshake: Handshake::new(),
            hand: AtomicU32::new(NIL),
            removed: AtomicU32::new(NIL),
            removed_len: AtomicU32::new(0),
            seen_hand: AtomicU32::new(NIL),
            seen_removed: AtomicU32::new(NIL),
            refills: AtomicU32::new(0),
        }
    }
}

/// The lanes of an arena: one per thread index that used it (see `crate::roster`).
pub(super) type Lanes = Roster<CachePadded<Lane>>;

impl<T> Arena<T> {
    /// The calling thread's lane, and its shard; `None` for a thread without an index.
    #[inline]
    pub(super) fn my_lane(&self) -> Option<(&Lane, usize)> {
        if let Some((lane, _)) = crate::thread::cached_lane(self.id.get()) {
            // SAFETY: this thread cached the pointer for this arena's identity (never reused,
            // so this arena, which `&self` keeps alive) and its current index (the cache is
            // cleared when the index is given back); a lane page stays allocated, at the same
            // address, until the arena drops.
            let lane = unsafe { &*lane.cast::<Lane>() };
            return Some((lane, lane.shard));
        }
        self.find_my_lane()
    }

    /// [`my_lane`](Self::my_lane) without the thread's cached pointer: finds or makes the
    /// lane, and caches it.
    #[cold]
    fn find_my_lane(&self) -> Option<(&Lane, usize)> {
        let index = u32::try_from(crate::thread::index()?).ok()?;
        let shards = self.shards.len();
        let lane: &Lane = self.lanes.get_or_claim(index, |number| {
            CachePadded::new(Lane::new(number as usize & (shards - 1)))
        })?;
        crate::thread::cache_lane(self.id.get(), std::ptr::from_ref(lane).cast());
        Some((lane, lane.shard))
    }

    /// Takes a slot from the hand of `lane` (its owner only).
    #[inline]
    pub(super) fn pop_hand(&self, lane: &Lane) -> Option<u32> {
        lane.handshake.begin();
        let mut taken = None;
        if lane.handshake.may_use() {
            let head = lane.hand.load(Ordering::Relaxed);
            if head != NIL {
                let next = self.links.at(head - 1).load(Ordering::Relaxed);
                lane.hand.store(next, Ordering::Relaxed);
                taken = Some(head - 1);
            }
        }
        lane.handshake.end();
        taken
    }

    /// Puts the vacant chain `head` into the empty hand of `lane` (its owner only); whether it
    /// did. A full hand (filled by an insert that a value's drop made meanwhile) or a drain
    /// under way leaves the chain to the caller.
    pub(super) fn fill_hand(&self, lane: &Lane, head: Link) -> bool {
        lane.handshake.begin();
        let kept = lane.handshake.may_use() && lane.hand.load(Ordering::Relaxed) == NIL;
        if kept {
            lane.hand.store(head, Ordering::Relaxed);
        }
        lane.handshake.end();
        kept
    }

    /// Takes the whole hand of `lane` (its owner only): its vacant chain, or `NIL` (also
    /// while a drain is under way: the drainer takes it).
    pub(super) fn take_hand(&self, lane: &Lane) -> Link {
        lane.handshake.begin();
        let mut hand = NIL;
        if lane.handshake.may_use() {
            hand = lane.hand.load(Ordering::Relaxed);
            lane.hand.store(NIL, Ordering::Relaxed);
        }
        lane.handshake.end();
        hand
    }

    /// Adds the removed slot `index` to the batch of `lane` (its owner only).
    #[inline]
    pub(super) fn add_removed(&self, lane: &Lane, index: u32) -> Added {
        lane.handshake.begin();
        let added = if lane.handshake.may_use() {
            let link = index + 1;
            let head = lane.removed.load(Ordering::Relaxed);
            self.links.at(index).store(head, Ordering::Relaxed);
            let len = lane.removed_len.load(Ordering::Relaxed).wrapping_add(1);
            if len >= self.removal_batch {
                lane.removed.store(NIL, Ordering::Relaxed);
                lane.removed_len.store(0, Ordering::Relaxed);
                Added::Full(link)
            } else {
                lane.removed.store(link, Ordering::Relaxed);
                lane.removed_len.store(len, Ordering::Relaxed);
                Added::Kept
            }
        } else {
            Added::Busy
        };
        lane.handshake.end();
        added
    }

    /// Takes the hand and batch of every lane that holds something, whatever its owner is
    /// doing: claims each, issues one heavy fence, waits for each owner to be out of the
    /// operation it was in. A lane another drainer holds is left to that one. The hands go
    /// back on their owners' shards; the batches are returned, as `(shard, head of chain)`.
    pub(super) fn drain_lanes(&self) -> Vec<(usize, Link)> {
        self.drain_lanes_where(|_| true)
    }

    /// As [`drain_lanes`](Self::drain_lanes), for the lanes whose hand or batch has not
    /// changed since the previous sweep looked: an idle or exited thread's, or the batch of
    /// a thread that inserts without removing (a thread that reuses an exited one's index
    /// inherits its lane). Parts in use change between sweeps (a hand shrinks with every
    /// insert, a batch grows with every removal), so they are left alone.
    pub(super) fn drain_idle_lanes(&self) -> Vec<(usize, Link)> {
        self.drain_lanes_where(|lane| {
            let hand = lane.hand.load(Ordering::Relaxed);
            let removed = lane.removed.load(Ordering::Relaxed);
            let stale = (hand != NIL && lane.seen_hand.load(Ordering::Relaxed) == hand)
                || (removed != NIL && lane.seen_removed.load(Ordering::Relaxed) == removed);
            lane.seen_hand.store(hand, Ordering::Relaxed);
            lane.seen_removed.store(removed, Ordering::Relaxed);
            stale
        })
    }

    /// Counts a refill of `lane`'s owner (the owner only); whether it should sweep. Every
    /// [`SWEEP_EVERY`]th refill of each thread in each arena: a sweep reads every lane of
    /// the arena (and issues a `membarrier` when it takes one), while a refill comes once per
    /// chain of inserts.
    pub(super) fn sweep_due(&self, lane: &Lane) -> bool {
        let refills = lane.refills.load(Ordering::Relaxed).wrapping_add(1);
        lane.refills.store(refills, Ordering::Relaxed);
        refills.is_multiple_of(SWEEP_EVERY)
    }

    /// Takes the hand and batch of every lane that holds something and that `pick` picks.
    fn drain_lanes_where(&self, mut pick: impl FnMut(&Lane) -> bool) -> Vec<(usize, Link)> {
        let mut claimed = Vec::new();
        for lane in self.lanes.iter() {
            // A racy look: a lane that seems empty is skipped. What its owner did before the
            // caller synchronised with it is visible here, so nothing the caller could know
            // of is missed.
            let holds = lane.hand.load(Ordering::Relaxed) != NIL
                || lane.removed.load(Ordering::Relaxed) != NIL;
            if holds && pick(lane) && lane.handshake.claim() {
                claimed.push((lane.shard, &**lane));
            }
        }
        if claimed.is_empty() {
            return Vec::new();
        }
        crate::sync::asymmetric::heavy();
        let mut batches = Vec::new();
        for (shard, lane) in claimed {
            lane.handshake.wait_out();
            // The owner is out, and its later operations see the claim: ours.
            let hand = lane.hand.load(Ordering::Relaxed);
            let removed = lane.removed.load(Ordering::Relaxed);
            lane.hand.store(NIL, Ordering::Relaxed);
            lane.removed.store(NIL, Ordering::Relaxed);
            lane.removed_len.store(0, Ordering::Relaxed);
            lane.handshake.release();
            if hand != NIL {
                self.push_chain(shard, hand);
            }
            if removed != NIL {
                batches.push((shard, removed));
            }
        }
        batches
    }
}
