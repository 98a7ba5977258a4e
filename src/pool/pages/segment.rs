//! A segment the page layer mapped from the OS ([`Segment`]: its bounds and its dirty bits),
//! and which segment holds an address.

use std::ptr::NonNull;

use super::bits::PageBits;
use super::os::PAGE;
use super::ranges::Free;
use super::vec::SysVec;

/// A segment mapped from the OS.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    /// Its first byte (the pointer `map` returned, which every block carved from it derives
    /// from).
    pub(super) base: NonNull<u8>,
    pub(super) len: usize,
    /// A bit per page: set while the page is free and may be resident.
    pub(super) bits: PageBits,
    /// A bit per page: set while the page is free and may hold a byte that is not zero (only
    /// pages whose `bits` bit is set: a block given back known to be zero leaves its pages
    /// dirty, not written, and a purge clears both).
    written: PageBits,
}

impl Segment {
    /// The segment of `len` bytes mapped at `base`, every page clean; `None` if the system
    /// refuses its bits.
    pub(super) fn new(base: NonNull<u8>, len: usize) -> Option<Self> {
        let bits = PageBits::new(len / PAGE)?;
        let Some(written) = PageBits::new(len / PAGE) else {
            // SAFETY: made just above, never used.
            unsafe { bits.free() };
            return None;
        };
        Some(Self {
            base,
            len,
            bits,
            written,
        })
    }

    /// Gives the segment's bits back.
    ///
    /// # Safety
    ///
    /// Called once, and the segment (or any copy of it) is not used afterwards.
    pub(super) unsafe fn free_bits(self) {
        // SAFETY: the caller's contract, for both maps.
        unsafe {
            self.bits.free();
            self.written.free();
        }
    }

    pub(super) fn start(&self) -> usize {
        self.base.as_ptr() as usize
    }
    /// The pages of `[start, end)`, as indices in the segment.
    pub(super) fn pages(&self, start: usize, end: usize) -> (usize, usize) {
        ((start - self.start()) / PAGE, (end - self.start()) / PAGE)
    }
    /// Dirty bytes of `[start, end)`, which lies inside the segment.
    pub(super) fn dirty(&self, start: usize, end: usize) -> usize {
        let (first, end) = self.pages(start, end);
        self.bits.count(first, end) * PAGE
    }
    /// Where in free range `range` (of this segment, at least `len` long) `len` bytes at a
    /// page-aligned address hold the most dirty pages, and their dirty bytes: the first place
    /// where they are all dirty, if any; else the best of the windows that start at the
    /// range's first dirty page, end at its last, or lie at either end of the range (a
    /// lone freed block, whole or cut by the range's ends, lies in one of them). `None` for
    /// alignments above a page and for ranges without a dirty page.
    pub(super) fn find_dirty(
        &self,
        range: &Free,
        len: usize,
        align: usize,
    ) -> Option<(usize, usize)> {
        if align > PAGE {
            return None;
        }
        let (first, end) = self.pages(range.start, range.end());
        let need = len / PAGE;
        if let Some(page) = self.bits.find_run(first, end, need) {
            return Some((self.start() + page * PAGE, len));
        }
        let lowest = self.bits.find_run(first, end, 1)?;
        let highest = self.bits.tail_holding(first, end, 1);
        let last = end - need; // the last page a window may start at
        [
            lowest.min(last),
            (highest + 1).saturating_sub(need).max(first),
            first,
            last,
        ]
        .into_iter()
        .map(|page| (page, self.bits.count(page, page + need)))
        .max_by_key(|&(page, dirty)| (dirty, std::cmp::Reverse(page)))
        .map(|(page, dirty)| (self.start() + page * PAGE, dirty * PAGE))
    }

    /// Marks `[start, end)` dirty (and written) or clean.
    pub(super) fn mark(&self, start: usize, end: usize, dirty: bool) {
        let (first, end) = self.pages(start, end);
        self.bits.set(first, end, dirty);
        self.written.set(first, end, dirty);
    }

    /// Marks the pages of a block given back, `[start, end)`, dirty, and written unless every
    /// byte of the block is zero.
    pub(super) fn mark_freed(&self, start: usize, end: usize, written: bool) {
        let (first, end) = self.pages(start, end);
        self.bits.set(first, end, true);
        self.written.set(first, end, written);
    }

    /// Whether a page of `[start, end)` may hold a byte that is not zero.
    pub(super) fn written(&self, start: usize, end: usize) -> bool {
        let (first, end) = self.pages(start, end);
        self.written.count(first, end) > 0
    }
    /// A pointer to `addr`, inside the segment, with the segment's provenance.
    pub(super) fn at(&self, addr: usize) -> NonNull<u8> {
        assert!(
            addr >= self.start() && addr <= self.start() + self.len,
            "an address outside its segment"
        );
        // SAFETY: `addr` lies inside the segment's mapping or one past it (checked above),
        // so the offset stays within the allocation `base` points into.
        unsafe { self.base.add(addr - self.start()) }
    }
    pub(super) fn bounds(&self) -> (usize, usize) {
        (self.start(), self.start() + self.len)
    }
}

/// The index of the segment that holds `addr`, which one does.
pub(super) fn segment_of(segments: &SysVec<Segment>, addr: usize) -> usize {
    let index = segment_holding(segments, addr).expect("an address below every segment");
    debug_assert!(addr < segments.as_slice()[index].bounds().1);
    index
}

/// The index of the last segment that starts at or below `addr` (the one that holds it, if
/// any does); `None` below every segment.
pub(super) fn segment_holding(segments: &SysVec<Segment>, addr: usize) -> Option<usize> {
    segments
        .as_slice()
        .partition_point(|s| s.start() <= addr)
        .checked_sub(1)
}
