//! Block records: one per block of memory the pool holds from the system.
//!
//! Records live in an append-only table of doubling pages indexed by `u32`, so the per-class
//! lists can link them by index with an ABA tag (see `crate::stack`). A record is never
//! freed while its pool exists; when its block goes back to the system the record goes on a
//! spare list for the next block.

use std::ptr;

use crate::error::PoolError;
use crate::stack::{TaggedStack, NIL};
use crate::sync::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};

/// `log2` of the records in page 0.
const FIRST_SHIFT: u32 = 8;
/// Pages: enough that the last page reaches index `u32::MAX - 1`.
const PAGES: usize = (33 - FIRST_SHIFT) as usize;

/// A block's address and its list link.
pub(super) struct Record {
    /// The block's address. Written by the thread that obtained the block from the system
    /// before the record is published on any list (the list push is `Release`).
    pub(super) addr: AtomicUsize,
    /// The next record on a class list or the spare list; meaningless off a list.
    pub(super) next: AtomicU32,
}

/// The table of records.
pub(super) struct BlockTable {
    /// Page `k` holds `256 << k` records or is null. Invariant: a page, once published, is
    /// never freed before the table is dropped, so `record` never dangles.
    pages: Box<[AtomicPtr<Record>]>,
    /// Records below this index have been handed out at least once.
    claimed: AtomicU32,
    /// Records whose block went back to the system.
    spare: TaggedStack,
}

impl BlockTable {
    pub(super) fn new() -> Self {
        Self {
            pages: (0..PAGES)
                .map(|_| AtomicPtr::new(ptr::null_mut()))
                .collect(),
            claimed: AtomicU32::new(0),
            spare: TaggedStack::new(),
        }
    }

    #[inline(always)]
    fn locate(index: u32) -> (usize, usize) {
        let shifted = u64::from(index) + (1 << FIRST_SHIFT);
        let page = (63 - shifted.leading_zeros() - FIRST_SHIFT) as usize;
        (page, (shifted - ((1u64 << FIRST_SHIFT) << page)) as usize)
    }

    fn page_len(page: usize) -> usize {
        (1usize << FIRST_SHIFT) << page
    }

    /// The record at `index`, which was returned by [`claim`](Self::claim).
    #[inline]
    pub(super) fn record(&self, index: u32) -> &Record {
        let (page, offset) = Self::locate(index);
        let base = self.pages[page].load(Ordering::Acquire);
        debug_assert!(!base.is_null());
        // SAFETY: `index` was claimed, so its page is published; pages are never freed while
        // `self` lives (invariant on `pages`) and `offset < page_len(page)`.
        unsafe { &*base.add(offset) }
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
        let (page, _) = Self::locate(index);
        if self.pages[page].load(Ordering::Acquire).is_null() {
            let fresh: Box<[Record]> = (0..Self::page_len(page))
                .map(|_| Record {
                    addr: AtomicUsize::new(0),
                    next: AtomicU32::new(NIL),
                })
                .collect();
            let fresh = Box::into_raw(fresh).cast::<Record>();
            if self.pages[page]
                .compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // SAFETY: never published; from `Box::into_raw` with this length.
                drop(unsafe {
                    Box::from_raw(ptr::slice_from_raw_parts_mut(fresh, Self::page_len(page)))
                });
            }
        }
        Ok(index)
    }

    /// Returns a record whose block went back to the system.
    pub(super) fn release(&self, index: u32) {
        self.spare.push_chain(index + 1, &self.record(index).next);
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        for (page, base) in self.pages.iter().enumerate() {
            let base = base.load(Ordering::Acquire);
            if !base.is_null() {
                // SAFETY: from `Box::into_raw` with this length in `claim`; `&mut self`.
                drop(unsafe {
                    Box::from_raw(ptr::slice_from_raw_parts_mut(base, Self::page_len(page)))
                });
            }
        }
    }
}
