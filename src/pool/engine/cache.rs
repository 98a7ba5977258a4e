//! Per-thread caches: in every pool a thread uses, the thread's *thread index* (a small number,
//! reused after the thread exits) names one cache, found with one table lookup. A cache holds the
//! thread's cache of blocks (a *bin* per small class: blocks this thread allocated and freed again)
//! and its counters.
//!
//! # Who touches a cache
//!
//! Its *owner* (the thread with its index) reads and writes it, with plain (relaxed) atomic
//! accesses, inside an operation bracketed by [`PoolThreadCache::begin_operation`] and
//! [`PoolThreadCache::end_operation`]. Other threads *drain* it (trim, budget pressure, the
//! pool's close) without waiting for the owner to come back, through the cache's
//! [`Handshake`] (see `crate::handshake`): afterwards either the drainer sees the owner busy
//! (and waits for that one operation to end) or the owner sees the drain (and leaves the
//! bins alone while it lasts). The pool's close pairs its `closed` flag with the same fences.
//!
//! Nothing between `begin_operation` and `end_operation` may panic (arithmetic there wraps,
//! nothing there allocates or runs user code): a panic would leave the owner busy for good,
//! and a drain or the close would wait for it forever.
//!
//! The counters are the owner's alone (single writer: a load and a store, no read-modify-
//! write); readers sum them across caches. Closing the pool reads them for the last time once
//! every owner is out of its operation (see `close.rs`).

use crossbeam_utils::CachePadded;

use super::blocks::Record;
use super::lists::LIST_SHARDS;
use crate::handshake::{Busy, Handshake};
use crate::pool::config::BIN_CLASSES;
use crate::pool::observe::counters::{bump, OpCounters, OpTotals, Writers};
use crate::roster::Roster;
use crate::sync::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// The drain token of an owner draining its own cache (drainers' tokens are odd; see
/// [`ThreadCaches::drain_token`]).
const OWN_DRAIN: u32 = 2;

/// The thread caches of one pool: one per thread index that used it (see `crate::roster`),
/// which classes they keep, and the tokens of the drains that take them.
pub(in crate::pool) struct ThreadCaches {
    roster: Roster<CachePadded<PoolThreadCache>>,
    /// Drain tokens handed out so far (see [`drain_token`](Self::drain_token)).
    tokens: AtomicU32,
    /// Classes below this one go through the thread caches (from the configuration).
    cached_classes: usize,
}

impl ThreadCaches {
    /// No cache yet; the caches keep the classes below `cached_classes`.
    pub(in crate::pool) fn new(cached_classes: usize) -> Self {
        Self {
            roster: Roster::new(4),
            tokens: AtomicU32::new(1),
            cached_classes,
        }
    }

    /// Whether blocks of `class` go through the thread caches.
    #[inline(always)]
    pub(in crate::pool) fn keep(&self, class: usize) -> bool {
        class < self.cached_classes
    }

    /// The cache of thread index `thread`, if that thread made one.
    #[inline]
    pub(in crate::pool) fn get(&self, thread: u32) -> Option<&PoolThreadCache> {
        self.roster.get(thread).map(|cache| &**cache)
    }

    /// The cache of thread index `thread`, made now if it has none (on the shard its number
    /// names); `None` if the roster cannot grow.
    pub(in crate::pool) fn get_or_make(&self, thread: u32) -> Option<&PoolThreadCache> {
        self.roster
            .get_or_claim(thread, |number| {
                let shard = number as usize & (LIST_SHARDS - 1);
                CachePadded::new(PoolThreadCache::new(shard))
            })
            .map(|cache| &**cache)
    }

    /// Calls `f` with every cache, whatever the thread indices.
    pub(in crate::pool) fn for_each(&self, f: impl FnMut(&PoolThreadCache)) {
        self.roster.iter().map(|cache| &**cache).for_each(f);
    }

    /// Every thread's counts of its operations added up, the caches' and `cacheless` (those
    /// of threads without a cache): the frees of every set first (with acquire loads), then
    /// the allocations with `order`. A block is freed after its allocation was counted, and
    /// a free read with acquire brings that allocation's count along, so no sum counts more
    /// frees or freed bytes than allocations. The one place that adds the counts up: for
    /// the statistics, the bytes in use without exact counters, and the close.
    pub(in crate::pool) fn op_totals(&self, cacheless: &OpCounters, order: Ordering) -> OpTotals {
        let mut totals = OpTotals::default();
        self.for_each(|cache| cache.counters.add_frees_to(&mut totals));
        cacheless.add_frees_to(&mut totals);
        self.for_each(|cache| cache.counters.add_allocations_to(&mut totals, order));
        cacheless.add_allocations_to(&mut totals, order);
        totals
    }

    /// A token no other drain of this pool holds now (odd: never 0, the free flag, nor the
    /// owner's own drain).
    pub(in crate::pool) fn drain_token(&self) -> u32 {
        self.tokens.fetch_add(2, Ordering::Relaxed) | 1
    }

    /// The bytes the caches and their table take.
    pub(in crate::pool) fn footprint(&self) -> usize {
        self.roster.footprint()
    }
}

/// One thread's cache in one pool.
pub(in crate::pool) struct PoolThreadCache {
    /// The owner's operations and the drainers' flag; the idle policy reads its operation
    /// count.
    handshake: Handshake,
    /// Bins by class: stacks of block records linked through `bin_next`. Invariant: read or
    /// written only by the owner inside an operation that found the handshake free to use, or
    /// by the drainer that claimed it once the owner is out.
    bins: [Bin; BIN_CLASSES],
    /// Bytes in the bins (same rule as `bins`).
    binned: AtomicU64,
    /// The owner's counts of its operations (written by the owner alone).
    counters: OpCounters,
    /// The cache's operation count when the idle policy (`trim_idle`, on any thread) last
    /// looked; written by that policy only.
    seen_operations: AtomicU64,
    /// Consecutive idle rounds (`trim_idle` calls that found `seen_operations` unchanged);
    /// written by the idle policy only.
    idle_rounds: AtomicU32,
    /// The shard of the shared lists this thread pushes to and pops from first: the cache's
    /// number in the pool modulo the shard count (see `PoolInner::lists`), so threads spread
    /// over the shards in the order they first use the pool. Fixed at creation.
    shard: usize,
}

/// One class's stack of cached blocks.
struct Bin {
    /// The top record (null: empty).
    head: AtomicPtr<Record>,
    /// Records on the stack.
    count: AtomicU32,
}

/// The outcome of [`PoolThreadCache::begin_operation`].
#[derive(Debug)]
pub(in crate::pool) enum Entry {
    /// The pool is open; `cache_usable` says whether the bins may be used. End the
    /// operation with [`PoolThreadCache::end_operation`]`(busy)`.
    Open { cache_usable: bool, busy: Busy },
    /// The pool is closed: the operation must not touch the cache (the owner is not busy).
    Closed,
}

impl PoolThreadCache {
    /// A cache whose thread uses `shard` of the shared lists.
    pub(in crate::pool) fn new(shard: usize) -> Self {
        Self {
            shard,
            handshake: Handshake::new(),
            bins: std::array::from_fn(|_| Bin {
                head: AtomicPtr::new(std::ptr::null_mut()),
                count: AtomicU32::new(0),
            }),
            binned: AtomicU64::new(0),
            counters: OpCounters::default(),
            seen_operations: AtomicU64::new(0),
            idle_rounds: AtomicU32::new(0),
        }
    }

    /// Starts an operation of the owner.
    #[inline(always)]
    pub(in crate::pool) fn begin_operation(&self, closed: &AtomicBool) -> Entry {
        let busy = self.handshake.begin();
        if closed.load(Ordering::Acquire) {
            self.handshake.end(busy);
            return Entry::Closed;
        }
        Entry::Open {
            cache_usable: self.handshake.may_use(),
            busy,
        }
    }

    /// Ends an operation of the owner: everything it did is visible to a drainer or closer
    /// that then sees the sequence move on.
    #[inline(always)]
    pub(in crate::pool) fn end_operation(&self, busy: Busy) {
        self.handshake.end(busy);
    }

    /// The shard of the shared lists this thread pushes to and pops from first.
    #[inline(always)]
    pub(in crate::pool) fn shard(&self) -> usize {
        self.shard
    }

    /// Counts a block handed out by the owner (`hit`: from its bin), inside an operation.
    #[inline(always)]
    pub(in crate::pool) fn count_alloc(&self, hit: bool, class_bytes: usize, requested: usize) {
        self.counters
            .count_alloc(hit, class_bytes, requested, Writers::Owner);
    }

    /// Counts a block given back by the owner, inside an operation.
    #[inline(always)]
    pub(in crate::pool) fn count_free(&self, class_bytes: usize, requested: usize) {
        self.counters
            .count_free(class_bytes, requested, Writers::Owner);
    }

    /// Counts a block's requested size changed from `old` to `new` bytes by the owner, inside
    /// an operation.
    pub(in crate::pool) fn count_resize(&self, old: usize, new: usize) {
        self.counters.count_resize(old, new, Writers::Owner);
    }

    /// The idle policy's round (`trim_idle`): the rounds in a row in which the owner made no
    /// operation, this one included (0 when it made one since the last round).
    pub(in crate::pool) fn idle_rounds(&self) -> u32 {
        let operations = self.handshake.operations();
        let seen = self.seen_operations.swap(operations, Ordering::Relaxed);
        let idle = if seen == operations {
            self.idle_rounds.load(Ordering::Relaxed).saturating_add(1)
        } else {
            0
        };
        self.idle_rounds.store(idle, Ordering::Relaxed);
        idle
    }

    /// Pops a cached block of `class` (owner, inside an operation with bins usable).
    #[inline(always)]
    pub(in crate::pool) fn pop(&self, class: usize, class_bytes: usize) -> Option<&Record> {
        let bin = &self.bins[class];
        let head = bin.head.load(Ordering::Relaxed);
        // SAFETY: a bin holds pointers to records of this pool's block table, which are never
        // freed while the pool lives (and the caller keeps it alive).
        let record = unsafe { head.as_ref() }?;
        bin.head
            .store(record.bin_next.load(Ordering::Relaxed), Ordering::Relaxed);
        bin.count.store(
            bin.count.load(Ordering::Relaxed).wrapping_sub(1),
            Ordering::Relaxed,
        );
        bump(&self.binned, (class_bytes as u64).wrapping_neg());
        Some(record)
    }

    /// Caches `record`'s block in the bin of `class` if it fits `max_blocks` and `max_bytes`
    /// (owner, inside an operation with bins usable); whether it did.
    #[inline(always)]
    pub(in crate::pool) fn push(
        &self,
        class: usize,
        class_bytes: usize,
        record: &Record,
        max_blocks: usize,
        max_bytes: usize,
    ) -> bool {
        let bin = &self.bins[class];
        let count = bin.count.load(Ordering::Relaxed);
        let binned = self.binned.load(Ordering::Relaxed);
        // (Nothing inside an operation may panic, hence no unchecked `+ 1` on the count.)
        if count as usize >= max_blocks
            || count == u32::MAX
            || binned + class_bytes as u64 > max_bytes as u64
        {
            return false;
        }
        record
            .bin_next
            .store(bin.head.load(Ordering::Relaxed), Ordering::Relaxed);
        bin.head
            .store(std::ptr::from_ref(record).cast_mut(), Ordering::Relaxed);
        bin.count.store(count + 1, Ordering::Relaxed);
        self.binned
            .store(binned + class_bytes as u64, Ordering::Relaxed);
        true
    }

    /// A drainer's first step (see `crate::handshake`): claims the cache with `token` if it
    /// caches anything (a racy look: blocks the owner cached before the caller synchronised
    /// with it are seen). False for an empty cache, or one another drainer holds (that one
    /// takes its blocks). After every claim, one heavy fence, then
    /// [`take_claimed`](Self::take_claimed) for each cache claimed.
    pub(in crate::pool) fn claim_if_holding(&self, token: u32) -> bool {
        self.binned() > 0 && self.handshake.claim_as(token)
    }

    /// Whether the drainer with `token` claimed this cache.
    pub(in crate::pool) fn claimed_by(&self, token: u32) -> bool {
        self.handshake.claimed_by(token)
    }

    /// Takes every cached block of a cache the caller claimed, once a heavy fence followed the
    /// claim (or once the pool's close waited every owner out, after which no owner touches
    /// its bins): waits only for the operation the owner may still be running, calls
    /// `each(class, record)` for each block, hands the cache back and returns the bytes taken.
    pub(in crate::pool) fn take_claimed(&self, mut each: impl FnMut(usize, &Record)) -> u64 {
        self.wait_out();
        // The owner is out of the operation it was in, and every later one sees `drain` set
        // (or the pool closed): the bins are ours.
        let taken = self.binned.load(Ordering::Relaxed);
        for (class, bin) in self.bins.iter().enumerate() {
            let mut head = bin.head.swap(std::ptr::null_mut(), Ordering::Relaxed);
            bin.count.store(0, Ordering::Relaxed);
            // SAFETY: as in `pop`: bin entries are records of the live pool's table.
            while let Some(record) = unsafe { head.as_ref() } {
                head = record.bin_next.load(Ordering::Relaxed);
                each(class, record);
            }
        }
        self.binned.store(0, Ordering::Relaxed);
        self.handshake.hand_back();
        taken
    }

    /// The owner's own drain, outside an operation (no fence needed: the caller is the
    /// owner, and no operation of it is in flight): the bytes taken, or 0 if a drainer holds
    /// the cache (that one takes the blocks).
    pub(in crate::pool) fn drain_own(&self, each: impl FnMut(usize, &Record)) -> u64 {
        if self.claim_if_holding(OWN_DRAIN) {
            self.take_claimed(each)
        } else {
            0
        }
    }

    /// After a heavy fence that followed the caller's store of a flag the owner checks
    /// (the pool's `closed`): waits until the owner is out of the operation it was in at the
    /// fence, if any (see [`Handshake::wait_out`]).
    pub(in crate::pool) fn wait_out(&self) {
        self.handshake.wait_out();
    }

    /// Bytes cached in the bins (a snapshot).
    pub(in crate::pool) fn binned(&self) -> u64 {
        self.binned.load(Ordering::Relaxed)
    }
}
