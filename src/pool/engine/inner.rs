//! The shared state of one pool, [`PoolInner`]: what every handle, buffer and thread cache
//! of the pool points to. Its methods live with their concern: `ops` (alloc and free),
//! `raw` (the front ends' blocks), `reserve` (memory from the system, the budget), `drain`
//! (trim, the idle policy, budget pressure), `stats` and `lifetime` (the close); the one
//! here records a trace event.

use std::fmt;

use super::super::counters::{OpCounters, PoolCounters, CACHELESS};
use super::super::evict::value::Evictor;
use super::super::pages::PageLayer;
use super::super::trace::{PoolEventKind, Trace};
use super::super::PoolConfig;
use super::blocks::BlockTable;
use super::cache::ThreadCaches;
use super::life::Lifecycle;
use super::lists::SharedLists;
use crate::sync::AtomicU64;

/// The shared state of one pool.
pub(crate) struct PoolInner {
    pub(in crate::pool) id: u64,
    pub(in crate::pool) config: PoolConfig,
    /// Whether blocks come from `System` directly rather than from the global allocator (for
    /// the pool behind ferropool's own global allocator, which must not call itself).
    pub(in crate::pool) system_blocks: bool,
    /// The handles, the close, and the buffers still out after it (`life.rs`; the close
    /// protocol in `lifetime.rs` goes through its methods).
    pub(in crate::pool) life: Lifecycle,
    pub(in crate::pool) blocks: BlockTable,
    /// The shared lists of blocks no thread cache holds, by class, and the idle policy's
    /// record of the classes drawn on (`lists.rs`, which keeps their invariant).
    pub(in crate::pool) lists: SharedLists,
    /// The thread caches, the classes they keep and the drains' tokens (`cache.rs`).
    pub(in crate::pool) caches: ThreadCaches,
    pub(in crate::pool) cacheless: OpCounters,
    pub(in crate::pool) counters: PoolCounters,
    /// The byte budget (`u64::MAX` for none): the configuration's, until `set_budget`.
    pub(in crate::pool) budget: AtomicU64,
    /// The event trace, once enabled (by the configuration or `enable_trace`).
    pub(in crate::pool) trace: std::sync::OnceLock<Trace>,
    /// The evictable values of the pool and what their eviction counts (see `evict`).
    pub(in crate::pool) evictor: Evictor,
    /// The pages under the class lists: every block of `pages::PAGED_MIN_BLOCK` bytes or more
    /// comes from here when `config.os_pages` is on.
    pub(in crate::pool) pages: PageLayer,
}

impl fmt::Debug for PoolInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolInner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PoolInner {
    /// Records an event made by the calling thread, if tracing is on.
    #[inline(always)]
    pub(in crate::pool) fn trace(&self, kind: PoolEventKind, bytes: u64, class: usize) {
        if let Some(trace) = self.trace.get() {
            let thread = crate::thread::index().map_or(CACHELESS, |t| t as u32);
            trace.record(kind, bytes, class, thread, "");
        }
    }
}
