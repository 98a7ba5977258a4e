//! One slot of the arena and the encoding of its state word.

use std::fmt;
use std::mem::MaybeUninit;

use crate::sync::{AtomicU64, Ordering, UnsafeCell};

/// Phase: no value; the slot is on a free list, in a chunk being handed out, or past the
/// frontier.
pub(super) const VACANT: u64 = 0;
/// Phase: holds the value of the current generation.
pub(super) const OCCUPIED: u64 = 1;
/// Phase: the value was removed but pinned readers may still hold it; it is dropped when its
/// removal batch is recycled, after an epoch grace period.
pub(super) const REMOVED: u64 = 2;
/// Phase: the generation wrapped around; the slot is never used again, so no old key can
/// alias a new value.
pub(super) const EXHAUSTED: u64 = 3;
const PHASE_MASK: u64 = 0b11;

/// Where a slot is in its life, as reported by [`ArenaError::Stale`](crate::ArenaError).
///
/// ```
/// use ferropool::{ArenaError, SlotArena, SlotPhase};
/// let mut arena = SlotArena::new();
/// let key = arena.insert("x")?;
/// arena.take(key)?;
/// let Err(ArenaError::Stale { phase, .. }) = arena.take(key) else { panic!("not stale") };
/// assert_eq!(phase, SlotPhase::Vacant);
/// assert_eq!(phase.to_string(), "vacant");
/// # Ok::<(), ferropool::ArenaError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SlotPhase {
    /// No value: free for the next insert.
    Vacant,
    /// Holds a value (of a later generation than the key's, when a key is stale).
    Occupied,
    /// Its value was removed and is dropped once no reader can still hold it.
    Removed,
    /// Its generation counter is used up; the slot is never used again.
    Exhausted,
}

impl fmt::Display for SlotPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Vacant => "vacant",
            Self::Occupied => "occupied",
            Self::Removed => "removed",
            Self::Exhausted => "exhausted",
        })
    }
}

/// Builds a state word.
#[inline(always)]
pub(super) const fn state(generation: u32, phase: u64) -> u64 {
    ((generation as u64) << 32) | phase
}

/// The generation part of a state word.
#[inline(always)]
pub(super) const fn generation(state: u64) -> u32 {
    (state >> 32) as u32
}

/// The phase part of a state word.
#[inline(always)]
pub(super) const fn phase(state: u64) -> u64 {
    state & PHASE_MASK
}

/// The phase of a state word, for error reports.
pub(super) fn slot_phase(state: u64) -> SlotPhase {
    match phase(state) {
        VACANT => SlotPhase::Vacant,
        OCCUPIED => SlotPhase::Occupied,
        REMOVED => SlotPhase::Removed,
        _ => SlotPhase::Exhausted,
    }
}

/// One slot: a state word and the (maybe uninitialised) value. Its list link lives in a
/// table of its own (see `ArenaInner::links`), which is never released, so that a racing list
/// pop never reads a slot page that `trim` may be releasing.
pub(super) struct Slot<T> {
    /// `generation << 32 | phase`.
    ///
    /// Invariant: `value` is initialised exactly when the phase is `OCCUPIED` or `REMOVED`.
    /// Transitions, each made by exactly one party:
    /// - `VACANT(g) -> OCCUPIED(g)`: the inserter, which popped the slot from a free list
    ///   (or claimed it past the frontier) and so owns it; a `Release` store after writing
    ///   `value`.
    /// - `OCCUPIED(g) -> REMOVED(g + 1)`: the remover whose compare-exchange wins.
    /// - `REMOVED(g) -> VACANT(g)`, or `EXHAUSTED` when `g` wrapped to 0: the recycler, which
    ///   took the slot's batch from a ready list after the batch's grace period; it changes
    ///   the state *before* dropping `value`, so a drop that panics has still run once.
    /// - `OCCUPIED(g) -> VACANT(g + 1)` or `EXHAUSTED`: `take` or the arena's drop, under
    ///   exclusive access.
    pub(super) state: AtomicU64,
    /// The value; see the invariant on `state`.
    pub(super) value: UnsafeCell<MaybeUninit<T>>,
}

/// Under loom, freeing a slot counts as a write to its state that every earlier access must
/// happen before: a page freed while another thread may still read a slot of it (a
/// `discard` that `trim` did not wait for, a reader the grace period did not cover) fails the
/// model with a causality violation instead of passing unseen.
#[cfg(loom)]
impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        self.state.with_mut(|_| ());
    }
}

impl<T> Slot<T> {
    pub(super) fn vacant(generation: u32) -> Self {
        Self {
            state: AtomicU64::new(state(generation, VACANT)),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Marks the slot, whose value is gone (read out or being dropped), vacant at
    /// `generation`; or, when the generation counter wrapped to 0, exhausted for good, so that
    /// a key from 2^32 generations ago never resolves again. Returns whether the slot may be
    /// reused (put on a free list). The caller owns the slot alone: a plain store suffices.
    pub(super) fn vacate(&self, generation: u32) -> bool {
        let (generation, phase) = match generation {
            0 => (0, EXHAUSTED),
            _ => (generation, VACANT),
        };
        self.state
            .store(state(generation, phase), Ordering::Relaxed);
        phase == VACANT
    }
}
