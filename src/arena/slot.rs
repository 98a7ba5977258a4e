//! One slot of the arena and the encoding of its state word.

use std::mem::MaybeUninit;

use crate::stack::NIL;
use crate::sync::{AtomicU32, AtomicU64, UnsafeCell};

/// Phase: no value; the slot is on the free list or beyond the frontier.
pub(super) const FREE: u64 = 0;
/// Phase: holds the value of the current generation.
pub(super) const OCCUPIED: u64 = 1;
/// Phase: the value was removed but may still be read by pinned readers; it is dropped when
/// its retire batch has passed an epoch grace period.
pub(super) const RETIRED: u64 = 2;
/// Phase: the generation wrapped around; the slot is never reused, so no old key can alias.
pub(super) const DEAD: u64 = 3;
const PHASE_MASK: u64 = 0b11;

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

/// A human name for a phase, for error messages.
pub(super) fn phase_name(state: u64) -> &'static str {
    match phase(state) {
        FREE => "vacant",
        OCCUPIED => "occupied",
        RETIRED => "awaiting reclamation",
        _ => "retired",
    }
}

/// One slot: a state word, a list link and the (maybe uninitialised) value.
pub(super) struct Slot<T> {
    /// `generation << 32 | phase`.
    ///
    /// Invariant: `value` is initialised exactly when the phase is `OCCUPIED` or `RETIRED`.
    /// Transitions, each made by exactly one party:
    /// - `FREE(g) -> OCCUPIED(g)`: the inserter, which popped the slot from the free list (or
    ///   claimed it past the frontier) and so owns it; a `Release` store after writing `value`.
    /// - `OCCUPIED(g) -> RETIRED(g + 1)`: the remover whose compare-exchange wins.
    /// - `RETIRED(g) -> FREE(g)` or `DEAD` (when `g` wrapped to 0): the reclaimer, after the
    ///   slot's retire batch passed an epoch grace period and `value` was dropped; the slot is
    ///   then published on the free list by a `Release` compare-exchange.
    pub(super) state: AtomicU64,
    /// The next slot on whichever list (free or retired) this slot is on; meaningless otherwise.
    /// Written only by the party that owns the slot and is about to publish it on a list.
    pub(super) next: AtomicU32,
    /// The value; see the invariant on `state`.
    pub(super) value: UnsafeCell<MaybeUninit<T>>,
}

impl<T> Slot<T> {
    pub(super) fn vacant(generation: u32) -> Self {
        Self {
            state: AtomicU64::new(state(generation, FREE)),
            next: AtomicU32::new(NIL),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }
}
