//! The slot table: pages of slots and their list links, the shards' lists, the threads'
//! caches, and the frontier past which fresh slots are claimed in chunks.
//!
//! Vacant slots travel in *chains* (linked through `links`, ending in `NIL`): a recycled
//! removal batch, a fresh chunk, a slot `take` freed. A shard's free list is a stack of
//! chains (linked through `chains`, by each chain's first slot), so a thread takes a whole
//! chain into its cache's hand with one compare-exchange.

use std::num::NonZeroU64;

use crossbeam_utils::CachePadded;

use super::cache::{Added, ArenaThreadCache, ArenaThreadCaches};
use super::error::ArenaError;
use super::key::Key;
use super::panics::Panics;
use super::recycle::BatchSlots;
use super::shard::{Shard, SharedBatch};
use super::slot::{self, Slot, OCCUPIED, REMOVED};
use crate::paged::{PagedTable, Place};
use crate::stack::{Link, NIL};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Set in the frontier while a `trim` runs: no fresh slot can be claimed then.
pub(super) const FROZEN: u64 = 1 << 63;

/// Fresh slots a shard claims at once (at most the first page's length, so that a chunk
/// never straddles two pages). Chunks keep one thread's slots on cache lines of their own.
pub(super) const CHUNK: u32 = 64;

/// What an arena fixes when it is made: its identity (in every key), and the sizes of its
/// tables that its configuration sets, in slots.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) id: NonZeroU64,
    /// Removed slots a thread gathers before it hands them to the collector.
    pub(super) removal_batch: u32,
    /// Fresh slots claimed at once.
    pub(super) chunk: u32,
    /// Slot indices below this may be claimed (`ArenaConfig::max_slots`): at most
    /// `u32::MAX`, which is reserved so that `index + 1` always fits a [`Link`]. The
    /// frontier may pass it (a chunk claimed across it stops there).
    pub(super) max_slots: u64,
    /// Fresh slots each shard may claim while other shards have vacant ones
    /// (`ArenaConfig::growth_before_stealing`, in slots).
    pub(super) growth_before_stealing: u64,
}

/// Slots, links and lists: the arena less its collector.
pub(super) struct ArenaInner<T> {
    /// Its identity and the sizes its configuration fixed (never change).
    pub(super) shape: Shape,
    /// The slots.
    ///
    /// Invariant: a page is released only by `trim`, when every slot in it below the
    /// frontier is on a free list `trim` took; its memory is freed after `trim` has waited
    /// out every thread cache's operation in flight and then an epoch grace period (or at
    /// once under exclusive access). So a slot reference obtained while pinned, inside an
    /// operation of a thread cache's handshake (used only within it), or through a slot one
    /// owns (popped, claimed, occupied by a live key, or in a removal batch), never
    /// dangles.
    pub(super) slots: PagedTable<Slot<T>>,
    /// The chain link of every slot (`Link` of the next slot of whichever chain it is in:
    /// vacant in a hand or on a free list, or removed in a shard's shared batch).
    ///
    /// Invariant: laid out as `slots` (the same first page length), so that one `locate`
    /// finds a slot and its link ([`slot_and_link`](Self::slot_and_link)).
    pub(super) links: PagedTable<AtomicU32>,
    /// For the first slot of a vacant chain on a shard's free list: the first slot of the
    /// chain below it. Never released while the arena lives (nor is `links`), so a racing pop
    /// that reads the entry of a chain another thread just took reads allocated memory.
    pub(super) chains: PagedTable<AtomicU32>,
    /// The first generation of every slot of page `k` when the page is next allocated: the
    /// generations a released page reached, so that keys from before a `trim` stay stale.
    pub(super) page_floor: Box<[AtomicU32]>,
    /// Slot indices below this have been claimed at least once, plus [`FROZEN`] while a
    /// `trim` runs (or while an insert at `max_slots` looks through every free list, see
    /// [`pop_at_the_cap`](Self::pop_at_the_cap), storing the same value back). Claims
    /// advance it with an `AcqRel` compare-exchange when it is not frozen, and `trim`
    /// unfreezes it with a `Release` store, so a claimer sees the page floors `trim` wrote.
    pub(super) frontier: CachePadded<AtomicU64>,
    /// The free lists and removal batches, by shard; the length is a power of two.
    pub(super) shards: Box<[Shard]>,
    /// The threads' caches, one per thread index that used the arena (a thread's shard is its
    /// cache's).
    pub(super) caches: ArenaThreadCaches,
}

// SAFETY: `ArenaInner` owns `T` values through raw page pointers. Sending it moves or drops them
// on the receiving thread, which needs `T: Send`.
unsafe impl<T: Send> Send for ArenaInner<T> {}
// SAFETY: through `&ArenaInner`, threads obtain `&T` (needs `T: Sync`) and drop values removed by
// other threads (needs `T: Send`). Every other access goes through atomics.
unsafe impl<T: Send + Sync> Sync for ArenaInner<T> {}

impl<T> ArenaInner<T> {
    /// The shard of the calling thread.
    #[inline]
    pub(super) fn my_shard(&self) -> usize {
        crate::thread::index_or_zero() & (self.shards.len() - 1)
    }

    /// Pops a chain of vacant slots from the free list of `shard`: its first slot's index
    /// (the rest follow through `links`).
    #[inline]
    pub(super) fn pop_chain(&self, shard: usize) -> Option<u32> {
        self.shards[shard].free.pop(|i| self.chains.at(i))
    }

    /// Publishes the vacant chain starting at `head` (which ends in `NIL`) on the free list
    /// of `shard`.
    pub(super) fn push_chain(&self, shard: usize, head: Link) {
        self.shards[shard]
            .free
            .push_chain(head, self.chains.at(head - 1));
    }

    /// Publishes the vacant slot `index` alone on the free list of `shard`.
    pub(super) fn push_one(&self, shard: usize, index: u32) {
        self.links.at(index).store(NIL, Ordering::Relaxed);
        self.push_chain(shard, index + 1);
    }

    /// Splits the vacant chain starting at `index`: returns `index`, and puts the rest into
    /// the hand of `cache` (or, when there is no cache or its hand is taken, on the free list
    /// of `shard`).
    pub(super) fn first_of_chain(
        &self,
        index: u32,
        cache: Option<&ArenaThreadCache>,
        shard: usize,
    ) -> u32 {
        let rest = self.links.at(index).load(Ordering::Relaxed);
        if rest != NIL && !cache.is_some_and(|cache| cache.fill_hand(rest)) {
            self.push_chain(shard, rest);
        }
        index
    }

    /// The chain link of the slot at `place`, a place the slots' `locate` gave (the slot's
    /// page allocated; the links' pages are never released).
    #[inline(always)]
    pub(super) fn link_at(&self, place: Place) -> &AtomicU32 {
        // SAFETY: `links` is laid out as `slots` (invariant on `links`), so a place of the
        // slots is one of the links.
        unsafe { self.links.at_place(place) }
    }

    /// The slot of `index` and its chain link, found with one `locate` for both; the slot's
    /// page must be allocated (the caller owns the slot, or keeps its page alive).
    #[inline(always)]
    pub(super) fn slot_and_link(&self, index: u32) -> (&Slot<T>, &AtomicU32) {
        let place = self.slots.locate(index);
        // SAFETY: `place` is the slots' own `locate`.
        (unsafe { self.slots.at_place(place) }, self.link_at(place))
    }

    /// The slot of `key` if the key is this arena's and its page is allocated.
    #[inline(always)]
    pub(super) fn resolve(&self, key: Key) -> Result<&Slot<T>, ArenaError> {
        if key.arena() != self.shape.id {
            return Err(self.foreign(key));
        }
        let place = self.slots.locate(key.index());
        // SAFETY: the slots' own `locate`.
        match unsafe { self.slots.get_place(place) } {
            Some(slot) => Ok(slot),
            None => Err(self.out_of_range(key)),
        }
    }

    /// The error for a key of another arena.
    #[cold]
    #[inline(never)]
    fn foreign(&self, key: Key) -> ArenaError {
        ArenaError::ForeignKey {
            key_arena: key.arena_id(),
            arena: self.shape.id.get(),
        }
    }

    /// The error for a key whose slot's page is not allocated.
    #[cold]
    #[inline(never)]
    fn out_of_range(&self, key: Key) -> ArenaError {
        ArenaError::OutOfRange {
            index: key.index(),
            capacity: self.slots.allocated(),
        }
    }

    /// The slot of `key` if it holds the key's value: resolved and `OCCUPIED` at the key's
    /// generation (an `Acquire` load, pairing with the inserter's `Release` store).
    #[inline]
    pub(super) fn live(&self, key: Key) -> Result<&Slot<T>, ArenaError> {
        let slot = self.resolve(key)?;
        let state = slot.state.load(Ordering::Acquire);
        if state == slot::state(key.generation(), OCCUPIED) {
            Ok(slot)
        } else {
            Err(stale(key, state))
        }
    }

    /// Marks the value of `key` removed: the one compare-exchange from `OCCUPIED` at the
    /// key's generation to `REMOVED` at the next, which exactly one remover wins (the others,
    /// and stale keys, get [`ArenaError::Stale`]). Returns the slot, whose value the winner
    /// hands to a removal batch. The caller keeps the slot's page alive (a pin, or an
    /// operation of its thread cache).
    #[inline(always)]
    pub(super) fn mark_removed(&self, key: Key) -> Result<&Slot<T>, ArenaError> {
        let slot = self.resolve(key)?;
        let generation = key.generation();
        slot.state
            .compare_exchange(
                slot::state(generation, OCCUPIED),
                slot::state(generation.wrapping_add(1), REMOVED),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map_err(|actual| stale(key, actual))?;
        Ok(slot)
    }

    /// Calls `f` on every slot below the frontier in an allocated page. The caller keeps
    /// the pages alive (a pin, or exclusive access).
    pub(super) fn for_each_slot<'a>(&'a self, mut f: impl FnMut(u32, &'a Slot<T>)) {
        let frontier = (self.frontier.load(Ordering::Acquire) & !FROZEN).min(self.shape.max_slots);
        for k in 0..self.slots.page_count() {
            let start = self.slots.page_start(k);
            if start >= frontier {
                break;
            }
            let Some(page) = self.slots.page(k) else {
                continue;
            };
            let used = (frontier - start).min(page.len() as u64) as usize;
            for (offset, slot) in page[..used].iter().enumerate() {
                f((start + offset as u64) as u32, slot);
            }
        }
    }

    /// Takes every shard's partly filled removal batch: `(shard, its chain)` for each shard
    /// that had one.
    pub(super) fn take_partial_batches(&self) -> impl Iterator<Item = (usize, BatchSlots)> + '_ {
        self.shards.iter().enumerate().filter_map(|(shard, lists)| {
            let taken =
                SharedBatch(lists.removed.swap(SharedBatch::EMPTY.0, Ordering::AcqRel)).head();
            (taken != NIL).then_some((shard, BatchSlots::Chain(taken)))
        })
    }

    /// Takes the shards' partly filled removal batches that have not changed since the
    /// previous sweep looked: `(shard, its chain)` for each.
    pub(super) fn take_stale_partial_batches(&self) -> Vec<(usize, BatchSlots)> {
        let mut taken = Vec::new();
        for (shard, lists) in self.shards.iter().enumerate() {
            let removed = lists.removed.load(Ordering::Relaxed);
            let seen = lists.seen_removed.load(Ordering::Relaxed);
            lists.seen_removed.store(removed, Ordering::Relaxed);
            if removed != SharedBatch::EMPTY.0
                && removed == seen
                && lists
                    .removed
                    .compare_exchange(
                        removed,
                        SharedBatch::EMPTY.0,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                taken.push((shard, BatchSlots::Chain(SharedBatch(removed).head())));
            }
        }
        taken
    }

    /// Claims a chunk of never-used slots: returns one, and puts the rest into the hand of
    /// `cache` (or on the free list of `shard`). Waits while a `trim` has the frontier frozen.
    #[cold]
    pub(super) fn claim_fresh(
        &self,
        cache: Option<&ArenaThreadCache>,
        shard: usize,
    ) -> Result<u32, ArenaError> {
        match self.claim_chain_within(shard, u64::MAX)? {
            Some((index, _)) => Ok(self.first_of_chain(index, cache, shard)),
            // No claim costs more than `u64::MAX` slots: never reached.
            None => Err(ArenaError::Full {
                capacity: self.shape.max_slots,
            }),
        }
    }

    /// Claims a chunk of never-used slots as a vacant chain, unless the claim would cost more
    /// than `allowance` slots of memory: the chunk, or the whole page when the chunk starts a
    /// page not allocated yet. Returns the chain's first slot and what it cost, or `None`
    /// when refused. While a `trim` has the frontier frozen, a chain from the free list of
    /// `shard` (at no cost) once the trim gave them back.
    #[cold]
    pub(super) fn claim_chain_within(
        &self,
        shard: usize,
        allowance: u64,
    ) -> Result<Option<(u32, u64)>, ArenaError> {
        let chunk = u64::from(self.shape.chunk);
        let mut frontier = self.frontier.load(Ordering::Acquire);
        let (start, cost) = loop {
            if frontier & FROZEN != 0 {
                // A trim is running (briefly): it gives vacant slots back when done.
                if let Some(index) = self.pop_chain(shard) {
                    return Ok(Some((index, 0)));
                }
                crate::sync::yield_now();
                frontier = self.frontier.load(Ordering::Acquire);
                continue;
            }
            if frontier >= self.shape.max_slots {
                return Err(ArenaError::Full {
                    capacity: self.shape.max_slots,
                });
            }
            // Checked against the frontier the compare-exchange below claims from. A trim
            // may release the page before that compare-exchange succeeds, and the claim then
            // allocates it again after it (below), at a cost this figure leaves out: growth
            // past `allowance` is bounded by a page per such race.
            let (page, cost) = self.claim_cost(frontier, chunk);
            if cost > allowance {
                return Ok(None);
            }
            // The page before the claim: a page the system refuses is then an error with
            // nothing claimed (a claimed chunk cannot be given back), unless a trim releases
            // it before the compare-exchange below (handled after it).
            self.allocate_page(page)?;
            // AcqRel: see the invariant on `frontier`.
            match self.frontier.compare_exchange_weak(
                frontier,
                frontier + chunk,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break (frontier, cost),
                Err(actual) => frontier = actual,
            }
        };
        let end = (start + chunk).min(self.shape.max_slots) as u32;
        let start = start as u32;
        // A chunk lies within one page: pages start at multiples of the first page's length,
        // which the chunk divides.
        let (page, _) = self.slots.locate(start);
        // A trim may have released the page after this claim allocated it, and unfrozen the
        // frontier at the value this claim read: the page was past the frontier (a trim
        // releases such a page; keeping it, when the claim then lost its race, stranded it
        // for ever), or other claims took slots past that value, the trim released their
        // page (all vacant again) and lowered the frontier to it. Then the page is gone, or
        // allocated again (by this claim, racing that trim) with the generation floor from
        // before the release. The chunk is this claim's now (a trim keeps a page with
        // claimed slots not on a free list), so: allocate the page if it is gone, and start
        // the chunk's slots at the page's floor. `AcqRel` on the compare-exchange: it read
        // the frontier that trim unfroze (`Release`), or a later claim's, so the floor it
        // wrote is seen.
        let floor = self.page_floor[page].load(Ordering::Relaxed);
        if !self.slots.has_page(page) {
            // The system refusing it here ends the process, as a refused `Box::new` does: the
            // claim cannot be undone. It takes that race and an out-of-memory at once.
            self.slots.ensure_page(page, |_| Slot::vacant(floor));
        }
        for index in start..end {
            // Fresh slots, never handed out since their page was allocated: their generation
            // is the floor that allocation read, at most the floor now. Linked in order.
            let (slot, link) = self.slot_and_link(index);
            slot.state
                .store(slot::state(floor, slot::VACANT), Ordering::Relaxed);
            let next = if index + 1 < end { index + 2 } else { NIL };
            link.store(next, Ordering::Relaxed);
        }
        Ok(Some((start, cost)))
    }

    /// The page a claim of a `chunk` of slots from `frontier` falls in, and what it costs: the
    /// chunk, or the whole page when the chunk starts a page not allocated yet.
    fn claim_cost(&self, frontier: u64, chunk: u64) -> (usize, u64) {
        let (page, _) = self.slots.locate(frontier as u32);
        let cost = if self.slots.has_page(page) {
            chunk
        } else {
            self.slots.page_len(page) as u64
        };
        (page, cost)
    }

    /// Once the frontier has reached `max_slots`: a chain from any shard's free list (this
    /// shard's first), looked for with the frontier frozen, as `trim` freezes it. A trim
    /// holds the free lists only while it holds the frontier frozen, so none holds them then,
    /// and one that freezes it first is waited for. So is a drainer (a `flush`, `trim` or
    /// sweep) that holds a thread's hand on its way back to the lists. `Ok(None)` when a
    /// trim lowered the frontier below `max_slots` (the caller claims fresh slots);
    /// [`ArenaError::Full`] when no list has a vacant slot.
    #[cold]
    pub(super) fn pop_at_the_cap(&self, shard: usize) -> Result<Option<u32>, ArenaError> {
        let shards = self.shards.len();
        loop {
            let frontier = self.frontier.load(Ordering::Acquire);
            if frontier & FROZEN != 0 {
                // A trim, or another insert at the cap: it gives the lists back when done.
                if let Some(index) = self.pop_chain(shard) {
                    return Ok(Some(index));
                }
                crate::sync::yield_now();
                continue;
            }
            if frontier < self.shape.max_slots {
                return Ok(None);
            }
            // Acquire (on success): the slots a trim gave back before it unfroze the frontier
            // (`Release`) are on the lists this reads.
            if self
                .frontier
                .compare_exchange(
                    frontier,
                    frontier | FROZEN,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            let pop_any = || {
                (0..shards)
                    .map(|k| (shard + k) & (shards - 1))
                    .find_map(|from| self.pop_chain(from))
            };
            let mut found = pop_any();
            let draining = found.is_none() && self.caches.iter().any(|cache| cache.is_claimed());
            if !draining && found.is_none() {
                // A drainer that handed its cache back before that look pushed the hand
                // first: on the lists now.
                found = pop_any();
            }
            // Unfreeze, unchanged: nothing was claimed or released.
            self.frontier.store(frontier, Ordering::Release);
            if draining {
                crate::sync::yield_now();
                continue;
            }
            return match found {
                Some(index) => Ok(Some(index)),
                None => Err(ArenaError::Full {
                    capacity: self.shape.max_slots,
                }),
            };
        }
    }

    /// Allocates page `page` of the slot, link and chain tables, those not allocated yet:
    /// vacant slots at the page's generation floor.
    fn allocate_page(&self, page: usize) -> Result<(), ArenaError> {
        let refused = |_| {
            let slots = self.slots.page_len(page) as u64;
            ArenaError::OutOfMemory {
                slots,
                bytes: slots.saturating_mul(std::mem::size_of::<Slot<T>>() as u64),
            }
        };
        let floor = self.page_floor[page].load(Ordering::Relaxed);
        self.links
            .try_ensure_page(page, |_| AtomicU32::new(NIL))
            .map_err(refused)?;
        self.chains
            .try_ensure_page(page, |_| AtomicU32::new(NIL))
            .map_err(refused)?;
        self.slots
            .try_ensure_page(page, |_| Slot::vacant(floor))
            .map_err(refused)
    }

    /// Drops the values of a removal batch's slots and publishes the slots on the free list
    /// of `shard`, in chains of a chunk at most (an exhausted slot is left out for good).
    ///
    /// The batch's grace period has passed (it came off a ready list), or the caller has
    /// exclusive access: no reader can see the values.
    pub(super) fn recycle(&self, slots: BatchSlots, shard: usize, panics: &mut Panics) {
        match slots {
            BatchSlots::Indices(indices) => {
                self.recycle_slots(indices.iter().copied(), shard, panics);
            }
            BatchSlots::Chain(head) => self.recycle_slots(self.chain(head), shard, panics),
        }
    }

    /// The slots of the removed chain starting at `head`. Each slot's link is read before
    /// the slot is yielded, so recycling may link the slot into another chain.
    fn chain(&self, head: Link) -> impl Iterator<Item = u32> + '_ {
        let mut link = head;
        std::iter::from_fn(move || {
            let index = link.checked_sub(1)?; // `NIL` ends the chain
            link = self.links.at(index).load(Ordering::Relaxed);
            Some(index)
        })
    }

    fn recycle_slots(&self, indices: impl Iterator<Item = u32>, shard: usize, panics: &mut Panics) {
        let (mut vacant_head, mut vacant_len) = (NIL, 0);
        for index in indices {
            let (slot, link_of_slot) = self.slot_and_link(index);
            let state = slot.state.load(Ordering::Acquire);
            debug_assert_eq!(slot::phase(state), REMOVED);
            // First the state, then the drop: a value whose drop panics has been dropped, and
            // nothing may drop it again (invariant on `Slot::state`). The slot is on no list
            // until the chain is published below, so a destructor that inserts cannot take it.
            let vacant = slot.vacate(slot::generation(state));
            if vacant {
                link_of_slot.store(vacant_head, Ordering::Relaxed);
                vacant_head = index + 1;
                vacant_len += 1;
            }
            panics.catch(|| {
                slot.value.with_mut(|value_ptr| {
                    // SAFETY: REMOVED means initialised; this batch was taken off a ready list
                    // (or out of a cache or a shard under exclusive access) by this call alone,
                    // after its grace period, so no reader holds the value and nobody else
                    // drops it.
                    unsafe { (*value_ptr).assume_init_drop() }
                });
            });
            // Chains of a chunk at most (a thread takes a whole chain into its hand), each
            // published once every value in it is dropped.
            if vacant_len == self.shape.chunk {
                self.push_chain(shard, vacant_head);
                (vacant_head, vacant_len) = (NIL, 0);
            }
        }
        if vacant_head != NIL {
            self.push_chain(shard, vacant_head);
        }
    }
}

/// The error for a key whose slot is not `OCCUPIED` at the key's generation.
#[cold]
pub(super) fn stale(key: Key, state: u64) -> ArenaError {
    ArenaError::Stale {
        index: key.index(),
        generation: key.generation(),
        current_generation: slot::generation(state),
        phase: slot::slot_phase(state),
    }
}

/// The caches: each thread's hand of vacant slots and batch of removed ones (see `cache`).
impl<T> ArenaInner<T> {
    /// The calling thread's cache, and its shard; `None` for a thread without an index.
    #[inline]
    pub(super) fn my_cache(&self) -> Option<(&ArenaThreadCache, usize)> {
        if let Some((cache, _)) = crate::thread::remembered_arena_cache(self.shape.id.get()) {
            // SAFETY: this thread cached the pointer for this arena's identity (never reused,
            // so this arena, which `&self` keeps alive) and its current index (the cache is
            // cleared when the index is given back); a cache page stays allocated, at the same
            // address, until the arena drops.
            let cache = unsafe { &*cache.cast::<ArenaThreadCache>() };
            return Some((cache, cache.shard()));
        }
        self.find_my_cache()
    }

    /// [`my_cache`](Self::my_cache) without the thread's cached pointer: finds or makes the
    /// cache, and caches it.
    #[cold]
    fn find_my_cache(&self) -> Option<(&ArenaThreadCache, usize)> {
        let index = u32::try_from(crate::thread::index()?).ok()?;
        let shards = self.shards.len();
        let cache: &ArenaThreadCache = self.caches.get_or_claim(index, |number| {
            CachePadded::new(ArenaThreadCache::new(
                number as usize & (shards - 1),
                self.shape.removal_batch,
            ))
        })?;
        crate::thread::remember_arena_cache(self.shape.id.get(), std::ptr::from_ref(cache).cast());
        Some((cache, cache.shard()))
    }

    /// Takes a slot from the hand of `cache` (its owner only): its index, and the slot.
    #[inline]
    pub(super) fn pop_hand(&self, cache: &ArenaThreadCache) -> Option<(u32, &Slot<T>)> {
        let mut slot = None;
        let index = cache.pop_hand(|index| {
            let (found, link) = self.slot_and_link(index);
            slot = Some(found);
            link.load(Ordering::Relaxed)
        })?;
        Some((index, slot?))
    }

    /// Removes the value of `key` without an epoch pin (its owner only): marks the slot
    /// removed and adds it to the batch of `cache`, all inside one operation of the cache's
    /// handshake. The operation is what keeps the key's page allocated while it is read (a
    /// stale key may point into a page a concurrent `trim` releases): `trim` waits out every
    /// operation in flight before it frees a page (see [`wait_out_operations`]).
    ///
    /// [`wait_out_operations`]: Self::wait_out_operations
    #[inline]
    pub(super) fn discard_in<'c>(
        &self,
        cache: &'c ArenaThreadCache,
        key: Key,
    ) -> Result<Added<'c>, ArenaError> {
        cache.remove_into_batch(|| self.mark_removed(key).map(|_| key.index()))
    }

    /// Adds the removed slot `index` to the shared removal batch of `shard` (a thread
    /// without a cache, or whose cache a drainer holds); returns the batch's head when this
    /// filled it: the caller defers it.
    pub(super) fn add_shared_removed(&self, shard: usize, index: u32) -> Option<Link> {
        let removed = &self.shards[shard].removed;
        let link = index + 1;
        let next = self.links.at(index);
        let mut current = removed.load(Ordering::Relaxed);
        loop {
            let batch = SharedBatch(current);
            next.store(batch.head(), Ordering::Relaxed);
            let (new, full) = if batch.count() + 1 >= self.shape.removal_batch {
                (SharedBatch::EMPTY, true)
            } else {
                (SharedBatch::new(batch.count() + 1, link), false)
            };
            match removed.compare_exchange_weak(current, new.0, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return full.then_some(link),
                Err(actual) => current = actual,
            }
        }
    }

    /// Waits out every operation of a thread cache that is in flight: called by `trim`
    /// after it unlinked pages and before it frees them. An operation that began after the
    /// heavy fence sees the pages unlinked (the fence pairs with the one in
    /// `Handshake::begin`); one that began before is waited for. An unpinned `discard`
    /// reads its slot only inside such an operation.
    pub(super) fn wait_out_operations(&self) {
        crate::sync::asymmetric::heavy();
        for cache in self.caches.iter() {
            cache.wait_out();
        }
    }

    /// Takes the hand and batch of every cache that holds something, whatever its owner is
    /// doing: claims each, issues one heavy fence, waits for each owner to be out of the
    /// operation it was in. A cache another drainer holds is left to that one. The hands go
    /// back on their owners' shards; the batches are returned, as `(shard, slots)`.
    pub(super) fn drain_caches(&self) -> Vec<(usize, BatchSlots)> {
        self.drain_caches_where(|_| true)
    }

    /// As [`drain_caches`](Self::drain_caches), for the caches whose hand or batch has not
    /// changed since the previous sweep looked (see
    /// [`ArenaThreadCache::unchanged_since_last_sweep`]; a thread that reuses an exited
    /// one's index inherits its cache).
    pub(super) fn drain_idle_caches(&self) -> Vec<(usize, BatchSlots)> {
        self.drain_caches_where(ArenaThreadCache::unchanged_since_last_sweep)
    }

    /// Takes the hand and batch of every cache that holds something and that `pick` picks.
    fn drain_caches_where(
        &self,
        mut pick: impl FnMut(&ArenaThreadCache) -> bool,
    ) -> Vec<(usize, BatchSlots)> {
        let mut claimed = Vec::new();
        for cache in self.caches.iter() {
            // A racy look: a cache that seems empty is skipped. What its owner did before the
            // caller synchronised with it is visible here, so nothing the caller could know
            // of is missed.
            if cache.holds() && pick(cache) && cache.claim() {
                claimed.push((cache.shard(), &**cache));
            }
        }
        if claimed.is_empty() {
            return Vec::new();
        }
        crate::sync::asymmetric::heavy();
        let mut batches = Vec::new();
        for (shard, cache) in claimed {
            let (hand, removed) = cache.take_claimed();
            // The hand on its shard's list before the claim ends: an insert at the cap that
            // sees no claim finds it there (`pop_at_the_cap`).
            if hand != NIL {
                self.push_chain(shard, hand);
            }
            cache.hand_back();
            if !removed.is_empty() {
                batches.push((shard, BatchSlots::Indices(removed)));
            }
        }
        batches
    }
}
