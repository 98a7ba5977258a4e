//! Block records: one per block of memory the pool holds from the system.
//!
//! Records live in a [`PagedTable`] indexed by `u32`, so the per-class lists can link them by
//! index with an ABA tag (see `crate::stack`). A record is never freed while its pool exists;
//! when its block goes back to the system the record goes on a spare list for the next block.

use super::PoolError;
use crate::paged::PagedTable;
use crate::stack::{TaggedStack, NIL};
use crate::sync::{AtomicU32, AtomicUsize, Ordering};

/// Records in the table's first page.
const FIRST_PAGE: u32 = 256;

/// A block's address and its list link.
pub(super) struct Record {
    /// The block's address. Written by the thread that obtained the block from the system
    /// before the record is published on any list (the list push is `Release`).
    pub(super) addr: AtomicUsize,
    /// The next record on a class list or the spare list; meaningless off a list.
    pub(super) next: AtomicU32,
}

/// The table of records. Its pages are never released while the pool lives, so `record`
/// never dangles.
pub(super) struct BlockTable {
    records: PagedTable<Record>,
    /// Records below this index have been handed out at least once.
    claimed: AtomicU32,
    /// Records whose block went back to the system.
    spare: TaggedStack,
}

impl BlockTable {
    pub(super) fn new() -> Self {
        Self {
            records: PagedTable::new(FIRST_PAGE),
            claimed: AtomicU32::new(0),
            spare: TaggedStack::new(),
        }
    }

    /// The record at `index`, which was returned by [`claim`](Self::claim).
    #[inline]
    pub(super) fn record(&self, index: u32) -> &Record {
        self.records.at(index)
    }

    /// A record for a new block.
    pub(super) fn claim(&self) -> Result<u32, PoolError> {
        if let Some(index) = self.spare.pop(|i| &self.record(i).next) {
            return Ok(index);
        }
        let index = self.claimed.fetch_add(1, Ordering::Relaxed);
        if index == u32::MAX {
            self.claimed.fetch_sub(1, Ordering::Relaxed);
            return Err(PoolError::TooManyBlocks);
        }
        let (page, _) = self.records.locate(index);
        self.records.ensure_page(page, |_| Record {
            addr: AtomicUsize::new(0),
            next: AtomicU32::new(NIL),
        });
        Ok(index)
    }

    /// Returns a record whose block went back to the system.
    pub(super) fn release(&self, index: u32) {
        self.spare.push_chain(index + 1, &self.record(index).next);
    }
}
