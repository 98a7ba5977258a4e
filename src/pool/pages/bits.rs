//! `PageBits`: one bit per page of a segment. A segment keeps two maps: its *dirty* pages,
//! free and maybe resident, and its *written* ones, free and maybe not zero. Pages of blocks
//! the class layer holds have both bits clear; a block given back sets its pages' bits (the
//! written ones unless the block is known to be all zero), a purge clears both. So a free
//! range's dirty bytes are known to the page, and a carve knows whether its piece needs
//! zeroing.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::sync::system;

/// A bitmap of `pages` bits in memory from the system allocator (never the global one).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageBits {
    /// Invariant: `words(pages)` words from `system::alloc_zeroed`, owned by the segment that
    /// holds this until [`free`](Self::free).
    words: NonNull<u64>,
    pages: usize,
}

fn words(pages: usize) -> usize {
    pages.div_ceil(64)
}

impl PageBits {
    /// A map of `pages` clear bits; `None` if the system refuses.
    pub(crate) fn new(pages: usize) -> Option<Self> {
        let layout = Layout::array::<u64>(words(pages).max(1)).ok()?;
        // SAFETY: the layout has a non-zero size.
        let words = NonNull::new(unsafe { system::alloc_zeroed(layout) }.cast::<u64>())?;
        Some(Self { words, pages })
    }

    /// Gives the map's memory back.
    ///
    /// # Safety
    ///
    /// Called once, and the map is not used afterwards.
    pub(crate) unsafe fn free(self) {
        let layout = Layout::array::<u64>(words(self.pages).max(1)).expect("as allocated");
        // SAFETY: allocated in `new` with this layout (invariant on `words`); the caller's
        // contract makes this the last use.
        unsafe { system::dealloc(self.words.as_ptr().cast(), layout) };
    }

    /// Calls `f(word, mask)` for each word that holds bits of pages `[first, end)`, and
    /// stores what it returns.
    fn each(&self, first: usize, end: usize, mut f: impl FnMut(u64, u64) -> u64) {
        assert!(
            first <= end && end <= self.pages,
            "pages out of the segment"
        );
        let mut page = first;
        while page < end {
            let bit = page % 64;
            let span = (64 - bit).min(end - page);
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << bit
            };
            // SAFETY: `page < pages`, so its word is inside the allocation (invariant on
            // `words`). The map is reached only under the page layer's lock, by one thread
            // at a time, and no reference to its words is ever made.
            unsafe {
                let word = self.words.as_ptr().add(page / 64);
                word.write(f(word.read(), mask));
            }
            page += span;
        }
    }

    /// Pages among `[first, end)` whose bit is set.
    pub(crate) fn count(&self, first: usize, end: usize) -> usize {
        let mut count = 0;
        self.each(first, end, |word, mask| {
            count += (word & mask).count_ones() as usize;
            word
        });
        count
    }

    /// Sets (`true`) or clears the bits of pages `[first, end)`.
    pub(crate) fn set(&self, first: usize, end: usize, dirty: bool) {
        self.each(
            first,
            end,
            |word, mask| {
                if dirty {
                    word | mask
                } else {
                    word & !mask
                }
            },
        );
    }

    /// The first page `p` in `[first, end)` such that pages `[p, p + need)` are all dirty and
    /// lie in `[first, end)`, if any.
    pub(crate) fn find_run(&self, first: usize, end: usize, need: usize) -> Option<usize> {
        assert!(
            first <= end && end <= self.pages,
            "pages out of the segment"
        );
        let mut run = 0;
        let mut page = first;
        while page < end {
            let bit = page % 64;
            let span = (64 - bit).min(end - page);
            // SAFETY: `page < pages`: its word is inside the allocation (invariant on
            // `words`); the map is reached only under the page layer's lock.
            let word = unsafe { self.words.as_ptr().add(page / 64).read() } >> bit;
            let mask = if span == 64 {
                u64::MAX
            } else {
                (1u64 << span) - 1
            };
            if word & mask == mask {
                run += span;
                page += span;
            } else if word & mask == 0 {
                run = 0;
                page += span;
            } else {
                for offset in 0..span {
                    if word >> offset & 1 == 1 {
                        run += 1;
                        if run >= need {
                            return Some(page + offset + 1 - run);
                        }
                    } else {
                        run = 0;
                    }
                }
                page += span;
            }
            if run >= need {
                return Some(page - run);
            }
        }
        None
    }

    /// The highest page `p` in `[first, end]` such that `[p, end)` holds at least `need`
    /// dirty pages (`first` if the whole range holds fewer).
    pub(crate) fn tail_holding(&self, first: usize, end: usize, need: usize) -> usize {
        let mut found = 0;
        let mut page = end;
        while page > first && found < need {
            // The word of page `page - 1`, from `first` at the lowest.
            let low = ((page - 1) / 64 * 64).max(first);
            let in_word = self.count(low, page);
            if found + in_word < need {
                found += in_word;
                page = low;
                continue;
            }
            // The answer is in this word: step page by page.
            while found < need {
                page -= 1;
                found += self.count(page, page + 1);
            }
        }
        page
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::PageBits;

    #[test]
    fn counts_sets_and_tails_across_words() {
        let bits = PageBits::new(300).unwrap();
        assert_eq!(bits.count(0, 300), 0);
        bits.set(10, 200, true);
        assert_eq!(bits.count(0, 300), 190);
        assert_eq!(bits.count(63, 129), 66);
        bits.set(64, 128, false);
        assert_eq!(bits.count(0, 300), 126);
        assert_eq!(bits.tail_holding(0, 300, 1), 199);
        assert_eq!(bits.tail_holding(0, 300, 72), 128); // 128..200 holds 72
        assert_eq!(bits.tail_holding(0, 300, 73), 63);
        assert_eq!(bits.tail_holding(0, 300, 1000), 0);
        assert_eq!(bits.tail_holding(100, 300, 1000), 100);
        assert_eq!(bits.find_run(0, 300, 54), Some(10));
        assert_eq!(bits.find_run(0, 300, 55), Some(128));
        assert_eq!(bits.find_run(20, 300, 44), Some(20));
        assert_eq!(bits.find_run(20, 300, 45), Some(128));
        assert_eq!(bits.find_run(130, 190, 60), Some(130));
        assert_eq!(bits.find_run(130, 190, 61), None);
        assert_eq!(bits.find_run(0, 300, 73), None);
        // SAFETY: last use.
        unsafe { bits.free() };
    }
}
