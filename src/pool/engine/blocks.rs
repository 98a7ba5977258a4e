//! Block records: one per block of memory the pool holds from the system.
//!
//! Records live in a [`PagedTable`] indexed by `u32`, so lists link them by index with an ABA
//! tag (see `crate::stack`) and a racing pop reads a stale link, never freed memory. A record
//! is never freed while its pool exists; when its block goes back to the system the record
//! goes on a spare list for the next block. A record also says who holds its block now (for
//! [`BufferPool::snapshot`](super::super::BufferPool::snapshot)): written with relaxed stores by
//! whoever moves the block, read as a best-effort picture.

use crossbeam_utils::CachePadded;

use crate::paged::PagedTable;
use crate::pool::class;
use crate::pool::error::PoolError;
use crate::pool::observe::stats::BlockInfo;
use crate::pool::observe::tag::MemoryTag;
use crate::stack::{TaggedStack, NIL};
use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Records in the table's first page.
const FIRST_PAGE: u32 = 256;

/// A block's address, its list link, and what a snapshot reports of it.
///
/// One cache line each (64 bytes; 40 of them used): the thread that holds a block writes its
/// record on every allocation and free, and records are claimed side by side, so two
/// threads' blocks shared lines (two threads each allocating and freeing a 4 KiB block of
/// their own: `benches/README.md`). For the blocks this pool is made for (4 KiB and up) the
/// line is under 2% of the block.
#[repr(align(64))]
pub(crate) struct Record {
    /// The record's own index in the table (never changes).
    pub(in crate::pool) index: u32,
    /// The block's address. Written by the thread that obtained the block from the system
    /// before the record is published on any list (list pushes are `Release`).
    pub(in crate::pool) addr: AtomicPtr<u8>,
    /// The next record (plus one; `NIL` ends) on the shared list the record is on (a class
    /// list or the spare list); meaningless off a list.
    pub(in crate::pool) next: AtomicU32,
    /// The next record in the thread bin the record is on (bins link records by address:
    /// only their owner or a drainer that excludes it walks them, so no ABA tag is needed);
    /// meaningless off a bin.
    pub(in crate::pool) bin_next: AtomicPtr<Record>,
    /// While handed out: the thread index of the allocating thread plus one (0 otherwise).
    pub(in crate::pool) holder: AtomicU32,
    /// While handed out: the caller's memory tag (0 for none).
    pub(in crate::pool) tag: AtomicU32,
    /// While handed out: the requested size, and the class in the top 16 bits. Off a
    /// buffer (listed or binned), the same word with [`Record::KNOWN_ZERO`] set when every
    /// byte of the block is zero: written by the buffer's last holder before the block is
    /// given back, read by the next taker before its `hand_out` (which clears the bit).
    pub(in crate::pool) request: AtomicU64,
}

/// The table of records. Its pages are never released while the pool lives, so `record`
/// never dangles.
pub(in crate::pool) struct BlockTable {
    records: PagedTable<Record>,
    /// Records below this index have been handed out at least once.
    claimed: AtomicU32,
    /// Records whose block went back to the system.
    spare: CachePadded<TaggedStack>,
}

impl BlockTable {
    pub(in crate::pool) fn new() -> Self {
        Self {
            records: PagedTable::new(FIRST_PAGE),
            claimed: AtomicU32::new(0),
            spare: CachePadded::new(TaggedStack::new()),
        }
    }

    /// The record at `index`, which was returned by [`claim`](Self::claim).
    #[inline]
    pub(in crate::pool) fn record(&self, index: u32) -> &Record {
        self.records.at(index)
    }

    /// A record for a new block.
    pub(in crate::pool) fn claim(&self) -> Result<u32, PoolError> {
        if let Some(index) = self.spare.pop(|i| &self.record(i).next) {
            return Ok(index);
        }
        let index = self.claimed.fetch_add(1, Ordering::Relaxed);
        if index == u32::MAX {
            self.claimed.fetch_sub(1, Ordering::Relaxed);
            return Err(PoolError::TooManyBlocks);
        }
        let (page, _) = self.records.locate(index);
        let start = self.records.page_start(page) as u32;
        self.records.ensure_page(page, |offset| Record {
            index: start + offset as u32,
            addr: AtomicPtr::new(std::ptr::null_mut()),
            next: AtomicU32::new(NIL),
            bin_next: AtomicPtr::new(std::ptr::null_mut()),
            holder: AtomicU32::new(0),
            tag: AtomicU32::new(0),
            request: AtomicU64::new(0),
        });
        Ok(index)
    }

    /// Returns a record whose block went back to the system.
    pub(in crate::pool) fn retire(&self, index: u32) {
        self.spare.push_chain(index + 1, &self.record(index).next);
    }

    /// Calls `f` with every record ever claimed.
    pub(in crate::pool) fn for_each(&self, mut f: impl FnMut(&Record)) {
        let claimed = self.claimed.load(Ordering::Acquire);
        for index in 0..claimed {
            if let Some(record) = self.records.get(index) {
                f(record);
            }
        }
    }
}

impl Record {
    /// Set in `request` while the block is off a buffer and all its bytes are zero. Sizes stay
    /// below it: the largest class is `2^40` bytes.
    const KNOWN_ZERO: u64 = 1 << 47;

    /// Says that every byte of the block, of `class`, is zero, as its buffer (of `requested`
    /// bytes) is given back by the thread that holds it.
    #[inline]
    pub(in crate::pool) fn mark_zero(&self, class: usize, requested: usize) {
        self.request.store(
            ((class as u64) << 48) | requested as u64 | Self::KNOWN_ZERO,
            Ordering::Relaxed,
        );
    }

    /// Whether every byte of the block is zero: read by the thread that just took the block
    /// off a bin or list, before [`hand_out`](Self::hand_out). (The giver's relaxed store
    /// reaches it through the push and pop that handed the block over, or is its own.)
    #[inline]
    pub(in crate::pool) fn known_zero(&self) -> bool {
        self.request.load(Ordering::Relaxed) & Self::KNOWN_ZERO != 0
    }

    /// Marks the block handed out to thread `thread` for a request of `size` bytes.
    #[inline(always)]
    pub(in crate::pool) fn hand_out(&self, thread: u32, tag: u32, class: usize, size: usize) {
        self.holder.store(thread + 1, Ordering::Relaxed);
        self.tag.store(tag, Ordering::Relaxed);
        self.request
            .store(((class as u64) << 48) | size as u64, Ordering::Relaxed);
    }

    /// Changes the requested size of a block handed out (an in-place reallocation).
    #[inline]
    pub(in crate::pool) fn set_requested(&self, size: usize) {
        let class = self.request.load(Ordering::Relaxed) >> 48;
        self.request
            .store((class << 48) | size as u64, Ordering::Relaxed);
    }

    /// Marks the block back in the pool; returns the thread index of the thread it was handed
    /// out to (`CACHELESS` for a thread without one).
    #[inline(always)]
    pub(in crate::pool) fn take_back(&self) -> u32 {
        let allocator = self.allocator();
        self.holder.store(0, Ordering::Relaxed);
        allocator
    }

    /// The thread index of the thread the block is handed out to (`CACHELESS` for a thread
    /// without one), read by the thread that holds the buffer.
    #[inline(always)]
    pub(in crate::pool) fn allocator(&self) -> u32 {
        // The freeing thread owns the buffer (it reached it through whatever synchronised
        // the hand-over), so its relaxed accesses see the allocator's store.
        self.holder.load(Ordering::Relaxed).wrapping_sub(1)
    }
}

impl Record {
    /// The block's address.
    ///
    /// # Safety
    ///
    /// The record holds a block: it was claimed and given one with
    /// [`set_block`](Self::set_block), and not released since.
    #[inline(always)]
    pub(in crate::pool) unsafe fn addr(&self) -> std::ptr::NonNull<u8> {
        let addr = self.addr.load(Ordering::Relaxed);
        debug_assert!(!addr.is_null(), "a record without a block");
        // SAFETY: a record holding a block has its non-null address (the caller's contract).
        unsafe { std::ptr::NonNull::new_unchecked(addr) }
    }

    /// Gives a freshly claimed record its block, of `class`.
    pub(in crate::pool) fn set_block(&self, addr: std::ptr::NonNull<u8>, class: usize) {
        self.addr.store(addr.as_ptr(), Ordering::Relaxed);
        self.holder.store(0, Ordering::Relaxed);
        self.request.store((class as u64) << 48, Ordering::Relaxed);
    }

    /// Forgets the block (it went back to the system).
    pub(in crate::pool) fn clear_block(&self) {
        self.addr.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.holder.store(0, Ordering::Relaxed);
    }

    /// `(class, handed out?)` of a record holding a block, for statistics.
    pub(in crate::pool) fn picture(&self) -> Option<(usize, bool)> {
        if self.addr.load(Ordering::Relaxed).is_null() {
            return None;
        }
        let class = (self.request.load(Ordering::Relaxed) >> 48) as usize;
        Some((class, self.holder.load(Ordering::Relaxed) != 0))
    }

    /// What a snapshot reports of a handed-out block.
    pub(in crate::pool) fn live_info(&self) -> Option<BlockInfo> {
        let holder = self.holder.load(Ordering::Relaxed);
        if holder == 0 || self.addr.load(Ordering::Relaxed).is_null() {
            return None;
        }
        let request = self.request.load(Ordering::Relaxed);
        let class = (request >> 48) as usize;
        Some(BlockInfo {
            requested: (request & (Self::KNOWN_ZERO - 1)) as usize,
            block_bytes: class::class_size(class),
            thread: holder - 1,
            tag: MemoryTag::from_raw(self.tag.load(Ordering::Relaxed)),
        })
    }
}
