//! The page layer: the memory under the class lists. It maps segments from the OS, carves
//! blocks out of them (the first run of resident pages that holds a request, else the best
//! fit over address-ordered free ranges), merges what comes back
//! with its free neighbours, and returns pages to the OS: on a clock (`decay`), when a budget
//! needs the room, on a trim, and every segment when the pool goes.
//!
//! It is the pool's only source of blocks of [`PAGED_MIN_BLOCK`] bytes and more (every such
//! class is a whole number of pages). Smaller blocks come from the heap, one allocation each.
//!
//! # Where its bytes are
//!
//! A byte of a segment is, at every moment, in exactly one place: in a block the class layer
//! holds (handed out, cached or listed), or in a free range here. A free range is *dirty*
//! as far as its pages may still be resident (they were freed and not purged since), clean
//! otherwise; a bit per page says which (see `bits`). `dirty` bounds the resident bytes of
//! the free ranges from above, so `held + dirty` bounds the pool's resident memory:
//! [`PageLayer::obtain`] purges free pages until `dirty` fits in the room the budget leaves
//! beside what the class layer holds.
//!
//! # Concurrency
//!
//! One lock over the ranges and segments. The layer is where a cache miss that found no
//! listed block goes, below two levels of caches, so it is taken once per block the pool
//! grows or releases; the figures are atomics written under the lock and read without it.
//! No user code runs under the lock, and nothing under it allocates but from `System`.

mod bits;
pub(in crate::pool) mod os;
mod ranges;
mod segment;
mod vec;

use std::ptr::NonNull;
use std::time::Instant;

use os::PAGE;
use ranges::{Free, FreeRanges};
use segment::{segment_holding, segment_of, Segment};
use vec::{Exhausted, SysVec};

use crate::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering};

/// Blocks of at least this many bytes come from the page layer; smaller ones from the heap.
/// Every class from here up is a whole number of pages (classes are eight per power of two,
/// so from 32 KiB on they step by 4 KiB or more).
pub(crate) const PAGED_MIN_BLOCK: usize = 32 << 10;

/// The first segment's length; each next one doubles, up to [`SEGMENT_MAX`]. A request
/// larger than that gets a segment of its own length.
#[cfg(not(any(loom, miri)))]
const SEGMENT_FIRST: usize = 4 << 20;
#[cfg(not(any(loom, miri)))]
const SEGMENT_MAX: usize = 64 << 20;
// Under loom and Miri segments are real allocations of the system allocator: small ones.
#[cfg(any(loom, miri))]
const SEGMENT_FIRST: usize = 64 << 10;
#[cfg(any(loom, miri))]
const SEGMENT_MAX: usize = 1 << 20;

const _: () = assert!(
    SEGMENT_MAX.is_multiple_of(SEGMENT_FIRST) && (SEGMENT_MAX / SEGMENT_FIRST).is_power_of_two(),
    "segments double from the first to the largest"
);

/// How far past its excess a purge for the budget goes. Without it, a budget that is not a
/// whole number of pages, or heap blocks that come and go beside the layer's, made most
/// carves of a fitted step purge a page or two: the main job at 50% of its peak made 17-21
/// system calls a step, 13 with it (at 75%: 0.2-12.8, then 0-0.8).
const PURGE_SLACK: usize = 1 << 20;

/// What the lock guards.
struct PageBooks {
    /// Invariant: every free range lies inside one segment of `segments`.
    free: FreeRanges,
    /// Sorted by address.
    segments: SysVec<Segment>,
    /// The sum of the free ranges' dirty bytes.
    dirty: usize,
    /// The segments' lengths summed.
    mapped: usize,
    /// Bytes of blocks carved and not given back.
    carved: usize,
    /// Segments mapped so far (the next one's length doubles from this).
    maps: u32,
    /// No dirty range is due for its purge before this time (milliseconds on the clock).
    next_decay: u64,
}

// SAFETY: `PageBooks` holds addresses of memory the layer owns, not references to another
// thread's data; all access to it goes through the layer's lock.
unsafe impl Send for PageBooks {}

/// The page layer of one pool.
pub(crate) struct PageLayer {
    state: Mutex<PageBooks>,
    /// Free pages that stayed dirty this long (milliseconds) are purged at the next call;
    /// `u64::MAX`: never by the clock.
    decay_ms: u64,
    /// The layer's clock starts here.
    born: Instant,
    /// Copies of `PageBooks`'s figures, for reads without the lock (written under it).
    dirty: AtomicU64,
    mapped: AtomicU64,
    /// The most that the blocks held (heap blocks included) plus `dirty` reached when a
    /// block was carved.
    peak_committed: AtomicU64,
    /// Calls to the OS (map, unmap, purge, advice withdrawn).
    os_calls: AtomicU64,
    /// Whether a block of the layer has had huge-page advice (which stays on its pages after
    /// the block comes back) since the advice was last withdrawn.
    advised: AtomicBool,
    /// Bytes purged so far.
    purged: AtomicU64,
}

impl std::fmt::Debug for PageLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageLayer")
            .field("mapped", &self.mapped_bytes())
            .field("dirty", &self.dirty_bytes())
            .field("decay_ms", &self.decay_ms)
            .finish_non_exhaustive()
    }
}

/// A block the class layer holds, and the free bytes beside it in its segment: what it
/// would merge with were it given back (see [`PageLayer::free_beside`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Beside {
    /// The block's first byte's address.
    pub(crate) start: usize,
    /// Its length.
    pub(crate) len: usize,
    /// The free bytes that end where it starts (filled in by `free_beside`).
    pub(crate) before: usize,
    /// The free bytes that start where it ends (filled in by `free_beside`).
    pub(crate) after: usize,
    /// The first byte of its segment (filled in by `free_beside`; 0 for a block outside
    /// every segment): free pages of two segments never merge.
    pub(crate) segment: usize,
}

impl Beside {
    /// Whether `next`, which starts after this block, would merge with it into one free
    /// range were both given back: the free bytes after this one reach `next`, in the same
    /// segment.
    pub(crate) fn reaches(&self, next: &Beside) -> bool {
        self.segment != 0
            && self.segment == next.segment
            && self
                .start
                .saturating_add(self.len)
                .saturating_add(self.after)
                == next.start
    }
}

/// What [`PageLayer::obtain`] needs to know of the budget: the budget (`u64::MAX` for none)
/// and the bytes the pool holds outside the page layer (blocks from the heap).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Room {
    pub(crate) budget: u64,
    pub(crate) outside: u64,
}

impl Room {
    /// The dirty bytes the budget allows beside `carved` bytes of blocks.
    fn for_dirty(&self, carved: usize) -> usize {
        let allowed = self
            .budget
            .saturating_sub(self.outside)
            .saturating_sub(carved as u64);
        usize::try_from(allowed).unwrap_or(usize::MAX)
    }
}

impl PageLayer {
    pub(crate) fn new(decay_ms: u64) -> Self {
        Self {
            state: Mutex::new(PageBooks {
                free: FreeRanges::new(),
                segments: SysVec::new(),
                dirty: 0,
                mapped: 0,
                carved: 0,
                maps: 0,
                next_decay: u64::MAX,
            }),
            decay_ms,
            born: Instant::now(),
            dirty: AtomicU64::new(0),
            mapped: AtomicU64::new(0),
            peak_committed: AtomicU64::new(0),
            os_calls: AtomicU64::new(0),
            purged: AtomicU64::new(0),
            advised: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PageBooks> {
        // No code that can panic runs under the lock but assertions of its own invariants;
        // a poisoned lock still guards consistent ranges.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A block of `len` bytes (a multiple of [`PAGE`]) at an `align`-aligned address (a
    /// power of two, at least [`PAGE`]); zeroed if `zeroed`. `room` says, when asked under
    /// the lock, what the budget leaves: free pages are purged until the dirty ones fit
    /// beside every block held (the layer's own, counted under its lock, so a reservation
    /// another thread has made but not yet carved does not count twice). `None` when the OS
    /// refuses a segment.
    pub(crate) fn obtain(
        &self,
        len: usize,
        align: usize,
        zeroed: bool,
        room: impl FnOnce() -> Room,
    ) -> Option<NonNull<u8>> {
        debug_assert!(
            len > 0 && len.is_multiple_of(PAGE) && align.is_power_of_two() && align >= PAGE
        );
        let mut state = self.lock();
        let now = self.now();
        self.decay(&mut state, now);
        let PageBooks { free, segments, .. } = &*state;
        let warm = |range: &Free| {
            let segment = &segments.as_slice()[segment_of(segments, range.start)];
            segment.find_dirty(range, len, align)
        };
        let (index, start) = match free.best_fit(len, align, warm) {
            Some(found) => found,
            None => self.map_for(&mut state, len, align)?,
        };
        let PageBooks { free, segments, .. } = &mut *state;
        let dirty = |a, b| segments.as_slice()[segment_of(segments, a)].dirty(a, b);
        let carved = free.carve(index, start, len, dirty).ok()?;
        state.dirty -= carved.dirty;
        let segment = segment_of(&state.segments, carved.start);
        let segment = &state.segments.as_slice()[segment];
        let written = segment.written(carved.start, carved.start + len);
        segment.mark(carved.start, carved.start + len, false);
        let block = segment.at(carved.start);
        state.carved += len;
        let room = room();
        let allowed = room.for_dirty(state.carved);
        self.purge_to(&mut state, allowed);
        self.publish(&state);
        let committed = room.outside + (state.carved + state.dirty) as u64;
        self.peak_committed.fetch_max(committed, Ordering::Relaxed);
        drop(state);
        if zeroed && written {
            // SAFETY: the block is the caller's now, `len` bytes inside its segment.
            unsafe { block.as_ptr().write_bytes(0, len) };
        }
        Some(block)
    }

    /// Whether a free range holds a run of dirty pages of at least `len` bytes now: a
    /// request of `len` bytes would find all its pages resident there (as `obtain` looks
    /// first). With `decay_ms` 0 every freed page is purged at once, and this is never so.
    pub(crate) fn has_dirty_run(&self, len: usize) -> bool {
        let state = self.lock();
        let segments = &state.segments;
        state
            .free
            .as_slice()
            .iter()
            .filter(|range| range.len >= len && range.dirty >= len)
            .any(|range| {
                let segment = &segments.as_slice()[segment_of(segments, range.start)];
                let (first, end) = segment.pages(range.start, range.end());
                segment
                    .bits
                    .find_run(first, end, len.div_ceil(PAGE))
                    .is_some()
            })
    }

    /// Fills in `before`, `after` and `segment` of each block of `blocks`: the free bytes
    /// that adjoin it in its segment now. A block outside every segment (a heap block) gets
    /// none. One look under the lock for all of them, so the answers are of one moment.
    pub(crate) fn free_beside(&self, blocks: &mut [Beside]) {
        let state = self.lock();
        let segments = state.segments.as_slice();
        for block in blocks {
            let segment = segment_holding(&state.segments, block.start)
                .map(|i| segments[i].bounds())
                .filter(|&(_, end)| block.start.saturating_add(block.len) <= end);
            (block.before, block.after) = segment.map_or((0, 0), |bounds| {
                state
                    .free
                    .beside(block.start, block.start + block.len, bounds)
            });
            block.segment = segment.map_or(0, |(start, _)| start);
        }
    }

    /// Takes back the block `[block, block + len)` that [`obtain`](Self::obtain) returned. Its
    /// pages join the free ones, dirty; free pages are then purged until the dirty ones fit
    /// in what `room` leaves (a budget lowered below what was held leaves no room for them).
    /// `zero` says every byte of the block is zero (an `alloc_zeroed` buffer never written):
    /// its pages are dirty all the same (they may be resident) but not written, so a carve
    /// that asks for zeros need not clear them.
    ///
    /// # Safety
    ///
    /// `block` came from `obtain` with this `len`, and nothing uses it afterwards.
    pub(crate) unsafe fn give_back(
        &self,
        block: NonNull<u8>,
        len: usize,
        zero: bool,
        room: impl FnOnce() -> Room,
    ) {
        let mut state = self.lock();
        let now = self.now();
        self.decay(&mut state, now);
        let start = block.as_ptr() as usize;
        let segment = segment_of(&state.segments, start);
        state.carved -= len;
        let bounds = {
            let segment = &state.segments.as_slice()[segment];
            segment.mark_freed(start, start + len, !zero);
            segment.bounds()
        };
        let range = Free {
            start,
            len,
            dirty: len,
            since: now,
        };
        state.dirty += len;
        let index = match state.free.insert(range, bounds) {
            Ok(index) => index,
            Err(Exhausted) => {
                // No memory for one more range record: the block stays out of the free
                // ranges for good (held by no one, its pages purged). Its segment then never
                // becomes one free range, so it is not unmapped while the pool lives (the
                // drop unmaps every segment).
                state.dirty -= len;
                // SAFETY: the block is ours again and unused (the caller's contract).
                unsafe { os::purge(block, len) };
                self.os_calls.fetch_add(1, Ordering::Relaxed);
                state.segments.as_slice()[segment].mark(start, start + len, false);
                self.publish(&state);
                return;
            }
        };
        if self.decay_ms == 0 {
            self.purge(&mut state, index);
        } else {
            state.next_decay = state.next_decay.min(now.saturating_add(self.decay_ms));
        }
        let allowed = room().for_dirty(state.carved);
        self.purge_to(&mut state, allowed);
        self.publish(&state);
    }

    /// Purges every dirty free page and unmaps every segment nothing of which is held.
    pub(crate) fn trim(&self) {
        let mut state = self.lock();
        self.purge_to(&mut state, 0);
        let mut segment = 0;
        while segment < state.segments.as_slice().len() {
            let s = state.segments.as_slice()[segment];
            // Nothing of it is held exactly when it is one free range (free ranges are
            // maximal within their segment).
            let whole = state
                .free
                .find(s.start())
                .filter(|&index| state.free.as_slice()[index].len == s.len);
            let Some(index) = whole else {
                segment += 1;
                continue;
            };
            state.free.remove(index);
            state.segments.remove(segment);
            state.mapped -= s.len;
            // SAFETY: nothing of the segment is held (all of it was one free range, now
            // removed), and it came from `map` with this length; its bits go with it.
            unsafe {
                os::unmap(s.base, s.len);
                s.free_bits();
            }
            self.os_calls.fetch_add(1, Ordering::Relaxed);
        }
        self.publish(&state);
    }

    /// Purges the free pages whose decay time has passed.
    pub(crate) fn tick(&self) {
        let mut state = self.lock();
        let now = self.now();
        self.decay(&mut state, now);
        self.publish(&state);
    }

    /// Purges free pages until the dirty ones fit in what `room` leaves (a budget lowered).
    pub(crate) fn fit(&self, room: Room) {
        let mut state = self.lock();
        let allowed = room.for_dirty(state.carved);
        self.purge_to(&mut state, allowed);
        self.publish(&state);
    }

    /// Notes that a block of the layer has had huge-page advice.
    pub(crate) fn note_advised(&self) {
        self.advised.store(true, Ordering::Relaxed);
    }

    /// Withdraws huge-page advice from every segment, if a block had it: a budget set after
    /// the advice must not find huge pages made resident where it carves small blocks (the
    /// advice stays on a range after its block comes back). Pages already huge stay so until
    /// they are purged; new faults take small pages.
    pub(crate) fn forget_huge_pages(&self) {
        if !self.advised.swap(false, Ordering::Relaxed) {
            return;
        }
        let state = self.lock();
        for segment in state.segments.as_slice() {
            // SAFETY: a whole segment from `map`; withdrawing advice changes no contents.
            unsafe { os::no_huge_pages(segment.base, segment.len) };
            self.os_calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Raises the committed peak with `committed` (the bytes held plus the dirty pages, read
    /// by a caller that changed the first).
    pub(crate) fn raise_committed(&self, committed: u64) {
        self.peak_committed.fetch_max(committed, Ordering::Relaxed);
    }

    /// Bytes of free pages that may still be resident.
    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Bytes of segments mapped.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped.load(Ordering::Relaxed)
    }

    /// The most that the reservation plus the dirty pages reached when a block was carved.
    pub(crate) fn peak_committed(&self) -> u64 {
        self.peak_committed.load(Ordering::Relaxed)
    }

    /// Starts the peak again from `now`.
    pub(crate) fn reset_peak(&self, now: u64) {
        self.peak_committed.store(now, Ordering::Relaxed);
    }

    /// Calls to the OS so far.
    pub(crate) fn os_calls(&self) -> u64 {
        self.os_calls.load(Ordering::Relaxed)
    }

    /// Bytes purged so far.
    pub(crate) fn purged_bytes(&self) -> u64 {
        self.purged.load(Ordering::Relaxed)
    }

    fn publish(&self, state: &PageBooks) {
        self.dirty.store(state.dirty as u64, Ordering::Relaxed);
        self.mapped.store(state.mapped as u64, Ordering::Relaxed);
    }

    /// Maps a segment that holds `len` bytes at an `align`-aligned address; where in its free
    /// range they go, as [`FreeRanges::best_fit`] says.
    #[cold]
    fn map_for(&self, state: &mut PageBooks, len: usize, align: usize) -> Option<(usize, usize)> {
        // Doublings past SEGMENT_MAX are cut first: a shift by the count itself wrapped to 0
        // after 42 maps.
        let doublings = (SEGMENT_MAX / SEGMENT_FIRST).trailing_zeros();
        let step = SEGMENT_FIRST << state.maps.min(doublings);
        let need = len.checked_add(align - PAGE)?;
        let seg_len = need.max(step).checked_next_multiple_of(PAGE)?;
        // The segment first: a request the OS refuses takes no bookkeeping with it (the two
        // bit maps of a 1 TiB segment are 64 MiB of the system allocator's).
        let base = os::map(seg_len)?;
        self.os_calls.fetch_add(1, Ordering::Relaxed);
        let Some(segment) = Segment::new(base, seg_len) else {
            // SAFETY: mapped just above, never handed out.
            unsafe { os::unmap(base, seg_len) };
            return None;
        };
        let at = state
            .segments
            .as_slice()
            .partition_point(|s| s.start() < segment.start());
        let recorded = state.segments.insert(at, segment).is_ok()
            && state
                .free
                .insert(
                    Free {
                        start: segment.start(),
                        len: seg_len,
                        dirty: 0,
                        since: 0,
                    },
                    segment.bounds(),
                )
                .is_ok();
        if !recorded {
            if state
                .segments
                .as_slice()
                .get(at)
                .is_some_and(|s| s.base == base)
            {
                state.segments.remove(at);
            }
            // SAFETY: mapped just above, never handed out; its bits are used no more.
            unsafe {
                os::unmap(base, seg_len);
                segment.free_bits();
            }
            return None;
        }
        state.maps = state.maps.saturating_add(1);
        state.mapped += seg_len;
        // The new segment's range holds the request, clean.
        state.free.best_fit(len, align, |_| None)
    }

    /// Purges the free pages that stayed dirty for `decay_ms`.
    fn decay(&self, state: &mut PageBooks, now: u64) {
        if now < state.next_decay {
            return;
        }
        let mut next = u64::MAX;
        for index in 0..state.free.as_slice().len() {
            let free = state.free.as_slice()[index];
            if free.dirty == 0 {
                continue;
            }
            let due = free.since.saturating_add(self.decay_ms);
            if due <= now {
                self.purge(state, index);
            } else {
                next = next.min(due);
            }
        }
        state.next_decay = next;
    }

    /// Purges free pages until the dirty ones are at most `allowed` bytes, and on to
    /// [`PURGE_SLACK`] below that: from the range with the fewest dirty pages (a fragment,
    /// the least likely to hold the next large request whole), its last pages, as many as
    /// hold the excess (blocks are carved from a range's start, so its head is what the next
    /// request reuses); again while an excess is left.
    fn purge_to(&self, state: &mut PageBooks, allowed: usize) {
        if state.dirty <= allowed {
            return;
        }
        // Past the excess by PURGE_SLACK: the next carves find room without a purge each.
        let allowed = allowed.saturating_sub(PURGE_SLACK);
        while state.dirty > allowed {
            let excess = state.dirty - allowed;
            let (index, free) = state
                .free
                .as_slice()
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, f)| f.dirty > 0)
                .min_by_key(|(_, f)| f.dirty)
                .expect("dirty bytes lie in free ranges");
            let segment = state.segments.as_slice()[segment_of(&state.segments, free.start)];
            let (first, end) = segment.pages(free.start, free.end());
            let from = segment
                .bits
                .tail_holding(first, end, excess.div_ceil(PAGE))
                .max(first);
            let start = segment.start() + from * PAGE;
            let purged = self.purge_pages(&segment, start, free.end());
            let left = free.dirty - purged;
            state.free.set_dirty(index, left);
            state.dirty -= purged;
        }
    }

    /// Purges free range `index` whole.
    fn purge(&self, state: &mut PageBooks, index: usize) {
        let free = state.free.as_slice()[index];
        let segment = state.segments.as_slice()[segment_of(&state.segments, free.start)];
        let purged = self.purge_pages(&segment, free.start, free.end());
        state.free.set_dirty(index, free.dirty - purged);
        state.dirty -= purged;
    }

    /// Returns the free pages `[start, end)` of `segment` to the OS; their dirty bytes.
    fn purge_pages(&self, segment: &Segment, start: usize, end: usize) -> usize {
        let dirty = segment.dirty(start, end);
        // SAFETY: the pages lie in a free range of the segment: no one uses their contents.
        unsafe { os::purge(segment.at(start), end - start) };
        segment.mark(start, end, false);
        self.os_calls.fetch_add(1, Ordering::Relaxed);
        self.purged.fetch_add(dirty as u64, Ordering::Relaxed);
        dirty
    }
}

impl Drop for PageLayer {
    fn drop(&mut self) {
        let state = self.lock();
        for segment in state.segments.as_slice() {
            // SAFETY: the pool is gone, so no block of the segment is in use; it came from
            // `map` with this length; its bits go with it.
            unsafe {
                os::unmap(segment.base, segment.len);
                segment.free_bits();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
