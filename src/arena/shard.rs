//! Shards: each thread works on the lists of its own shard, so threads on different shards
//! share no list head. A thread's shard is its cache's number in the arena (see `cache`)
//! modulo the shard count, so threads spread over the shards in the order they first use the
//! arena; a thread without a cache uses its thread index (see `crate::thread`) instead.

use crossbeam_utils::CachePadded;

use crate::stack::{Link, TaggedStack};
use crate::sync::AtomicU64;

/// One shard's lists. Each head has a cache line of its own (the shard's own threads write
/// `grown` and `seen_removed` beside them).
pub(super) struct Shard {
    /// Vacant slots, ready for `insert`.
    pub(super) free: CachePadded<TaggedStack>,
    /// Slots of memory this shard claimed while other shards had vacant ones (a chunk, or
    /// the whole page a chunk started), up to `ArenaInner::growth_before_stealing`. Only grows (a
    /// `trim` does not give it back), so a shard that keeps running dry ends up taking other
    /// shards' slots. A bound on memory, never a safety matter.
    pub(super) grown: AtomicU64,
    /// The removal batch being filled: a [`SharedBatch`] word (`count << 32 | link`) of slots
    /// removed but not yet handed to the epoch collector (by threads without a cache at
    /// hand: see `cache`); 0 when empty. Moved by compare-exchange or swap only.
    pub(super) removed: CachePadded<AtomicU64>,
    /// `removed` as a sweep last saw it (written by sweepers only).
    pub(super) seen_removed: AtomicU64,
}

/// The word of a shard's shared removal batch: the slots in it (high half) and the link of
/// its first slot (low half; the rest follow through `ArenaInner::links`). The one place that
/// knows the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SharedBatch(pub(super) u64);

impl SharedBatch {
    /// The empty batch.
    pub(super) const EMPTY: SharedBatch = SharedBatch(0);

    /// A batch of `count` slots starting at `head`.
    pub(super) fn new(count: u32, head: Link) -> Self {
        Self((u64::from(count) << 32) | u64::from(head))
    }

    /// Slots in the batch.
    pub(super) fn count(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The link of its first slot (`NIL` when empty).
    pub(super) fn head(self) -> Link {
        self.0 as Link
    }
}

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            free: CachePadded::new(TaggedStack::new()),
            grown: AtomicU64::new(0),
            removed: CachePadded::new(AtomicU64::new(0)),
            seen_removed: AtomicU64::new(0),
        }
    }
}

/// Shards per arena: the machine's parallelism rounded up to a power of two, at most 64.
/// (More shards would spread more threads apart, but every shard's partial removal batch
/// holds removed values back: four per core doubled what a thread-heavy test held.)
/// Two under loom, so that models cover both a thread's own shard and stealing.
pub(super) fn shard_count() -> usize {
    #[cfg(loom)]
    return 2;
    #[cfg(not(loom))]
    {
        static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *COUNT.get_or_init(|| {
            std::thread::available_parallelism()
                .map_or(1, usize::from)
                .next_power_of_two()
                .min(64)
        })
    }
}
