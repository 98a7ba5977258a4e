//! `Roster<T>`: the per-thread records of one owner (the thread caches of a
//! pool or an arena), numbered densely in the order threads first use that owner and found from a
//! thread's index through a sparse map.
//!
//! Thread indices (`crate::thread`) are small numbers, but not small for every process: after
//! a burst of threads, a long-lived thread may hold index 10,000. Were records kept by thread
//! index, one such thread would make every owner it touches allocate (and every drain walk)
//! ten thousand records. Here an owner holds one record per distinct thread index that used
//! it, plus a map from thread index to record number whose leaves ([`LEAF`] entries, 256
//! bytes) are allocated only where such an index falls: a pool or arena used by one thread
//! with index 10,000 holds one page of records and about 1.3 KiB of map.
//!
//! A record, once given to a thread index, stays with it while the owner lives: a thread that
//! reuses an exited thread's index inherits its record, as it would with a table by index.
//!
//! # Who writes what
//!
//! Only the thread that holds an index claims that index's record ([`Roster::get_or_claim`]),
//! so two claims never race for one index. A claim takes a number with one `fetch_add` on
//! `len`, makes sure the number's page exists, then publishes the number in the map with a
//! `Release` store. Walkers ([`Roster::iter`]) visit every number below `len` whose page
//! exists: a record being claimed right now may be missed (its claimer has not used it yet)
//! or seen fresh (nothing in it yet), never half-built, since pages are built in full before
//! they are published.

use crate::paged::{self, PagedTable};
use crate::sync::{AtomicPtr, AtomicU32, Ordering};

/// Entries in one leaf of the map (thread indices `k * LEAF .. (k + 1) * LEAF`).
pub(crate) const LEAF: u32 = 64;

/// Record numbers past this are never handed out (the map stores `number + 1` in a `u32`).
const MAX_RECORDS: u32 = u32::MAX - 1;

/// One leaf pointer of the map: null, or a leaf of [`LEAF`] entries from
/// [`paged::allocate`], each `record number + 1` (0: no record yet), owned by this pointer.
struct LeafPtr(AtomicPtr<AtomicU32>);

impl Drop for LeafPtr {
    fn drop(&mut self) {
        let leaf = self.0.load(Ordering::Relaxed);
        if !leaf.is_null() {
            // SAFETY: a non-null leaf came from `paged::allocate` with `LEAF` elements
            // (invariant on `LeafPtr`) and is dropped once, with the roster.
            unsafe { paged::free(leaf, LEAF as usize) };
        }
    }
}

/// Per-thread records of one owner; see the module docs.
pub(crate) struct Roster<T> {
    /// The records, by number. Invariant: numbers below `len` were handed out (their pages
    /// may still be on their way); pages are never taken while the roster lives, so a
    /// reference through `&self` stays valid.
    records: PagedTable<T>,
    /// Record numbers handed out so far.
    len: AtomicU32,
    /// Thread index → record number + 1, in leaves of [`LEAF`] entries.
    map: PagedTable<LeafPtr>,
}

impl<T> Roster<T> {
    /// An empty roster whose first page of records holds `first_page_len` (a power of two).
    pub(crate) fn new(first_page_len: u32) -> Self {
        Self {
            records: PagedTable::new(first_page_len),
            len: AtomicU32::new(0),
            map: PagedTable::new(4),
        }
    }

    /// The entry of thread index `index` in the map, if its leaf exists.
    #[inline]
    fn entry(&self, index: u32) -> Option<&AtomicU32> {
        let leaf = self.map.get(index / LEAF)?.0.load(Ordering::Acquire);
        // SAFETY: a non-null leaf holds `LEAF` initialised entries and lives as long as the
        // roster (invariant on `LeafPtr`; leaves are freed only when the roster drops).
        (!leaf.is_null()).then(|| unsafe { &*leaf.add((index % LEAF) as usize) })
    }

    /// The record of thread index `index`, if that index has one.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        let number = self.entry(index)?.load(Ordering::Acquire);
        let number = number.checked_sub(1)?;
        self.records.get(number)
    }

    /// The record of thread index `index`, claimed now if it has none (`init(number)` builds
    /// each record of a new page). Only the thread holding `index` may call this. `None`
    /// when the roster is full (`u32::MAX - 1` records), which no real process reaches.
    pub(crate) fn get_or_claim(&self, index: u32, init: impl FnMut(u32) -> T) -> Option<&T> {
        if let Some(record) = self.get(index) {
            return Some(record);
        }
        self.claim(index, init)
    }

    #[cold]
    #[inline(never)]
    fn claim(&self, index: u32, mut init: impl FnMut(u32) -> T) -> Option<&T> {
        // The map's leaf first: if it cannot exist, take no number.
        let (leaf_page, _) = self.map.locate(index / LEAF);
        self.map
            .ensure_page(leaf_page, |_| LeafPtr(AtomicPtr::new(std::ptr::null_mut())));
        paged::publish_once(&self.map.at(index / LEAF).0, LEAF as usize, |_| {
            AtomicU32::new(0)
        });
        let number = self.len.fetch_add(1, Ordering::AcqRel);
        if number >= MAX_RECORDS {
            self.len.store(MAX_RECORDS, Ordering::Relaxed);
            return None;
        }
        let (page, _) = self.records.locate(number);
        let start = self.records.page_start(page) as u32;
        self.records
            .ensure_page(page, |offset| init(start + offset as u32));
        let entry = self.entry(index)?;
        entry.store(number + 1, Ordering::Release);
        self.records.get(number)
    }

    /// Record numbers handed out so far.
    pub(crate) fn len(&self) -> u32 {
        self.len.load(Ordering::Acquire).min(MAX_RECORDS)
    }

    /// Every record handed out whose page exists (see the module docs for one being claimed
    /// meanwhile).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len()).filter_map(|number| self.records.get(number))
    }

    /// Records in allocated pages (handed out or not yet).
    pub(crate) fn records_allocated(&self) -> u64 {
        self.records.allocated()
    }

    /// Bytes of memory the roster holds (its pages of records, its map and leaves).
    pub(crate) fn footprint(&self) -> usize {
        let leaves = (0..self.map.page_count())
            .filter_map(|page| self.map.page(page))
            .flatten()
            .filter(|leaf| !leaf.0.load(Ordering::Relaxed).is_null())
            .count();
        self.records.allocated() as usize * std::mem::size_of::<T>()
            + self.map.allocated() as usize * std::mem::size_of::<LeafPtr>()
            + leaves * LEAF as usize * std::mem::size_of::<AtomicU32>()
    }
}

impl<T> std::fmt::Debug for Roster<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Roster")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn records_are_dense_whatever_the_thread_index() {
        let roster: Roster<u64> = Roster::new(4);
        assert!(roster.get(10_000).is_none());
        assert_eq!(roster.get_or_claim(10_000, u64::from), Some(&0));
        assert_eq!(roster.get_or_claim(7, u64::from), Some(&1));
        assert_eq!(
            roster.get_or_claim(10_000, |_| 99),
            Some(&0),
            "claimed once"
        );
        assert_eq!(roster.get(7), Some(&1));
        assert!(roster.get(10_001).is_none());
        assert_eq!(roster.iter().copied().collect::<Vec<_>>(), [0, 1]);
        // One page of 4 records, one page of the map, two leaves: far below what a table by
        // index would hold for index 10,000.
        assert!(roster.footprint() < 2048, "{} bytes", roster.footprint());
    }

    #[test]
    fn a_very_high_index_costs_a_few_kilobytes() {
        let roster: Roster<[u8; 128]> = Roster::new(4);
        roster.get_or_claim(100_000, |_| [0; 128]);
        assert!(
            roster.footprint() <= 4 * 128 + 8 * 1024 + 256,
            "{}",
            roster.footprint()
        );
        assert_eq!(roster.len(), 1);
    }
}
