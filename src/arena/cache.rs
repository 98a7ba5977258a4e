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

use crate::handshake::Handshake;
use crate::roster::Roster;
use crate::stack::NIL;
use crate::sync::{AtomicU32, Ordering};

/// Thread caches in the first page of an arena's roster (later pages double).
pub(super) const FIRST_CACHES: u32 = 4;

/// Refills of a thread in an arena between two of its sweeps.
pub(super) const SWEEP_EVERY: u32 = 64;

/// One thread's cache in one arena.
pub(super) struct ArenaThreadCache {
    /// The shard of the cache's threads: its number in the arena's roster modulo the shard
    /// count, so threads spread over the shards in the order they first used the arena.
    /// Fixed when the cache's page is built.
    pub(super) shard: usize,
    /// The owner's operations and the drainers' flag.
    pub(super) handshake: Handshake,
    /// Vacant slots for the owner's next inserts: a chain linked through `ArenaInner::links`,
    /// ending in `NIL`.
    ///
    /// Invariant (also for `removed_len`, and for `removed` with the exception written
    /// there): read or written only by the owner inside an operation that found the
    /// handshake free to use, or by a drainer that claimed the handshake once the owner is
    /// out, or under exclusive access to the arena.
    pub(super) hand: AtomicU32,
    /// The owner's removal batch being filled: the indices of `REMOVED` slots, in
    /// `removed[..removed_len]` (`removal_batch` entries in all).
    ///
    /// Invariant: as on `hand`, with one exception. When an operation of the owner fills the
    /// batch, it sets `removed_len` to 0, and the entries keep the full batch until the
    /// owner's next operation; the owner copies them out before that, outside any operation
    /// ([`full_batch`](Self::full_batch)). Only the owner writes entries, and a drainer reads
    /// only the first `removed_len`, so the copy races with nobody.
    pub(super) removed: Box<[AtomicU32]>,
    /// Slots in `removed`. Drainers and sweeps also read it without a claim, as a hint (a
    /// cache that seems empty is skipped, as with `hand`).
    pub(super) removed_len: AtomicU32,
    /// `hand` and [`newest_removed`](Self::newest_removed) as a sweep last saw them (written
    /// by sweepers only; racing sweepers at worst take a cache one sweep later, or earlier).
    pub(super) seen_hand: AtomicU32,
    pub(super) seen_removed: AtomicU32,
    /// The owner's refills of this arena, for its sweeps (the owner's alone: a plain load
    /// and store).
    pub(super) refills: AtomicU32,
}

/// What `ArenaInner::add_removed` (or `discard_in`) did with a removed slot.
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

    /// The batch that the owner's last operation filled ([`Added::Full`]): a copy of its
    /// indices, taken by the owner before its next operation on the cache (invariant on
    /// `removed`).
    pub(super) fn full_batch(&self) -> Box<[u32]> {
        self.first_removed(self.removed.len())
    }

    /// A copy of the first `len` entries of `removed` (at most all of them).
    pub(super) fn first_removed(&self, len: usize) -> Box<[u32]> {
        self.removed[..len.min(self.removed.len())]
            .iter()
            .map(|entry| entry.load(Ordering::Relaxed))
            .collect()
    }

    /// The link of the slot last added to the batch (`NIL` when it is empty), read without
    /// a claim: for sweeps, whether the batch changed since they last looked. A hint, as
    /// `seen_removed` says; it is derived from the batch, so removals store nothing more.
    pub(super) fn newest_removed(&self) -> u32 {
        let len = self.removed_len.load(Ordering::Relaxed) as usize;
        len.checked_sub(1)
            .and_then(|last| self.removed.get(last))
            .map_or(NIL, |entry| entry.load(Ordering::Relaxed).wrapping_add(1))
    }
}

/// The caches of an arena: one per thread index that used it (see `crate::roster`).
pub(super) type ArenaThreadCaches = Roster<CachePadded<ArenaThreadCache>>;
