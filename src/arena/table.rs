//! The slot table: pages of slots and their list links, the shards' lists, and the frontier
//! past which fresh slots are claimed in chunks.

use std::num::NonZeroU64;

use crossbeam_utils::CachePadded;

use super::recycle::Panics;
use super::shard::Shard;
use super::slot::{self, Slot, OCCUPIED, REMOVED};
use super::{ArenaError, Key};
use crate::paged::PagedTable;
use crate::stack::{Link, NIL};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Slot indices are `u32`; `u32::MAX` is reserved so that `index + 1` always fits a [`Link`].
pub(super) const MAX_SLOTS: u64 = u32::MAX as u64;

/// Set in the frontier while a `trim` runs: no fresh slot can be claimed then.
pub(super) const FROZEN: u64 = 1 << 63;

/// Fresh slots a shard claims at once (at most the first page's length, so that a chunk
/// never straddles two pages). Chunks keep one thread's slots on cache lines of their own.
pub(super) const CHUNK: u32 = 64;

/// Slots, links and lists: the arena less its collector.
pub(super) struct Arena<T> {
    pub(super) id: NonZeroU64,
    pub(super) removal_batch: u32,
    /// Fresh slots claimed at once.
    pub(super) chunk: u32,
    /// Fresh slots each shard may claim while other shards have vacant ones
    /// (`ArenaConfig::growth_before_stealing`, in slots).
    pub(super) growth_before_stealing: u64,
    /// The slots.
    ///
    /// Invariant: a page is released only by `trim`, when every slot in it below the
    /// frontier is on a free list `trim` took; its memory is freed after an epoch grace
    /// period (or at once under exclusive access). So a slot reference obtained while
    /// pinned, or through a slot one owns (popped, claimed, occupied by a live key, or in a
    /// removal batch), never dangles.
    pub(super) slots: PagedTable<Slot<T>>,
    /// The list link of every slot (`Link` of the next slot on whichever list it is on).
    /// Never released while the arena lives, so a racing pop that reads the link of a slot
    /// another thread just took reads allocated memory.
    pub(super) links: PagedTable<AtomicU32>,
    /// The first generation of every slot of page `k` when the page is next allocated: the
    /// generations a released page reached, so that keys from before a `trim` stay stale.
    pub(super) page_floor: Box<[AtomicU32]>,
    /// Slot indices below this have been claimed at least once, plus [`FROZEN`] while a
    /// `trim` runs. Claims advance it with an `AcqRel` compare-exchange when it is not
    /// frozen, and `trim` unfreezes it with a `Release` store, so a claimer sees the page
    /// floors `trim` wrote.
    pub(super) frontier: CachePadded<AtomicU64>,
    /// The free lists and removal batches, by shard; the length is a power of two.
    pub(super) shards: Box<[Shard]>,
}

// SAFETY: `Arena` owns `T` values through raw page pointers. Sending it moves or drops them
// on the receiving thread, which needs `T: Send`.
unsafe impl<T: Send> Send for Arena<T> {}
// SAFETY: through `&Arena`, threads obtain `&T` (needs `T: Sync`) and drop values removed by
// other threads (needs `T: Send`). Every other access goes through atomics.
unsafe impl<T: Send + Sync> Sync for Arena<T> {}

impl<T> Arena<T> {
    /// The shard of the calling thread.
    #[inline]
    pub(super) fn my_shard(&self) -> usize {
        crate::thread::shard() & (self.shards.len() - 1)
    }

    /// Pops a vacant slot from the free list of `shard`.
    #[inline]
    pub(super) fn pop_free(&self, shard: usize) -> Option<u32> {
        self.shards[shard].free.pop(|i| self.links.at(i))
    }

    /// Publishes the chain `head ..= tail` (linked through `links`) on the free list of
    /// `shard`.
    pub(super) fn push_free(&self, shard: usize, head: Link, tail: Link) {
        self.shards[shard]
            .free
            .push_chain(head, self.links.at(tail - 1));
    }

    /// The slot of `key` if the key is this arena's and its page is allocated.
    #[inline]
    pub(super) fn resolve(&self, key: Key) -> Result<&Slot<T>, ArenaError> {
        if key.arena() != self.id {
            return Err(ArenaError::ForeignKey {
                key_arena: key.arena_id(),
                arena: self.id.get(),
            });
        }
        self.slots
            .get(key.index())
            .ok_or_else(|| ArenaError::OutOfRange {
                index: key.index(),
                capacity: self.slots.allocated(),
            })
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

    /// Calls `f` on every slot below the frontier in an allocated page. The caller keeps
    /// the pages alive (a pin, or exclusive access).
    pub(super) fn for_each_slot<'a>(&'a self, mut f: impl FnMut(u32, &'a Slot<T>)) {
        let frontier = (self.frontier.load(Ordering::Acquire) & !FROZEN).min(MAX_SLOTS);
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

    /// Takes every shard's partly filled removal batch: `(shard, head of its chain)` for
    /// each shard that had one.
    pub(super) fn take_partial_batches(&self) -> impl Iterator<Item = (usize, Link)> + '_ {
        self.shards.iter().enumerate().filter_map(|(shard, lists)| {
            let taken = lists.removed.swap(0, Ordering::AcqRel) as Link;
            (taken != NIL).then_some((shard, taken))
        })
    }

    /// Claims a chunk of never-used slots for `shard`: returns one, publishes the rest on
    /// the shard's free list. Waits while a `trim` has the frontier frozen.
    #[cold]
    pub(super) fn claim_fresh(&self, shard: usize) -> Result<u32, ArenaError> {
        match self.claim_fresh_within(shard, u64::MAX)? {
            Some((index, _)) => Ok(index),
            // No claim costs more than `u64::MAX` slots: never reached.
            None => Err(ArenaError::Full {
                capacity: MAX_SLOTS,
            }),
        }
    }

    /// As [`claim_fresh`](Self::claim_fresh), unless the claim would cost more than
    /// `allowance` slots of memory: the chunk, or the whole page when the chunk starts a page
    /// not allocated yet. Returns the slot and what it cost, or `None` when refused.
    #[cold]
    pub(super) fn claim_fresh_within(
        &self,
        shard: usize,
        allowance: u64,
    ) -> Result<Option<(u32, u64)>, ArenaError> {
        let chunk = u64::from(self.chunk);
        let mut frontier = self.frontier.load(Ordering::Acquire);
        let (start, cost) = loop {
            if frontier & FROZEN != 0 {
                // A trim is running (briefly): it gives vacant slots back when done.
                if let Some(index) = self.pop_free(shard) {
                    return Ok(Some((index, 0)));
                }
                crate::sync::yield_now();
                frontier = self.frontier.load(Ordering::Acquire);
                continue;
            }
            if frontier >= MAX_SLOTS {
                return Err(ArenaError::Full {
                    capacity: MAX_SLOTS,
                });
            }
            // Checked against the frontier the compare-exchange below claims from: a page,
            // once allocated, stays so while the frontier is not frozen.
            let (page, _) = self.slots.locate(frontier as u32);
            let cost = if self.slots.has_page(page) {
                chunk
            } else {
                self.slots.page_len(page) as u64
            };
            if cost > allowance {
                return Ok(None);
            }
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
        let end = (start + chunk).min(MAX_SLOTS) as u32;
        let start = start as u32;
        // A chunk lies within one page: pages start at multiples of the first page's length,
        // which the chunk divides.
        let (page, _) = self.slots.locate(start);
        let floor = self.page_floor[page].load(Ordering::Relaxed);
        self.links.ensure_page(page, |_| AtomicU32::new(NIL));
        self.slots.ensure_page(page, |_| Slot::vacant(floor));
        if end - start > 1 {
            // Link start + 1 .. end in order and publish them.
            for index in start + 1..end - 1 {
                self.links.at(index).store(index + 2, Ordering::Relaxed);
            }
            self.push_free(shard, start + 2, end);
        }
        Ok(Some((start, cost)))
    }

    /// Drops the values of the removed chain starting at `head` and publishes its slots on
    /// the free list of `shard` (an exhausted slot is left out for good).
    ///
    /// The chain's grace period has passed (it came off a ready list), or the caller has
    /// exclusive access: no reader can see the values.
    pub(super) fn recycle_chain(&self, head: Link, shard: usize, panics: &mut Panics) {
        let (mut vacant_head, mut vacant_tail) = (NIL, NIL);
        let mut link = head;
        while link != NIL {
            let index = link - 1;
            let next = self.links.at(index).load(Ordering::Relaxed);
            let slot = self.slots.at(index);
            let state = slot.state.load(Ordering::Acquire);
            debug_assert_eq!(slot::phase(state), REMOVED);
            // First the state, then the drop: a value whose drop panics has been dropped, and
            // nothing may drop it again (invariant on `Slot::state`). The slot is on no list
            // until the chain is published below, so a destructor that inserts cannot take it.
            if slot.vacate(slot::generation(state)) {
                self.links.at(index).store(vacant_head, Ordering::Relaxed);
                if vacant_tail == NIL {
                    vacant_tail = link;
                }
                vacant_head = link;
            }
            panics.catch(|| {
                slot.value.with_mut(|value_ptr| {
                    // SAFETY: REMOVED means initialised; this chain was taken off a ready list
                    // (or a removal batch under exclusive access) by this call alone, after its
                    // grace period, so no reader holds the value and nobody else drops it.
                    unsafe { (*value_ptr).assume_init_drop() }
                });
            });
            link = next;
        }
        if vacant_head != NIL {
            self.push_free(shard, vacant_head, vacant_tail);
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
