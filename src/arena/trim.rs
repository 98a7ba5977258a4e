//! Memory held and given back: [`SlotArena`]'s `capacity` and `thread_state_bytes`, its
//! `flush` (every partial batch to the collector), `trim` and `shrink` (vacant trailing pages
//! to the system), and its drop; below them, the table's release of vacant trailing pages
//! while other threads keep using the arena.
//!
//! (`SlotArena::trim` first takes back the hands and batches of every thread's cache, so
//! that the slots idle threads hold are on the free lists too.)
//!
//! `trim` first *freezes* the frontier (sets [`FROZEN`] in it with a compare-exchange), so no
//! fresh slot can be claimed while it works; claims wait for it. It then takes every free
//! list, counts the vacant slots it took per page, and unlinks the trailing pages whose used
//! slots (those below the frontier) it holds all of. A page with a slot some thread is using
//! (popped, claimed, occupied, removed, being recycled) is never released, because that slot
//! is not on a free list. A claim allocates its page before it moves the frontier into it,
//! so every page below the frontier is allocated, but for one a claim is allocating again
//! after a trim released it (see `claim_chain_within`); a null page with used slots stops the
//! trim there. A page past the frontier holds no claimed slot and goes like any vacant page.
//! A claim may have allocated it and be about to claim from it: once its compare-exchange
//! succeeds, the claim allocates its page again if it is gone. Keeping such pages instead
//! stranded them for ever when the claim then lost its race to a trim that lowered the
//! frontier (a page of 8,192 slots under an arena with nothing in it). Finally the trim
//! lowers the frontier to the first released page and unfreezes it in one store, once it has
//! given the kept slots back to the shards they came from.
//!
//! Giving the slots back to their own shards, before unfreezing, matters to threads that
//! keep working meanwhile: given to the trimming thread's shard, or given back after a
//! claimer waiting for the frontier found its shard empty, they made a thread churning
//! beside frequent trims claim fresh slots at every trim (an arena of 500 live values grew
//! to 8 million slots in 6 s).

use super::error::ArenaError;
use super::panics::Panics;
use super::recycle::recycling;
use super::slot::{self, Slot, OCCUPIED, REMOVED, VACANT};
use super::table::{ArenaInner, FROZEN};
use super::SlotArena;
use crate::paged::Page;
use crate::stack::NIL;
use crate::sync::epoch::Guard;
use crate::sync::AtomicU32;
use crate::sync::Ordering::{self, AcqRel, Acquire, Relaxed, Release};

impl<T: Send + 'static> SlotArena<T> {
    /// Bytes the arena holds for per-thread state: the caches of the threads that used it
    /// (each with room for a removal batch), and the map that finds them. It follows how
    /// many threads used the arena, not how high their thread indices are.
    ///
    /// ```
    /// let arena = ferropool::SlotArena::new();
    /// assert_eq!(arena.thread_state_bytes(), 0);
    /// arena.insert(1u32)?;
    /// assert!(arena.thread_state_bytes() > 0 && arena.thread_state_bytes() < 64 << 10);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn thread_state_bytes(&self) -> usize {
        let batches = self.arena.caches.records_allocated() as usize
            * self.arena.shape.removal_batch as usize
            * std::mem::size_of::<AtomicU32>();
        self.arena.caches.footprint() + batches
    }

    /// Slots in allocated pages.
    ///
    /// ```
    /// use ferropool::{ArenaConfig, SlotArena};
    /// let config = ArenaConfig { first_page_len: 4, ..ArenaConfig::default() };
    /// let arena = SlotArena::with_config(config)?;
    /// assert_eq!(arena.capacity(), 0);
    /// for x in 0..5u32 {
    ///     arena.insert(x)?;
    /// }
    /// assert_eq!(arena.capacity(), 4 + 8); // pages of 4, then 8 slots
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        self.arena.slots.allocated()
    }

    /// Hands every partly filled removal batch to the collector now instead of when it
    /// fills, and recycles the batches whose grace period has passed. Call it at a step
    /// boundary to get removed slots back sooner.
    ///
    /// Every thread's batch is taken, whatever that thread is doing (idle or exited threads'
    /// included), together with the vacant slots it holds for its next inserts: a thread
    /// keeps both in its *cache*, which it works on without read-modify-writes, and a flush
    /// takes the caches back with one heavy fence (`membarrier` on Linux) when any holds
    /// something.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ferropool::SlotArena;
    /// let (arena, weights) = (SlotArena::new(), Arc::new([0.5f32; 4]));
    /// let key = arena.insert(Arc::clone(&weights))?;
    /// arena.remove(key, &arena.pin())?;
    /// for _ in 0..1000 {
    ///     if Arc::strong_count(&weights) == 1 { break; } // the removed value was dropped
    ///     arena.flush(&arena.pin())?;
    /// }
    /// assert_eq!(Arc::strong_count(&weights), 1);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ArenaError::ForeignGuard`] if `guard` is not pinned on this arena's collector.
    ///
    /// # Panics
    ///
    /// Resumes the panic of a removed value's `Drop` (see [Destructors](Self#destructors)).
    pub fn flush(&self, guard: &Guard) -> Result<(), ArenaError> {
        self.check_guard(guard)?;
        self.defer_every_batch(guard);
        guard.flush();
        self.collect_backlog(guard);
        let mut panics = Panics::default();
        self.recycle_every_ready(&mut panics);
        panics.resume();
        Ok(())
    }

    /// Takes every thread cache's hand and batch (the hands go back to their shards) and
    /// every shard's partly filled batch, and hands the batches to the collector.
    pub(super) fn defer_every_batch(&self, guard: &Guard) {
        let caches = self.arena.drain_caches();
        for (shard, slots) in caches.into_iter().chain(self.arena.take_partial_batches()) {
            self.defer_batch(shard, slots, guard);
        }
    }

    /// Recycles every shard's ready batches onto its own free list (unless this thread is
    /// recycling already, see `recycle::recycling`).
    pub(super) fn recycle_every_ready(&self, panics: &mut Panics) {
        recycling(|| {
            for shard in 0..self.arena.shards.len() {
                self.recycle_ready(shard, shard, panics);
            }
        });
    }

    /// Collects again while that moves this arena's batches onto its ready lists. One
    /// collection runs at most 8 of the collector's queued bags (crossbeam-epoch's bound),
    /// so without this a backlog queued while some reader stayed pinned (a bag per 8 full
    /// batches) would take a `flush` per 8 bags to recycle. Each extra collection must move
    /// a batch, so there are at most as many as batches were in transit at the start.
    pub(super) fn collect_backlog(&self, guard: &Guard) {
        let mut pending = self.ready.pending();
        let most = pending;
        for _ in 0..most {
            guard.flush();
            let now = self.ready.pending();
            if now >= pending {
                break;
            }
            pending = now;
        }
    }

    /// Returns vacant memory to the system: hands partly filled removal batches to the
    /// collector, recycles the batches whose grace period has passed, then releases the
    /// trailing pages whose slots are all vacant. Returns how many slots were released.
    ///
    /// Safe to call at any time from any thread: released memory is freed only after every
    /// operation of a thread cache in flight has ended (an unpinned [`discard`](Self::discard)
    /// may be reading a released page) and then an epoch grace period. So a `trim` waits
    /// for other threads' short cache operations, and one waits for ever on a thread stopped
    /// inside one (for example in the child of a `fork` taken at that moment).
    /// Removed values still in their grace period keep their pages (a later call gets
    /// them); so does every page below an occupied slot (keys never move). Keys into a
    /// released page stay stale: the page's next allocation starts its generations past
    /// every generation it reached. A call that meets another `trim` in progress, or an
    /// insert at [`ArenaConfig::max_slots`](crate::ArenaConfig::max_slots) looking for a
    /// vacant slot, releases no page (a later call does).
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let mut arena = SlotArena::new();
    /// let key = arena.insert(1u64)?;
    /// assert_eq!(arena.trim(), 0); // the page holds a live value
    /// arena.take(key)?;
    /// assert_eq!(arena.trim(), 64); // the default first page
    /// assert_eq!(arena.capacity(), 0);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Resumes the panic of a removed value's `Drop` (see [Destructors](Self#destructors)).
    pub fn trim(&self) -> u64 {
        let guard = self.pin();
        self.flush(&guard)
            .expect("the arena's own guard is pinned on its collector");
        let mut pages = Vec::new();
        let released = self.arena.release_vacant_pages(|page| pages.push(page));
        if !pages.is_empty() {
            // An unpinned `discard` may be reading a slot of these pages: wait for it.
            self.arena.wait_out_operations();
        }
        for page in pages {
            // SAFETY: the page is unlinked, and no operation of a thread cache that could
            // have reached it is still in flight; pinned readers that reached it before
            // are waited for by the grace period, after which the closure (which only frees
            // vacant slots: no `T` is dropped) runs.
            unsafe { guard.defer_unchecked(move || drop(page)) };
        }
        released
    }

    /// With exclusive access: recycles every removed value not still in transit through the
    /// collector (no reader can hold one: `&mut self` excludes readers), then releases the
    /// trailing vacant pages at once, as [`trim`](Self::trim) does. Returns the slots
    /// released.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let mut arena = SlotArena::new();
    /// let key = arena.insert(vec![0u8; 1024])?;
    /// arena.remove(key, &arena.pin())?;
    /// assert_eq!(arena.shrink(), 64); // the removed value is dropped, its page released
    /// assert_eq!(arena.capacity(), 0);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Resumes the panic of a removed value's `Drop` (see [Destructors](Self#destructors)),
    /// after the pages are released.
    pub fn shrink(&mut self) -> u64 {
        let mut panics = Panics::default();
        let arena = &self.arena;
        // Exclusive access: no owner is inside an operation on its cache, so draining waits
        // for nobody.
        let caches = arena.drain_caches();
        for (shard, slots) in caches.into_iter().chain(arena.take_partial_batches()) {
            arena.recycle(slots, shard, &mut panics);
        }
        for shard in 0..arena.shards.len() {
            self.recycle_ready(shard, shard, &mut panics);
        }
        // Exclusive access: no reader can hold a released page, so it is freed at once.
        let released = arena.release_vacant_pages(drop);
        panics.resume();
        released
    }
}

impl<T: Send + 'static> Drop for SlotArena<T> {
    fn drop(&mut self) {
        // No reader can exist (readers borrow the arena), so every value can be dropped now,
        // removed ones included, whether their batch is pending, in transit through the
        // collector or ready. A batch in transit later lands on a ready list nobody reads,
        // and is freed with it.
        let mut panics = Panics::default();
        self.arena.for_each_slot(|_, slot| {
            let state = slot.state.load(Ordering::Relaxed);
            let phase = slot::phase(state);
            if phase == OCCUPIED || phase == REMOVED {
                slot.state.store(
                    slot::state(slot::generation(state), VACANT),
                    Ordering::Relaxed,
                );
                panics.catch(|| {
                    // SAFETY: OCCUPIED or REMOVED means initialised (invariant on `state`);
                    // the state was just changed, so nothing drops it again.
                    slot.value
                        .with_mut(|value_ptr| unsafe { (*value_ptr).assume_init_drop() });
                });
            }
        });
        panics.resume_unless_unwinding();
    }
}

impl<T> ArenaInner<T> {
    /// Every vacant slot, taken off its shard's list (a shard's slots in order of their
    /// chains), and the count of them in each page. Only with the frontier frozen.
    fn take_vacant(&self) -> (Vec<Vec<u32>>, Vec<u64>) {
        let mut taken: Vec<Vec<u32>> = Vec::with_capacity(self.shards.len());
        let mut vacant_in_page = vec![0u64; self.slots.page_count()];
        for shard in self.shards.iter() {
            let mut of_shard = Vec::new();
            let mut chain = shard.free.take_all();
            while chain != NIL {
                let mut link = chain;
                chain = self.chains.at(chain - 1).load(Relaxed);
                while link != NIL {
                    of_shard.push(link - 1);
                    vacant_in_page[self.slots.locate(link - 1).0] += 1;
                    link = self.links.at(link - 1).load(Relaxed);
                }
            }
            taken.push(of_shard);
        }
        (taken, vacant_in_page)
    }

    /// Releases trailing pages whose used slots are all vacant; `dispose` receives each
    /// released page once no new reference into it can be made. Returns the slots released.
    pub(super) fn release_vacant_pages(&self, mut dispose: impl FnMut(Page<Slot<T>>)) -> u64 {
        let frontier = self.frontier.load(Acquire);
        if frontier & FROZEN != 0 {
            return 0; // another trim is running, or an insert at the cap is looking
        }
        if self
            .frontier
            .compare_exchange(frontier, frontier | FROZEN, AcqRel, Relaxed)
            .is_err()
        {
            return 0; // a claim or another trim moved it: try again later
        }
        let (taken, vacant_in_page) = self.take_vacant();
        // Unlink trailing pages whose used slots we hold all of. The last chunk claimed may
        // reach past `max_slots`; it stopped there.
        let claimed = frontier.min(self.shape.max_slots);
        let mut lowered = frontier;
        let mut released = 0;
        for k in (0..self.slots.page_count()).rev() {
            let start = self.slots.page_start(k);
            let used = claimed
                .saturating_sub(start)
                .min(self.slots.page_len(k) as u64);
            let Some(page) = self.slots.page(k) else {
                if used > 0 {
                    break; // a claim allocates it again (after its compare-exchange)
                }
                continue;
            };
            if vacant_in_page[k] != used {
                break;
            }
            let floor = page[..used as usize]
                .iter()
                .map(|slot| slot::generation(slot.state.load(Relaxed)))
                .fold(self.page_floor[k].load(Relaxed), u32::max);
            if floor == u32::MAX {
                break; // cannot promise fresh generations; keep the page
            }
            self.page_floor[k].store(floor, Relaxed);
            // SAFETY: no slot of the page is in use (all used ones are in `taken`, none can
            // be claimed while the frontier is frozen, and a claim that allocated a page past
            // the frontier before the freeze allocates it again if it wins its claim);
            // readers that reached it before are kept safe by `dispose` (see
            // `SlotArena::trim` and `shrink`).
            if let Some(page) = unsafe { self.slots.take_page(k) } {
                released += page.as_slice().len() as u64;
                dispose(page);
            }
            lowered = lowered.min(start);
        }
        // Give the slots of the pages kept back to the shards they came from (the threads
        // of a shard find their own slots again, on cache lines no other thread writes),
        // before unfreezing: a claimer waiting for the frontier pops its shard meanwhile, and
        // would otherwise find it empty and claim fresh slots.
        for (shard, of_shard) in taken.into_iter().enumerate() {
            let kept: Vec<u32> = of_shard
                .into_iter()
                .filter(|&i| u64::from(i) < lowered)
                .collect();
            // In chains of a chunk at most: a thread takes a whole chain into its hand.
            for chain in kept.chunks(self.shape.chunk as usize) {
                let mut head = NIL;
                for &index in chain.iter().rev() {
                    self.links.at(index).store(head, Relaxed);
                    head = index + 1;
                }
                self.push_chain(shard, head);
            }
        }
        // Unfreeze, lowered. Release: a claimer that adds to the frontier after this sees
        // the floors written above.
        self.frontier.store(lowered, Release);
        released
    }
}
