//! The pool's memory: the budget, what the pool holds from the system within it, the block
//! records, and the page layer or heap that the blocks come from and go back to. [`Memory`]
//! keeps its books private: the engine reserves, takes new blocks and releases through its
//! methods, and nothing else moves `reserved`, `held` or their peak.
//!
//! What decides *which* blocks go back (trim, the idle policy, budget pressure, the close)
//! is the engine's (`drain.rs`); this layer only does as it is told.

use std::alloc::Layout;
use std::ptr::NonNull;

use super::advise;
use super::blocks::{BlockTable, Record};
use crate::pool::config::PoolConfig;
use crate::pool::error::PoolError;
use crate::pool::observe::counters::ResetPeak;
use crate::pool::observe::stats::PoolStats;
use crate::pool::pages::os::PAGE;
use crate::pool::pages::{Beside, PageLayer, Room, PAGED_MIN_BLOCK};
use crate::sync::{global, system, AtomicU64, Ordering};

/// What the configuration says of a block's memory: where it comes from and its advice.
#[derive(Clone, Copy, Debug)]
struct BlockShape {
    alignment: usize,
    huge_pages: bool,
    prefault: bool,
    advise_min_block: usize,
    os_pages: bool,
    /// Whether heap blocks come from `System` directly rather than from the global
    /// allocator (for the pool behind ferropool's own global allocator, which must not call
    /// itself).
    system_blocks: bool,
}

/// The memory of one pool: its budget and books, its block records, its pages.
pub(in crate::pool) struct Memory {
    /// The byte budget (`u64::MAX` for none): the configuration's, until `set_budget`.
    budget: AtomicU64,
    /// Bytes held from the system, reservations in flight included: what the budget
    /// counts. Invariant: moved by [`reserve`](Memory::reserve) (never past `budget` as it
    /// was read then) and [`unreserve`](Memory::unreserve) only.
    reserved: AtomicU64,
    /// Bytes held from the system, reservations in flight left out: what reads report.
    /// Invariant: raised by [`hold`](Memory::hold) once the system granted a block,
    /// lowered by [`release`](Memory::release); never above `reserved`.
    held: AtomicU64,
    /// Invariant: at least every value `held` took since the last reset once its mover or
    /// a reader raised it, and no more than the largest of them: [`hold`](Memory::hold)
    /// raises it with the value its add wrote, and every read of `held` that is reported
    /// raises it with the value read first. So it never decreases but at a reset, it never
    /// counts a block the system has not granted (a request the system refuses leaves it as
    /// it was), and no value of before the last reset lands in it ([`ResetPeak`]).
    peak_reserved: ResetPeak,
    /// Of `held`, the bytes of blocks from the heap (those below the page layer's smallest
    /// block, or all with `os_pages` off): what the page layer's budget check adds to its own.
    heap_held: AtomicU64,
    system_allocations: AtomicU64,
    system_frees: AtomicU64,
    shape: BlockShape,
    /// One record per block the pool holds (and spare ones for blocks gone back).
    blocks: BlockTable,
    /// The pages under the class lists: every block of `pages::PAGED_MIN_BLOCK` bytes or more
    /// comes from here when `os_pages` is on.
    pages: PageLayer,
}

impl Memory {
    /// The memory of a pool of `config`, holding nothing; `system_blocks`: heap blocks come
    /// from `System` rather than the global allocator.
    pub(in crate::pool) fn new(config: &PoolConfig, system_blocks: bool) -> Self {
        Self {
            budget: AtomicU64::new(config.budget.unwrap_or(u64::MAX)),
            reserved: AtomicU64::new(0),
            held: AtomicU64::new(0),
            peak_reserved: ResetPeak::default(),
            heap_held: AtomicU64::new(0),
            system_allocations: AtomicU64::new(0),
            system_frees: AtomicU64::new(0),
            shape: BlockShape {
                alignment: config.alignment,
                huge_pages: config.huge_pages,
                prefault: config.prefault,
                advise_min_block: config.advise_min_block,
                os_pages: config.os_pages,
                system_blocks,
            },
            blocks: BlockTable::new(),
            pages: PageLayer::new(config.decay_ms),
        }
    }

    /// The byte budget, if any.
    #[inline]
    pub(in crate::pool) fn budget(&self) -> Option<u64> {
        Some(self.budget.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX)
    }

    /// Whether a budget is set (one load, for the hot paths that ask).
    #[inline(always)]
    pub(in crate::pool) fn budgeted(&self) -> bool {
        self.budget.load(Ordering::Relaxed) != u64::MAX
    }

    /// Sets the budget (`None`: no limit), purges the page layer's free pages down to it at
    /// once, and, with a budget, withdraws huge-page advice from the layer's pages.
    pub(in crate::pool) fn set_budget(&self, budget: Option<u64>) {
        let budget = budget.unwrap_or(u64::MAX);
        self.budget.store(budget, Ordering::Relaxed);
        if budget != u64::MAX {
            self.pages.forget_huge_pages();
        }
        self.fit_pages();
    }

    /// Purges the page layer's free pages until they fit in the budget beside what is held.
    pub(in crate::pool) fn fit_pages(&self) {
        self.pages
            .fit(self.room_under(self.budget.load(Ordering::Relaxed)));
    }

    /// Whether the pool holds more than its budget (one lowered below what it held): until it
    /// fits again, a freed block goes back to the system rather than to a cache.
    #[inline(always)]
    pub(in crate::pool) fn over_budget(&self) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        budget != u64::MAX && self.reserved.load(Ordering::Relaxed) > budget
    }

    /// What `budget` leaves the page layer: the budget, and the bytes held outside it.
    fn room_under(&self, budget: u64) -> Room {
        Room {
            budget,
            outside: self.heap_held.load(Ordering::Relaxed),
        }
    }

    /// Adds `bytes` to `reserved` if the budget allows.
    pub(in crate::pool) fn reserve(&self, bytes: u64) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        let mut current = self.reserved.load(Ordering::Relaxed);
        loop {
            let Some(next) = current.checked_add(bytes).filter(|&n| n <= budget) else {
                return false;
            };
            match self.reserved.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                // The peak moves once the system granted the block (`hold`): reads report
                // `held`, which leaves this reservation out until then.
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// Takes `bytes` off `reserved`: a reservation the system did not grant, or a block
    /// released.
    pub(in crate::pool) fn unreserve(&self, bytes: u64) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Whether `reserved` has room for `need` more bytes under the budget.
    pub(in crate::pool) fn has_room(&self, need: u64) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        self.reserved.load(Ordering::Relaxed).saturating_add(need) <= budget
    }

    /// A block of `class` (of `class_bytes`, reserved already) new from the system, zeroed
    /// if `zeroed`, with its record: held and counted. `None` if the system refuses the
    /// block; `Err` if no record is left for it (the block went back, the reservation
    /// stays the caller's to undo in both cases).
    pub(in crate::pool) fn new_block(
        &self,
        class: usize,
        class_bytes: usize,
        zeroed: bool,
    ) -> Option<Result<&Record, PoolError>> {
        let layout = self.layout(class_bytes);
        let addr = NonNull::new(self.allocate_block(class_bytes, layout, zeroed))?;
        let record = match self.blocks.claim() {
            Ok(record) => record,
            Err(error) => {
                // SAFETY: allocated just above with `layout`, never shared.
                unsafe { self.dealloc_block(addr.as_ptr(), layout, false) };
                return Some(Err(error));
            }
        };
        let record = self.blocks.record(record);
        record.set_block(addr, class);
        self.hold(class_bytes as u64);
        self.system_allocations.fetch_add(1, Ordering::Relaxed);
        Some(Ok(record))
    }

    /// Whether blocks of `class_bytes` come from the page layer (else from the heap).
    #[inline]
    pub(in crate::pool) fn paged(&self, class_bytes: usize) -> bool {
        self.shape.os_pages && class_bytes >= PAGED_MIN_BLOCK
    }

    /// A block of `class_bytes` (zeroed if `zeroed`) from where blocks of that size come
    /// from, with the advice the configuration asks for; null if the system refuses.
    fn allocate_block(&self, class_bytes: usize, layout: Layout, zeroed: bool) -> *mut u8 {
        let shape = &self.shape;
        let advised = class_bytes >= shape.advise_min_block;
        // Huge pages only without a budget: a huge page makes resident the bytes around a
        // block that the pool did not hand out, and the advice stays on the range after the
        // block goes back.
        let paged = self.paged(class_bytes);
        let huge_pages = shape.huge_pages && !(paged && self.budgeted());
        let raw = if paged {
            let align = if huge_pages && advised {
                layout.align().max(PAGE)
            } else {
                PAGE
            };
            self.pages
                .obtain(class_bytes, align, zeroed, || {
                    self.room_under(self.budget.load(Ordering::Relaxed))
                })
                .map_or(std::ptr::null_mut(), NonNull::as_ptr)
        } else {
            // SAFETY: `layout` has a non-zero size (every class is at least 8 bytes).
            let raw = unsafe {
                match (shape.system_blocks, zeroed) {
                    (true, true) => system::alloc_zeroed(layout),
                    (true, false) => system::alloc(layout),
                    (false, true) => global::alloc_zeroed(layout),
                    (false, false) => global::alloc(layout),
                }
            };
            if !raw.is_null() {
                self.heap_held
                    .fetch_add(class_bytes as u64, Ordering::Relaxed);
                if self.budgeted() {
                    // A heap block counts in the budget beside the free pages, which never
                    // carve for it: purge them until both fit, as a carve would.
                    self.fit_pages();
                    let committed =
                        self.reserved.load(Ordering::Relaxed) + self.pages.dirty_bytes();
                    self.pages.raise_committed(committed);
                }
            }
            raw
        };
        if !raw.is_null() && advised && (huge_pages || shape.prefault) {
            // SAFETY: a block of `class_bytes` fresh from the system or the page layer,
            // with its provenance, not yet handed out.
            unsafe { advise::advise(raw, class_bytes, huge_pages, shape.prefault) };
            if huge_pages && paged {
                self.pages.note_advised();
            }
        }
        raw
    }

    /// The layout of a block of `class_bytes`: the configured alignment, or 2 MiB for a block
    /// that gets transparent huge pages, so that huge pages can cover it end to end.
    fn layout(&self, class_bytes: usize) -> Layout {
        const HUGE_PAGE: usize = 2 << 20;
        let shape = &self.shape;
        let align = if shape.huge_pages
            && class_bytes >= shape.advise_min_block
            && class_bytes >= HUGE_PAGE
        {
            HUGE_PAGE
        } else {
            shape.alignment
        };
        Layout::from_size_align(class_bytes, align)
            .expect("class sizes and alignments are validated")
    }

    /// Returns a block's memory to where [`allocate_block`](Self::allocate_block) got it;
    /// `zero` when every byte of it is zero (its pages then go back clean, see
    /// [`PageLayer::give_back`]).
    ///
    /// # Safety
    ///
    /// `ptr` came from `allocate_block` with `layout`, and nothing uses it afterwards.
    unsafe fn dealloc_block(&self, ptr: *mut u8, layout: Layout, zero: bool) {
        if self.paged(layout.size()) {
            let block = NonNull::new(ptr).expect("a block is never null");
            let room = || self.room_under(self.budget.load(Ordering::Relaxed));
            // SAFETY: the caller's contract: the page layer gave out this block of this size.
            unsafe { self.pages.give_back(block, layout.size(), zero, room) };
            return;
        }
        self.heap_held
            .fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract, and `system_blocks` names the allocator it came from.
        unsafe {
            if self.shape.system_blocks {
                system::dealloc(ptr, layout);
            } else {
                global::dealloc(ptr, layout);
            }
        }
    }

    /// Returns the block of `record` (of `class_bytes`) to the system and the record to the
    /// spare list, and takes the block off the books.
    ///
    /// # Safety
    ///
    /// The caller owns the block (taken off a list or bin, or handed back), which
    /// [`new_block`](Self::new_block) gave with a class of `class_bytes`; nothing uses it
    /// afterwards.
    pub(in crate::pool) unsafe fn release(&self, record: u32, class_bytes: usize) {
        let rec = self.blocks.record(record);
        // Off a buffer, the record says whether the block is all zero (see `Record::request`).
        let zero = rec.known_zero();
        // SAFETY: the caller's contract; `allocate_block` (through `new_block`) allocated the
        // block with this layout.
        unsafe { self.dealloc_block(rec.addr().as_ptr(), self.layout(class_bytes), zero) };
        rec.clear_block();
        self.blocks.retire(record);
        self.held.fetch_sub(class_bytes as u64, Ordering::Relaxed);
        self.unreserve(class_bytes as u64);
        self.system_frees.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a block of `bytes` the system granted, and raises the peak with the sum.
    fn hold(&self, bytes: u64) {
        let since = self.peak_reserved.since();
        let held = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let _ = self.peak_reserved.raise(since, held);
    }

    /// The bytes held now (reservations in flight left out).
    pub(in crate::pool) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// `held` now, with its peak raised to it (so that no later read reports a lower peak
    /// than this value).
    pub(in crate::pool) fn held_and_peak(&self) -> (u64, u64) {
        self.peak_reserved.read(&self.held)
    }

    /// Starts the peaks again from now (see `PoolCounters::reset_peaks` for the race it
    /// tolerates): the bytes held, and the page layer's committed bytes (reserved plus
    /// dirty free pages).
    pub(in crate::pool) fn reset_peaks(&self) {
        self.peak_reserved.reset(&self.held);
        let committed = self.reserved.load(Ordering::Relaxed) + self.pages.dirty_bytes();
        self.pages.reset_peak(committed);
    }

    /// The block records, which the shared lists link.
    #[inline(always)]
    pub(in crate::pool) fn records(&self) -> &BlockTable {
        &self.blocks
    }

    /// The record of index `record`.
    #[inline(always)]
    pub(in crate::pool) fn record(&self, record: u32) -> &Record {
        self.blocks.record(record)
    }

    /// Calls `f` with every block record (a scan, for the reports).
    pub(in crate::pool) fn for_each_record(&self, f: impl FnMut(&Record)) {
        self.blocks.for_each(f);
    }

    /// The page layer's free bytes that may be resident now.
    pub(in crate::pool) fn dirty_bytes(&self) -> u64 {
        self.pages.dirty_bytes()
    }

    /// Purges every dirty free page and unmaps every segment nothing of which is held.
    pub(in crate::pool) fn trim_pages(&self) {
        self.pages.trim();
    }

    /// The page layer's clock: purges the free ranges that have been dirty too long.
    pub(in crate::pool) fn tick_pages(&self) {
        self.pages.tick();
    }

    /// Fills in the page layer's figures of `stats`, whose `reserved_bytes` and
    /// `peak_reserved_bytes` are read already: the committed bytes and their peak (raised
    /// to them), the bytes mapped, the system calls and the bytes returned.
    pub(in crate::pool) fn page_stats(&self, stats: &mut PoolStats) {
        let pages = &self.pages;
        stats.dirty_bytes = pages.dirty_bytes();
        stats.committed_bytes = stats.reserved_bytes + stats.dirty_bytes;
        pages.raise_committed(stats.committed_bytes);
        stats.peak_committed_bytes = pages.peak_committed().max(stats.peak_reserved_bytes);
        stats.mapped_bytes = pages.mapped_bytes();
        stats.os_calls = pages.os_calls();
        stats.purged_bytes = pages.purged_bytes();
    }

    /// Whether a free range of the page layer holds `bytes` of resident pages in a run.
    pub(in crate::pool) fn has_dirty_run(&self, bytes: usize) -> bool {
        self.pages.has_dirty_run(bytes)
    }

    /// Fills in the free bytes of the page layer beside each of `blocks`.
    pub(in crate::pool) fn free_beside(&self, blocks: &mut [Beside]) {
        self.pages.free_beside(blocks);
    }

    /// The blocks obtained from and released to the system so far.
    pub(in crate::pool) fn system_calls(&self) -> (u64, u64) {
        (
            self.system_allocations.load(Ordering::Relaxed),
            self.system_frees.load(Ordering::Relaxed),
        )
    }
}
