//! Per-thread caches: one per (thread, pool), found through a thread-local registry.
//!
//! The owning thread is the only one that touches a cache, so its hot path (a `Vec` pop or
//! push) takes no lock and performs no read-modify-write. A cache is bounded in bytes and in
//! blocks per class; what does not fit goes to the pool's shared lists. When the thread
//! exits, the registry's destructor hands every cached block back to its pool and folds the
//! thread's counters into the pool's. When thread-locals are already gone (a buffer dropped
//! from another thread-local's destructor) the callers fall back to the shared lists.

use std::cell::RefCell;

use super::stats::{bump, bump_i, ThreadCounters};
use super::{Block, PoolInner};
use crate::identity::next_identity;
use crate::sync::{thread_local, Arc};

#[cfg(not(loom))]
thread_local! {
    static CACHES: RefCell<Vec<ThreadCache>> = const { RefCell::new(Vec::new()) };
}
// loom's `thread_local!` takes no `const` initialiser.
#[cfg(loom)]
thread_local! {
    static CACHES: RefCell<Vec<ThreadCache>> = RefCell::new(Vec::new());
}

/// Runs `f` on this thread's cache for `pool`, creating it on first use. `None` when caches
/// are off, the thread-locals are being destroyed or the registry is already borrowed on
/// this thread.
#[inline]
pub(super) fn with_cache<R>(
    pool: &'static PoolInner,
    f: impl FnOnce(&mut ThreadCache) -> R,
) -> Option<R> {
    find_cache(pool, true, f)
}

/// [`with_cache`], creating the cache only if `create`.
#[inline]
fn find_cache<R>(
    pool: &'static PoolInner,
    create: bool,
    f: impl FnOnce(&mut ThreadCache) -> R,
) -> Option<R> {
    if pool.config.thread_cache_bytes == 0 {
        return None; // caches are off: everything goes through the shared lists
    }
    CACHES
        .try_with(|caches| {
            let mut caches = caches.try_borrow_mut().ok()?;
            if let Some(cache) = caches.iter_mut().find(|c| std::ptr::eq(c.pool, pool)) {
                return Some(f(cache));
            }
            if !create {
                return None;
            }
            caches.push(ThreadCache::new(pool));
            caches.last_mut().map(f)
        })
        .ok()
        .flatten()
}

/// Returns this thread's cached blocks of `pool` to the system. Returns the bytes released.
pub(super) fn release_current(pool: &'static PoolInner) -> u64 {
    find_cache(pool, false, |cache| cache.catch_up(pool.trim_count())).unwrap_or(0)
}

/// Retires every cache of this thread, as thread exit does: cached blocks go to their pools'
/// lists and the counters are folded into the pools'. Returns the bytes moved.
pub(super) fn retire_current() -> u64 {
    let caches = CACHES
        .try_with(|caches| caches.try_borrow_mut().map(|mut c| std::mem::take(&mut *c)))
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let moved = caches.iter().map(|cache| cache.bytes as u64).sum();
    // Dropped outside the borrow: a cache's `Drop` reaches its pool, which may look here.
    drop(caches);
    moved
}

/// One thread's cache for one pool.
pub(super) struct ThreadCache {
    pool: &'static PoolInner,
    /// Cached blocks by class.
    bins: Vec<Vec<Block>>,
    /// Bytes in `bins`.
    bytes: usize,
    /// The pool's trim count when this cache last looked; a change means "flush".
    seen_trims: u64,
    /// The pool's thread-cache bounds, copied here to keep the free path on one cache line.
    /// `max_block` is 0 once the pool is closed, so nothing is kept.
    max_block: usize,
    max_bytes: usize,
    max_per_class: usize,
    /// This thread's counters, also registered with the pool.
    pub(super) counters: Arc<ThreadCounters>,
    /// A small process-wide index of this thread, for the trace.
    pub(super) thread: u32,
}

impl ThreadCache {
    fn new(pool: &'static PoolInner) -> Self {
        let counters = Arc::new(ThreadCounters::default());
        pool.register_thread(Arc::clone(&counters));
        let config = &pool.config;
        Self {
            pool,
            bins: Vec::new(),
            bytes: 0,
            seen_trims: pool.trim_count(),
            max_block: config.thread_cache_max_block,
            max_bytes: config.thread_cache_bytes,
            max_per_class: config.thread_cache_blocks_per_class,
            counters,
            thread: next_identity().get() as u32,
        }
    }

    /// If the pool was trimmed since we last looked, releases our blocks too.
    #[inline]
    fn follow_trims(&mut self) {
        let trims = self.pool.trim_count();
        if trims != self.seen_trims {
            self.catch_up(trims);
        }
    }

    /// Follows the pool's trim number `trims`: releases every cached block, and keeps none
    /// from now on if the pool is closed. Returns the bytes released.
    fn catch_up(&mut self, trims: u64) -> u64 {
        self.seen_trims = trims;
        if self.pool.is_closed() {
            self.max_block = 0;
        }
        self.flush(true)
    }

    /// A cached block of `class`, for a request of `requested` bytes, counted as a hit.
    #[inline]
    pub(super) fn take(
        &mut self,
        class: usize,
        class_bytes: usize,
        requested: usize,
    ) -> Option<Block> {
        self.follow_trims();
        let block = self.bins.get_mut(class).and_then(Vec::pop)?;
        self.bytes -= class_bytes;
        bump(&self.counters.hits);
        self.count_in_use(class_bytes as i64, requested as i64);
        Some(block)
    }

    /// Counts an allocation the cache could not serve.
    #[inline]
    pub(super) fn count_miss(&self, class_bytes: usize, requested: usize) {
        bump(&self.counters.misses);
        self.count_in_use(class_bytes as i64, requested as i64);
    }

    #[inline(always)]
    fn count_in_use(&self, class_bytes: i64, requested: i64) {
        bump_i(&self.counters.in_use, class_bytes);
        bump_i(&self.counters.requested, requested);
    }

    /// Counts a free and keeps `block` if it fits; returns it otherwise.
    #[inline]
    pub(super) fn put(
        &mut self,
        block: Block,
        class: usize,
        class_bytes: usize,
        requested: usize,
    ) -> Option<Block> {
        bump(&self.counters.frees);
        self.count_in_use(-(class_bytes as i64), -(requested as i64));
        self.follow_trims();
        if class_bytes > self.max_block || self.bytes + class_bytes > self.max_bytes {
            return Some(block);
        }
        if self.bins.len() <= class {
            self.bins.resize_with(class + 1, Vec::new);
        }
        let bin = &mut self.bins[class];
        if bin.len() >= self.max_per_class {
            return Some(block);
        }
        bin.push(block);
        self.bytes += class_bytes;
        None
    }

    /// Moves every cached block to the system (`to_system`) or to the pool's shared lists
    /// (which release them too if the pool is closed). Returns the bytes moved.
    fn flush(&mut self, to_system: bool) -> u64 {
        let moved = self.bytes as u64;
        for (class, bin) in self.bins.iter_mut().enumerate() {
            for block in bin.drain(..) {
                if to_system {
                    self.pool.release_block(block, class);
                } else {
                    self.pool.give_back(block, class);
                }
            }
        }
        self.bytes = 0;
        moved
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        self.flush(false);
        self.pool.retire_thread(&self.counters);
    }
}

impl std::fmt::Debug for ThreadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCache")
            .field("bytes", &self.bytes)
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}
