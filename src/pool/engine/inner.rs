//! The shared state of one pool, [`PoolInner`] (what every handle, buffer and thread cache
//! of the pool points to), and [`Handout`], a block handed out as the engine holds it.
//!
//! `PoolInner` is a composition of parts that keep their own state: the lifecycle
//! (`lifecycle.rs`), the thread caches (`cache.rs`), the shared lists (`lists.rs`), the
//! memory (`memory.rs`: budget, block records, pages), the books (`observe/books.rs`) and
//! the evictable values (`eviction/`). Here: the calling thread's cache, its joining the
//! exact counters, what the ways in and out share, and the pool as the eviction sees it.
//! Its other methods are by concern: the ways in (`alloc.rs`), the ways out (`free.rs`),
//! what goes back (`drain.rs`), what it reports (`report.rs`).

use std::fmt;
use std::ptr::NonNull;

use super::blocks::Record;
use super::cache::{PoolThreadCache, ThreadCaches};
use super::lifecycle::Lifecycle;
use super::lists::SharedLists;
use super::memory::Memory;
use crate::pool::class;
use crate::pool::config::PoolConfig;
use crate::pool::eviction::registry::{Evictor, PoolView};
use crate::pool::eviction::value::ValueBlock;
use crate::pool::observe::books::Books;
use crate::pool::observe::trace::PoolEventKind;
use crate::pool::pages::Beside;
use crate::thread;

/// The shared state of one pool: the composition of its parts.
///
/// In declaration order (`repr(C)`): the fields every cached allocation and free reads
/// first, together, then the cold parts: left to the compiler's order, the pool's one-thread
/// alloc+free was about 5% slower (`benches/README.md`).
#[repr(C)]
pub(crate) struct PoolInner {
    /// The pool-wide counters, those of threads without a cache, and the event trace
    /// (`observe/books.rs`).
    pub(in crate::pool) books: Books,
    pub(in crate::pool) id: u64,
    /// The thread caches, the classes they keep and the drains' tokens (`cache.rs`).
    pub(in crate::pool) caches: ThreadCaches,
    /// The handles, the close, and the buffers still out after it (`lifecycle.rs`; the close
    /// protocol in `close.rs` goes through its methods).
    pub(in crate::pool) life: Lifecycle,
    pub(in crate::pool) config: PoolConfig,
    /// The shared lists of blocks no thread cache holds, by class, and the idle policy's
    /// record of the classes drawn on (`lists.rs`, which keeps their invariant).
    pub(in crate::pool) lists: SharedLists,
    /// The budget, what the pool holds from the system, the block records and the pages
    /// (`memory.rs`, which keeps its books).
    pub(in crate::pool) memory: Memory,
    /// The evictable values of the pool and what their eviction counts (see `evict`).
    pub(in crate::pool) evictor: Evictor<Handout>,
}

impl fmt::Debug for PoolInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolInner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// See [`PoolInner::merges_on_free`].
const MERGE_MIN_BLOCK: usize = 256 << 10;

/// A block handed out, as the engine holds it: what a
/// [`PoolBuffer`](super::buffer::PoolBuffer) is made of (a buffer is this and nothing more),
/// and what an evictable value keeps while resident, so that the registry, a part of this
/// state, holds blocks without naming the buffer above it. Dropping it gives the block back
/// to its pool.
pub(in crate::pool) struct Handout {
    /// The block: at least `len` bytes (its class size), aligned to the pool's alignment.
    addr: NonNull<u8>,
    /// Requested bytes.
    len: usize,
    /// The pool. Invariant: alive while this block is handed out (a handed-out block is
    /// counted, and the pool is freed only once none is; see `close.rs`).
    pool: NonNull<PoolInner>,
    /// The block's record in the pool's block table (which says, among other things, which
    /// thread allocated the block). Invariant: valid while the pool is (records are never
    /// freed before their pool).
    record: NonNull<Record>,
    /// The block's class, whether all `len` bytes have been written, and whether every byte
    /// of the block is known to be zero (invariant: set only if it is, and cleared before
    /// anything can write the block: every way to a mutable pointer clears it first).
    shape: Shape,
}

// SAFETY: a `Handout` owns its bytes exclusively (like a `Box<[u8]>`), and its pool is
// shared through atomics only: dropping it on another thread returns the block from there.
unsafe impl Send for Handout {}
// SAFETY: `&Handout` only reads the bytes.
unsafe impl Sync for Handout {}

impl Handout {
    /// The block of `record` at `addr`, of `class`, handed out for `len` bytes of `pool`;
    /// `initialized` when its bytes are all written (or zero), `zero` when every byte of the
    /// block is zero.
    #[inline(always)]
    pub(in crate::pool) fn new(
        pool: NonNull<PoolInner>,
        addr: NonNull<u8>,
        len: usize,
        record: &Record,
        class: usize,
        initialized: bool,
        zero: bool,
    ) -> Self {
        Self {
            addr,
            len,
            pool,
            record: NonNull::from(record),
            shape: Shape::new(class, initialized, zero),
        }
    }

    /// The block's first byte, for reading.
    #[inline(always)]
    pub(in crate::pool) fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// The block's first byte, for writing: the block is no longer known to be zero.
    #[inline(always)]
    pub(in crate::pool) fn addr_mut(&mut self) -> NonNull<u8> {
        self.shape.forget_zero();
        self.addr
    }

    /// The bytes requested.
    #[inline(always)]
    pub(in crate::pool) fn len(&self) -> usize {
        self.len
    }

    /// The pool the block belongs to.
    #[inline(always)]
    pub(in crate::pool) fn pool(&self) -> NonNull<PoolInner> {
        self.pool
    }

    /// The block's record, whose address tells blocks apart.
    #[inline(always)]
    pub(in crate::pool) fn record(&self) -> NonNull<Record> {
        self.record
    }

    /// The block's class.
    #[inline(always)]
    pub(in crate::pool) fn class(&self) -> usize {
        self.shape.class()
    }

    /// Whether all `len` bytes have been written.
    #[inline(always)]
    pub(in crate::pool) fn initialized(&self) -> bool {
        self.shape.initialized()
    }

    /// Says whether all `len` bytes have been written.
    #[inline(always)]
    pub(in crate::pool) fn set_initialized(&mut self, initialized: bool) {
        self.shape.set_initialized(initialized);
    }

    /// Makes the requested length `len` (at most the class size): the record and the pool's
    /// counters follow.
    pub(in crate::pool) fn resize_requested(&mut self, len: usize) {
        // SAFETY: invariants on `pool` and `record`: both alive while the block is out.
        let (pool, record) = unsafe { (self.pool.as_ref(), self.record.as_ref()) };
        pool.count_resize(record, self.len, len);
        self.len = len;
    }
}

impl Drop for Handout {
    // Only a call with the block's fields as arguments, small enough for the compiler to
    // inline where a buffer dies, so the fields go to the pool in registers (see
    // `PoolInner::give_back`).
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `give_back`'s contract: the fields are this block's own (invariants on
        // `pool` and `record`: both alive while it is; `shape` and `len` are its class and
        // length, and says whether it is all zero), it is dropped once, and nothing of it is
        // used after this.
        unsafe {
            PoolInner::give_back(
                self.pool,
                self.record,
                self.shape.class(),
                self.len,
                self.shape.zero(),
            )
        }
    }
}

/// What the eviction's registry asks of a resident value's block.
impl ValueBlock for Handout {
    fn class(&self) -> usize {
        Handout::class(self)
    }

    fn bytes(&self) -> u64 {
        class::class_size(Handout::class(self)) as u64
    }

    fn start(&self) -> usize {
        self.addr.as_ptr() as usize
    }
}

/// A buffer's class and whether its bytes have all been written, in one word. As a `u16` and
/// a `bool`, moving a buffer (into a `Result`, out of it, into the caller's variable) copied
/// the two with a store each and read them back as one 8-byte word, which the CPU cannot
/// forward from its store buffer: a stall of some 15 cycles that took a quarter of an
/// allocation and free on one thread (AMD Zen 4). One `u64` moves as one store and one load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape(u64);

impl Shape {
    /// Bit set when the bytes have all been written; the class is in the low 32 bits.
    const INITIALIZED: u64 = 1 << 32;
    /// Bit set while every byte of the block (its whole class size) is known to be zero: the
    /// block came zero and nothing has been given a way to write it since.
    const ZERO: u64 = 1 << 33;

    fn new(class: usize, initialized: bool, zero: bool) -> Self {
        let flag = if initialized { Self::INITIALIZED } else { 0 };
        let zero = if zero { Self::ZERO } else { 0 };
        // Class numbers fit in 16 bits (checked at compile time in `class`).
        Self(class as u64 | flag | zero)
    }

    #[inline]
    fn class(self) -> usize {
        (self.0 & u64::from(u32::MAX)) as usize
    }

    fn initialized(self) -> bool {
        self.0 & Self::INITIALIZED != 0
    }

    #[inline]
    fn zero(self) -> bool {
        self.0 & Self::ZERO != 0
    }

    /// Says whether the bytes have all been written; the block is no longer known to be zero
    /// (a caller that vouches for its bytes has had a way to write them).
    fn set_initialized(&mut self, initialized: bool) {
        *self = Self::new(self.class(), initialized, false);
    }

    /// The block may be written from here on: no longer known to be zero.
    #[inline(always)]
    fn forget_zero(&mut self) {
        self.0 &= !Self::ZERO;
    }
}

impl PoolInner {
    /// The calling thread's cache, index and memory tag: one thread-local read when this
    /// thread's last pool operation was on this pool. `None` if the thread holds no index.
    #[inline(always)]
    pub(in crate::pool) fn my_cache(&self) -> Option<(&PoolThreadCache, u32, u32)> {
        self.my_remembered_cache().or_else(|| self.my_cache_slow())
    }

    /// [`my_cache`](Self::my_cache) when this thread's last pool operation was on this pool
    /// (one thread-local read), else `None`. Under loom, which has no thread-local memo, the
    /// whole `my_cache`, so that the models run the hot paths that start with it.
    #[inline(always)]
    pub(super) fn my_remembered_cache(&self) -> Option<(&PoolThreadCache, u32, u32)> {
        #[cfg(loom)]
        return self.my_cache_slow();
        #[cfg(not(loom))]
        {
            let (cache, thread, tag) = thread::remembered_pool_cache(self.id)?;
            // SAFETY: `my_cache_slow` cached this pointer from this pool's cache table (pool
            // identities are never reused), whose pages never move or free while the pool
            // lives; the caller keeps the pool alive.
            Some((unsafe { &*cache.cast::<PoolThreadCache>() }, thread, tag))
        }
    }

    /// The calling thread's cache if it has one already (a thread that never used the pool
    /// gets none, and no cache is made).
    pub(in crate::pool) fn my_existing_cache(&self) -> Option<&PoolThreadCache> {
        if let Some((cache, _, _)) = thread::remembered_pool_cache(self.id) {
            // SAFETY: as in `my_cache`.
            return Some(unsafe { &*cache.cast::<PoolThreadCache>() });
        }
        let thread = u32::try_from(thread::index()?).ok()?;
        self.caches.get(thread)
    }

    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn my_cache_slow(&self) -> Option<(&PoolThreadCache, u32, u32)> {
        let thread = u32::try_from(thread::index()?).ok()?;
        let cache = self.caches.get_or_make(thread)?;
        self.join_exact_counters(Some(thread));
        thread::remember_pool_cache(self.id, std::ptr::from_ref::<PoolThreadCache>(cache).cast());
        Some((cache, thread, thread::tag()))
    }

    /// Makes sure the calling thread (`thread`, with its cache claimed; `None` for a thread
    /// without a cache) may count in the exact counters (see the invariant on
    /// `LiveBytes::in_use`): the first thread with a cache becomes their sole writer; any
    /// other thread ends that, waiting out the sole writer's operation in flight. Outside
    /// any operation of the caller: it may wait for another thread's. Cheap when the
    /// counters are shared already, or the caller's.
    #[inline]
    pub(in crate::pool) fn join_exact_counters(&self, thread: Option<u32>) {
        if !self.config.exact_counters() {
            return;
        }
        if self.books.exact_joined(thread) {
            return;
        }
        self.join_exact_counters_slow(thread);
    }

    #[cold]
    #[inline(never)]
    fn join_exact_counters_slow(&self, thread: Option<u32>) {
        self.books.join_exact(thread, |writer| {
            // The sole writer's cache exists (it claimed it before it joined). From its next
            // operation on it sees the switch (its light fence pairs with this heavy one);
            // the one in flight, if any, is waited out.
            crate::sync::asymmetric::heavy();
            if let Some(cache) = self.caches.get(writer) {
                cache.wait_out();
            }
        });
    }

    /// Returns a block's memory to the system and its record to the spare list.
    ///
    /// # Safety
    ///
    /// The caller owns the block of `record` (taken off a list or bin, or handed back:
    /// nothing else can reach it), of `class`, and nothing uses it afterwards.
    pub(in crate::pool) unsafe fn release_block(&self, record: u32, class: usize) {
        let class_bytes = class::class_size(class);
        // SAFETY: the caller's contract; `system_alloc` obtained the block with this class.
        unsafe { self.memory.release(record, class_bytes) };
        self.books
            .trace(PoolEventKind::SystemFree, class_bytes as u64, class);
    }

    /// Starts an operation of a thread without a cache: the pool's open (and the operation
    /// counted, so the close waits for it), or closed.
    pub(in crate::pool) fn begin_cacheless(&self) -> bool {
        self.join_exact_counters(None);
        self.life.begin_cacheless()
    }

    /// Whether a block of `class`, freed by any thread, goes straight back to the page layer
    /// (where it merges with its free neighbours): one that merges on free and that no
    /// thread cache keeps.
    pub(in crate::pool) fn freed_to_pages(&self, class: usize) -> bool {
        !self.caches.keep(class) && self.merges_on_free(class::class_size(class))
    }

    /// Whether a freed block of `class_bytes` goes straight back to the page layer, past the
    /// shared lists (and the thread caches, for the free's cold path: the hot path,
    /// `free_cached`, bins a block its own thread frees without asking): under a budget,
    /// blocks of 256 KiB and more of the page layer. There it merges with the free pages
    /// beside it; under a budget the pool holds little beyond what is live, so the next
    /// large request of another size needs exactly such merged pages, and a block kept in
    /// its class would split them (the main job fitted to 75% of its peak: 11,000-13,000
    /// minor faults a step with such blocks listed, 0-4,200 without). Against the bytes of
    /// such a block, the page layer's lock and search cost little; smaller blocks keep the
    /// caches.
    #[inline]
    pub(in crate::pool) fn merges_on_free(&self, class_bytes: usize) -> bool {
        class_bytes >= MERGE_MIN_BLOCK && self.memory.paged(class_bytes) && self.memory.budgeted()
    }
}

/// The pool as its eviction sees it (`eviction/registry.rs`).
impl PoolView for PoolInner {
    fn trace_eviction(&self, bytes: u64, class: usize) {
        self.books.trace(PoolEventKind::Evict, bytes, class);
    }

    fn merges_on_free(&self, bytes: usize) -> bool {
        PoolInner::merges_on_free(self, bytes)
    }

    fn freed_to_pages(&self, class: usize) -> bool {
        PoolInner::freed_to_pages(self, class)
    }

    fn has_dirty_run(&self, bytes: usize) -> bool {
        self.memory.has_dirty_run(bytes)
    }

    fn free_beside(&self, blocks: &mut [Beside]) {
        self.memory.free_beside(blocks);
    }

    fn bytes_in_use(&self) -> u64 {
        self.in_use_now().0
    }
}
