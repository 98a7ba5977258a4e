//! Releasing vacant trailing pages while other threads keep using the arena.
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

use super::slot::{self, Slot};
use super::table::{ArenaInner, FROZEN};
use crate::paged::Page;
use crate::stack::NIL;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};

impl<T> ArenaInner<T> {
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
        // Every vacant slot, taken off its shard's list, grouped by page.
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
