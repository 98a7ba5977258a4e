//! The free ranges of the page layer, in address order: best fit, split and merge.
//!
//! Pure bookkeeping over addresses (no memory is touched here), so that the property tests
//! can hold it against a model of the address space and Miri can run it whole.
//!
//! Each free range carries the bytes of its pages that may still be resident (`dirty`): the
//! layer keeps a bit per page (see `bits`), and hands this module a function that counts
//! them, so a split knows what each part keeps and two merged ranges add their counts.

use super::vec::SysVec;

/// A free range `[start, start + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Free {
    /// The first byte's address.
    pub(crate) start: usize,
    /// Its length (a multiple of the page size, above 0).
    pub(crate) len: usize,
    /// Its bytes in pages that may be resident (at most `len`).
    pub(crate) dirty: usize,
    /// When the oldest of its dirty pages was freed, at the latest (milliseconds on the
    /// layer's clock): a merge keeps the older of two ranges' times, so that no page stays
    /// resident past its time because a newer free landed beside it.
    pub(crate) since: u64,
}

/// The dirty bytes and time of the merge of `a` and `b`: the older of their times, as far as
/// they hold dirty pages (a clean range's time counts for nothing).
fn oldest(a: Free, b: Free) -> Free {
    let since = match (a.dirty > 0, b.dirty > 0) {
        (true, true) => a.since.min(b.since),
        (true, false) => a.since,
        (false, _) => b.since,
    };
    Free {
        since,
        dirty: a.dirty + b.dirty,
        ..a
    }
}

impl Free {
    /// One past its last byte.
    pub(crate) fn end(&self) -> usize {
        self.start + self.len
    }
}

/// A piece carved out of a free range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Carved {
    /// Its first byte.
    pub(crate) start: usize,
    /// Its bytes in pages that may be resident (and so hold old contents): a piece with
    /// none reads as zeros.
    pub(crate) dirty: usize,
}

/// The free ranges, sorted by address, disjoint, and maximal within their segment: two
/// ranges of one segment are never adjacent (a range freed beside another merges with it).
/// Ranges of different segments never merge, even where the OS placed the segments end to
/// end, so that a segment can go back to the OS whole.
pub(crate) struct FreeRanges {
    ranges: SysVec<Free>,
}

impl FreeRanges {
    pub(crate) fn new() -> Self {
        Self {
            ranges: SysVec::new(),
        }
    }

    /// The ranges, in address order.
    pub(crate) fn as_slice(&self) -> &[Free] {
        self.ranges.as_slice()
    }

    /// The free bytes that adjoin the held range `[start, end)` of the segment
    /// `[seg_start, seg_end)`: the length of the free range that ends at `start`, and of the
    /// one that begins at `end`, each only if it lies in that segment (0 where none does).
    /// What the block, were it freed, would merge with.
    pub(crate) fn beside(
        &self,
        start: usize,
        end: usize,
        (seg_start, seg_end): (usize, usize),
    ) -> (usize, usize) {
        let ranges = self.ranges.as_slice();
        let at = self.first_from(start);
        let before = at
            .checked_sub(1)
            .map(|i| &ranges[i])
            .filter(|range| range.end() == start && range.start >= seg_start)
            .map_or(0, |range| range.len);
        let after = ranges
            .get(at)
            .filter(|range| range.start == end && range.end() <= seg_end)
            .map_or(0, |range| range.len);
        (before, after)
    }

    /// The index of the first range that starts at or after `addr`.
    fn first_from(&self, addr: usize) -> usize {
        self.ranges.as_slice().partition_point(|f| f.start < addr)
    }

    /// Adds the free range `[start, start + len)` of the segment `[seg_start, seg_end)`,
    /// merged with the free ranges beside it in that segment. The range overlaps no free
    /// range (the caller gives back what it was given). Returns the index of the range that
    /// now holds it.
    pub(crate) fn insert(
        &mut self,
        range: Free,
        (seg_start, seg_end): (usize, usize),
    ) -> Result<usize, super::vec::Exhausted> {
        debug_assert!(seg_start <= range.start && range.end() <= seg_end);
        let at = self.first_from(range.start);
        let slice = self.ranges.as_slice_mut();
        let merges_before = at > 0 && {
            let before = &slice[at - 1];
            debug_assert!(before.end() <= range.start, "overlapping free ranges");
            before.end() == range.start && before.start >= seg_start
        };
        let merges_after = at < slice.len() && {
            let after = &slice[at];
            debug_assert!(range.end() <= after.start, "overlapping free ranges");
            after.start == range.end() && after.end() <= seg_end
        };
        match (merges_before, merges_after) {
            (true, true) => {
                let after = slice[at];
                let before = &mut slice[at - 1];
                before.since = oldest(oldest(*before, range), after).since;
                before.len += range.len + after.len;
                before.dirty += range.dirty + after.dirty;
                self.ranges.remove(at);
                Ok(at - 1)
            }
            (true, false) => {
                let before = &mut slice[at - 1];
                before.since = oldest(*before, range).since;
                before.len += range.len;
                before.dirty += range.dirty;
                Ok(at - 1)
            }
            (false, true) => {
                let after = &mut slice[at];
                after.since = oldest(range, *after).since;
                after.start = range.start;
                after.len += range.len;
                after.dirty += range.dirty;
                Ok(at)
            }
            (false, false) => {
                self.ranges.insert(at, range)?;
                Ok(at)
            }
        }
    }

    /// Where `len` bytes at an `align`-aligned address are served best: `(index, start)`, a
    /// range and the piece's first byte in it. `resident(range)` says where in a range the
    /// piece would hold the most dirty (resident) bytes, and how many: each such byte is one
    /// the caller touches without a fault and need not purge elsewhere to make room for.
    /// Among the ranges that hold the piece, the first in address order where it is all
    /// resident; else the one where it holds the most resident bytes; among equals the
    /// shortest range, the lowest address first (a range with none: from its aligned start).
    /// `None` if no range holds them.
    pub(crate) fn best_fit(
        &self,
        len: usize,
        align: usize,
        resident: impl Fn(&Free) -> Option<(usize, usize)>,
    ) -> Option<(usize, usize)> {
        // (index, start, resident bytes of the piece, the range's length)
        let mut best: Option<(usize, usize, usize, usize)> = None;
        for (index, free) in self.ranges.as_slice().iter().enumerate() {
            let Some(gap) = fits(free, len, align) else {
                continue;
            };
            // A range with fewer dirty bytes than the best piece so far cannot beat it: no
            // need to look where its piece would lie.
            let best_warm = best.map_or(0, |(_, _, warm, _)| warm);
            let found = if free.dirty > 0 && free.dirty >= best_warm {
                resident(free)
            } else {
                None
            };
            let (start, warm) = found.unwrap_or((free.start + gap, 0));
            let better = match best {
                None => true,
                Some((_, _, best_warm, best_len)) => {
                    warm > best_warm || (warm == best_warm && free.len < best_len)
                }
            };
            if better {
                best = Some((index, start, warm, free.len));
                if warm == len {
                    break; // all resident: the first in address order packs the low addresses
                }
            }
        }
        best.map(|(index, start, _, _)| (index, start))
    }

    /// Takes `[start, start + len)` out of range `index` (as [`best_fit`](Self::best_fit)
    /// chose them); what is left on either side stays free. `dirty(a, b)` counts the dirty
    /// bytes of `[a, b)`.
    pub(crate) fn carve(
        &mut self,
        index: usize,
        start: usize,
        len: usize,
        dirty: impl Fn(usize, usize) -> usize,
    ) -> Result<Carved, super::vec::Exhausted> {
        let free = self.ranges.as_slice()[index];
        assert!(
            free.start <= start && start + len <= free.end(),
            "a piece out of its range"
        );
        let gap = start - free.start;
        let tail = free.len - gap - len;
        let piece_dirty = dirty(start, start + len);
        let gap_dirty = if gap > 0 { dirty(free.start, start) } else { 0 };
        let tail_dirty = free.dirty - piece_dirty - gap_dirty;
        let tail_range = Free {
            start: start + len,
            len: tail,
            dirty: tail_dirty,
            since: free.since,
        };
        match (gap > 0, tail > 0) {
            (true, true) => {
                // The tail goes in first: if there is no room for it, nothing has changed.
                self.ranges.insert(index + 1, tail_range)?;
                self.ranges.as_slice_mut()[index] = Free {
                    len: gap,
                    dirty: gap_dirty,
                    ..free
                };
            }
            (true, false) => {
                self.ranges.as_slice_mut()[index] = Free {
                    len: gap,
                    dirty: gap_dirty,
                    ..free
                };
            }
            (false, true) => self.ranges.as_slice_mut()[index] = tail_range,
            (false, false) => {
                self.ranges.remove(index);
            }
        }
        Ok(Carved {
            start,
            dirty: piece_dirty,
        })
    }

    /// Lowers range `index`'s dirty bound to `dirty` (part of it was purged).
    pub(crate) fn set_dirty(&mut self, index: usize, dirty: usize) {
        let free = &mut self.ranges.as_slice_mut()[index];
        debug_assert!(dirty <= free.dirty && dirty <= free.len);
        free.dirty = dirty;
    }

    /// Removes range `index` (its segment goes back to the OS).
    pub(crate) fn remove(&mut self, index: usize) -> Free {
        self.ranges.remove(index)
    }

    /// The index of the range that starts at `start`, if any.
    pub(crate) fn find(&self, start: usize) -> Option<usize> {
        let at = self.first_from(start);
        (self.ranges.as_slice().get(at)?.start == start).then_some(at)
    }
}

/// The alignment gap at which range `free` holds `len` bytes aligned to `align`, if it does.
fn fits(free: &Free, len: usize, align: usize) -> Option<usize> {
    let gap = free.start.next_multiple_of(align) - free.start;
    (gap.checked_add(len)? <= free.len).then_some(gap)
}

impl std::fmt::Debug for FreeRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.ranges.as_slice()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const P: usize = 4096;
    const SEG: (usize, usize) = (0x10_0000, 0x10_0000 + 64 * P);

    fn free(start: usize, len: usize, dirty: usize) -> Free {
        Free {
            start,
            len,
            dirty,
            since: 0,
        }
    }

    #[test]
    fn a_range_freed_between_two_merges_with_both() {
        let mut ranges = FreeRanges::new();
        let base = SEG.0;
        ranges.insert(free(base, P, P), SEG).unwrap();
        ranges.insert(free(base + 2 * P, P, 0), SEG).unwrap();
        assert_eq!(ranges.as_slice().len(), 2);
        ranges.insert(free(base + P, P, P), SEG).unwrap();
        assert_eq!(ranges.as_slice(), [free(base, 3 * P, 2 * P)]);
    }

    #[test]
    fn ranges_of_two_segments_never_merge() {
        let mut ranges = FreeRanges::new();
        let (a, b) = ((SEG.0, SEG.0 + P), (SEG.0 + P, SEG.0 + 2 * P));
        ranges.insert(free(a.0, P, 0), a).unwrap();
        ranges.insert(free(b.0, P, 0), b).unwrap();
        assert_eq!(ranges.as_slice().len(), 2);
    }

    #[test]
    fn best_fit_takes_the_shortest_range_that_holds_the_request() {
        let mut ranges = FreeRanges::new();
        let base = SEG.0;
        ranges.insert(free(base, 8 * P, 0), SEG).unwrap();
        ranges.insert(free(base + 10 * P, 3 * P, 0), SEG).unwrap();
        ranges.insert(free(base + 20 * P, 2 * P, 0), SEG).unwrap();
        let cold = |_: &Free| None;
        assert_eq!(ranges.best_fit(3 * P, P, cold), Some((1, base + 10 * P)));
        assert_eq!(ranges.best_fit(2 * P, P, cold), Some((2, base + 20 * P)));
        assert_eq!(ranges.best_fit(5 * P, P, cold), Some((0, base)));
        assert_eq!(ranges.best_fit(9 * P, P, cold), None);
        let carved = ranges.carve(1, base + 10 * P, 2 * P, |_, _| 0).unwrap();
        assert_eq!(carved.start, base + 10 * P);
        assert_eq!(carved.dirty, 0);
        assert_eq!(ranges.as_slice()[1], free(base + 12 * P, P, 0));
    }

    #[test]
    fn an_aligned_carve_leaves_the_gap_and_the_tail_free() {
        let mut ranges = FreeRanges::new();
        let seg = (0x20_0000 - 2 * P, 0x20_0000 + 62 * P);
        ranges.insert(free(seg.0, 64 * P, 64 * P), seg).unwrap();
        let all = |a: usize, b: usize| b - a;
        let (index, start) = ranges.best_fit(16 * P, 16 * P, |_| None).unwrap();
        let carved = ranges.carve(index, start, 16 * P, all).unwrap();
        assert_eq!(carved.start, 0x20_0000);
        assert_eq!(carved.dirty, 16 * P);
        assert_eq!(
            ranges.as_slice(),
            [
                free(seg.0, 2 * P, 2 * P),
                free(0x20_0000 + 16 * P, 46 * P, 46 * P)
            ]
        );
        ranges
            .insert(free(carved.start, 16 * P, 16 * P), seg)
            .unwrap();
        assert_eq!(ranges.as_slice(), [free(seg.0, 64 * P, 64 * P)]);
    }
}
