//! The arena's error type.

use super::slot::SlotPhase;

/// Errors of [`SlotArena`](crate::SlotArena).
///
/// Every variant says what was asked for and what the arena had instead; an operation that
/// returns one of these has left the arena unchanged.
///
/// ```
/// use ferropool::{ArenaError, SlotArena, SlotPhase};
/// let arena = SlotArena::new();
/// let key = arena.insert(1u8)?;
/// let guard = arena.pin();
/// arena.remove(key, &guard)?;
/// let error = arena.get(key, &guard).unwrap_err();
/// assert!(matches!(error, ArenaError::Stale { phase: SlotPhase::Removed, .. }));
/// # Ok::<(), ferropool::ArenaError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArenaError {
    /// The key's slot holds no value of the key's generation: it was removed, or removed and
    /// reused (the slot is now at `current_generation`).
    #[error(
        "slot {index} generation {generation} is not present \
         (the slot is at generation {current_generation}, {phase})"
    )]
    Stale {
        /// The key's slot index.
        index: u32,
        /// The key's generation.
        generation: u32,
        /// The slot's generation now.
        current_generation: u32,
        /// Where the slot is in its life now.
        phase: SlotPhase,
    },
    /// The key's slot index was never allocated by this arena (or its page was released).
    #[error("slot {index} is out of range (the arena has {capacity} slots allocated)")]
    OutOfRange {
        /// The key's slot index.
        index: u32,
        /// Slots the arena has allocated pages for.
        capacity: u64,
    },
    /// The key was issued by another arena.
    #[error("the key belongs to arena #{key_arena}, not to this arena #{arena}")]
    ForeignKey {
        /// The identity of the arena that issued the key.
        key_arena: u64,
        /// The identity of this arena.
        arena: u64,
    },
    /// The epoch guard was pinned on another collector (or is `unprotected`), so it cannot
    /// protect this arena's records.
    #[error(
        "the epoch guard belongs to another collector; pin with SlotArena::pin \
         or with a handle registered on the arena's collector"
    )]
    ForeignGuard,
    /// A configuration field is out of range.
    #[error("invalid arena configuration: {field} = {value}, expected {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What the field accepts.
        expected: &'static str,
    },
    /// Every slot index the arena may use (`ArenaConfig::max_slots`) is in use: its value
    /// is live; or removed, and a reader pinned since may still read it; or removed, and
    /// its batch is being recycled (the slots of a batch come back once the values of up to
    /// 64 of them are dropped, so a removed value's `Drop` that inserts at the cap, or an
    /// insert beside a slow `Drop` on another thread, may see this); or the slot is
    /// exhausted; or it is vacant in the hand of another thread inserting at that moment (a
    /// thread keeps up to 63 vacant slots for its next inserts; an idle thread's are taken
    /// back first).
    #[error("the arena is full: all {capacity} slot indices are in use")]
    Full {
        /// The number of addressable slots.
        capacity: u64,
    },
    /// The arena needed a new page of slots and the system refused the memory (or its size
    /// does not fit in `isize`). Nothing was claimed: a later insert may succeed.
    #[error("the system refused a page of {slots} slots ({bytes} bytes) for the arena")]
    OutOfMemory {
        /// Slots in the page.
        slots: u64,
        /// Bytes of the page's slots (`u64::MAX` if that overflows).
        bytes: u64,
    },
}
