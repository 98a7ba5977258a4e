//! Shards: each thread works on the lists of its own shard, so threads on different shards
//! share no list head. A thread's shard is its thread index (see `crate::thread`): a small
//! number, reused after the thread exits, so that the live threads of a process spread over
//! distinct shards.

use crossbeam_utils::CachePadded;

use crate::stack::TaggedStack;
use crate::sync::AtomicU64;

/// One shard's lists. Each head has a cache line of its own (`grown` shares the free list's:
/// the shard's own threads write both).
pub(super) struct Shard {
    /// Vacant slots, ready for `insert`.
    pub(super) free: TaggedStack,
    /// Slots of memory this shard claimed while other shards had vacant ones (a chunk, or
    /// the whole page a chunk started), up to `Arena::growth_before_stealing`. Only grows (a
    /// `trim` does not give it back), so a shard that keeps running dry ends up taking other
    /// shards' slots. A bound on memory, never a safety matter.
    pub(super) grown: AtomicU64,
    /// The removal batch being filled: `count << 32 | link` of slots removed but not yet
    /// handed to the epoch collector (by threads without a lane at hand: see `lane`).
    pub(super) removed: CachePadded<AtomicU64>,
    /// `removed` as a sweep last saw it (written by sweepers only).
    pub(super) seen_removed: AtomicU64,
}

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            free: TaggedStack::new(),
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
