//! Arena keys: a slot index and a generation packed into one word, plus the issuing arena.

use std::fmt;
use std::num::NonZeroU64;

/// A key into a [`SlotArena`](crate::SlotArena).
///
/// It packs a 32-bit slot index and the slot's 32-bit generation into one word and carries
/// the identity of the arena that issued it. A key stops resolving as soon as its value is
/// removed: the slot's generation moves on, and a slot whose generation would wrap around is
/// retired for good, so a stale key never resolves to a later value of the same slot. A key
/// from another arena is rejected with [`ArenaError::ForeignKey`](crate::ArenaError).
///
/// ```
/// use ferropool::{ArenaError, SlotArena};
/// let (a, b) = (SlotArena::new(), SlotArena::new());
/// let key = a.insert(1u8)?;
/// b.insert(2u8)?;
/// assert!(matches!(b.get(key, &b.pin()), Err(ArenaError::ForeignKey { .. })));
/// # Ok::<(), ferropool::ArenaError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    /// `generation << 32 | index`.
    packed: u64,
    /// Identity of the issuing arena.
    arena: NonZeroU64,
}

impl Key {
    pub(crate) fn new(arena: NonZeroU64, index: u32, generation: u32) -> Self {
        Self {
            packed: (u64::from(generation) << 32) | u64::from(index),
            arena,
        }
    }

    /// The slot index.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let (a, b) = (arena.insert('a')?, arena.insert('b')?);
    /// assert_ne!(a.index(), b.index());
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn index(&self) -> u32 {
        self.packed as u32
    }

    /// The generation the slot had when this key was issued.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let mut arena = SlotArena::new();
    /// let old = arena.insert(1u32)?;
    /// arena.take(old)?;
    /// let new = arena.insert(2u32)?; // the same slot, one generation on
    /// assert_eq!(new.generation(), old.generation() + 1);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn generation(&self) -> u32 {
        (self.packed >> 32) as u32
    }

    /// The identity of the arena that issued this key.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let key = arena.insert(0i64)?;
    /// assert_eq!(key.arena_id(), arena.id());
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn arena_id(&self) -> u64 {
        self.arena.get()
    }

    pub(crate) fn arena(&self) -> NonZeroU64 {
        self.arena
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Key(arena #{}, slot {}, generation {})",
            self.arena,
            self.index(),
            self.generation()
        )
    }
}
