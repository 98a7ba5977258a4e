//! [`SlotArena`]'s slow paths: an insert whose hand is empty (a *refill*: recycled, stolen
//! or fresh slots, and every 64th time a *sweep* of the caches and shared batches nobody
//! came back for), and a removal whose batch fills or that has no cache (deferring the batch
//! to the epoch collector). The fast paths, a hand's slot taken and a slot added to a batch,
//! are `mod.rs` and `cache.rs`; the batches themselves and the destructor rules, `recycle.rs`.

use super::cache::{Added, ArenaThreadCache};
use super::error::ArenaError;
use super::key::Key;
use super::panics::Panics;
use super::recycle::{flush_due, recycling, BatchSlots, PendingBatch};
use super::SlotArena;
use crate::sync::epoch::Guard;
use crate::sync::{Arc, Ordering};

impl<T: Send + 'static> SlotArena<T> {
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
        let sweep = !cfg!(loom) && cache.is_some_and(ArenaThreadCache::sweep_due);
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
            Some((cache, shard)) => (cache.add_removed(index), shard),
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

    /// [`try_insert`](Self::try_insert) when the calling thread's hand is empty: a vacant
    /// slot from [`refill`](Self::refill), with `value` handed back for the insert, or the
    /// error with `value`.
    #[cold]
    #[inline(never)]
    pub(super) fn refilled_slot(
        &self,
        cache: Option<(&ArenaThreadCache, usize)>,
        value: T,
    ) -> Result<(u32, T), (ArenaError, T)> {
        let arena = &self.arena;
        let (cache, shard) = match cache {
            Some((cache, shard)) => (Some(cache), shard),
            None => (None, arena.my_shard()),
        };
        let mut panics = Panics::default();
        let refilled = self.refill(cache, shard, &mut panics);
        if panics.caught() {
            // A recycled value's drop panicked. Give the slot back, drop `value` (in a
            // catch: its own drop may panic too, and a second panic while unwinding would
            // abort), then resume the first panic.
            if let Ok(index) = refilled {
                arena.push_one(shard, index);
            }
            panics.catch(|| drop(value));
            panics.resume();
            unreachable!("a caught panic was resumed");
        }
        match refilled {
            Ok(index) => Ok((index, value)),
            Err(error) => Err((error, value)),
        }
    }

    /// [`discard`](Self::discard) for a thread without a cache: a pinned `remove`.
    #[cold]
    #[inline(never)]
    pub(super) fn discard_without_cache(&self, key: Key) -> Result<(), ArenaError> {
        self.remove(key, &self.pin()).map(drop)
    }

    /// The rest of a [`discard`](Self::discard) whose slot did not simply join the cache's
    /// batch: defers the batch it filled, under a pin taken for that.
    #[cold]
    #[inline(never)]
    pub(super) fn defer_discarded(&self, added: Added<'_>, shard: usize, index: u32) {
        if let Some(slots) = self.batch_to_defer(added, shard, index) {
            self.defer_full_batch(shard, slots, &self.pin());
        }
    }
}
