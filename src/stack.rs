//! A lock-free stack of `u32` indices whose links live in a table the caller owns.
//!
//! The head packs a 32-bit tag with the top link (`tag << 32 | link`, link = index + 1, 0 =
//! empty); every push and pop changes the tag, so a pop whose snapshot is outdated fails its
//! compare-exchange (ABA). The caller guarantees that the `next` cell of every index it pushes
//! stays allocated while the stack is in use, so a racy read of a link is never a dangling one.
//! Used by the arena's free list and the pool's per-class block lists.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// A link: `index + 1`, or [`NIL`].
pub(crate) type Link = u32;
/// The end of a list.
pub(crate) const NIL: Link = 0;

/// The stack head: one word, unpadded (a user that needs it on a cache line of its own wraps
/// it in `CachePadded`; the pool packs the heads of one shard's classes densely).
pub(crate) struct TaggedStack {
    head: AtomicU64,
}

impl TaggedStack {
    pub(crate) fn new() -> Self {
        Self {
            head: AtomicU64::new(0),
        }
    }

    /// Whether the stack is empty (a snapshot).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed) as Link == NIL
    }

    /// Pops the top index. `next` maps an index to its link cell.
    #[inline]
    pub(crate) fn pop<'a>(&self, next: impl Fn(u32) -> &'a AtomicU32) -> Option<u32> {
        self.pop_leaving(NIL, next)
    }

    /// Pops the top index if at least one more stays below it (so the stack is not left
    /// empty).
    #[inline]
    pub(crate) fn pop_spare<'a>(&self, next: impl Fn(u32) -> &'a AtomicU32) -> Option<u32> {
        self.pop_leaving(NIL + 1, next)
    }

    /// Pops the top index unless the link below it is less than `least` (`NIL`: any stack
    /// that is not empty; `NIL + 1`: one with at least two indices).
    #[inline(always)]
    fn pop_leaving<'a>(&self, least: Link, next: impl Fn(u32) -> &'a AtomicU32) -> Option<u32> {
        let mut current = self.head.load(Ordering::Acquire);
        loop {
            let link = current as Link;
            if link == NIL {
                return None;
            }
            // Racy but atomic: if another thread pops this index first, the tag in `current`
            // is outdated and the compare-exchange below fails.
            let after = next(link - 1).load(Ordering::Relaxed);
            if after < least {
                return None;
            }
            match self.head.compare_exchange_weak(
                current,
                retag(current, after),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(link - 1),
                Err(actual) => current = actual,
            }
        }
    }

    /// Publishes the chain `head ..= tail` (already linked through the caller's cells);
    /// `tail_next` is the link cell of the chain's last index.
    #[inline]
    pub(crate) fn push_chain(&self, head: Link, tail_next: &AtomicU32) {
        let mut current = self.head.load(Ordering::Relaxed);
        loop {
            tail_next.store(current as Link, Ordering::Relaxed);
            // Acquire as well: a push that follows a `take_all` in the head's order sees
            // everything before that `take_all` (the pool's close relies on it).
            match self.head.compare_exchange_weak(
                current,
                retag(current, head),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Takes the whole stack, returning its top link.
    pub(crate) fn take_all(&self) -> Link {
        let mut current = self.head.load(Ordering::Acquire);
        loop {
            match self.head.compare_exchange_weak(
                current,
                retag(current, NIL),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return current as Link,
                Err(actual) => current = actual,
            }
        }
    }
}

/// `head` with the next tag and `link` on top.
#[inline(always)]
fn retag(head: u64, link: Link) -> u64 {
    let tag = ((head >> 32) as u32).wrapping_add(1);
    (u64::from(tag) << 32) | u64::from(link)
}
