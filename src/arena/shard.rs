//! Shards: each thread works on the lists of its own shard, so threads on different shards
//! share no list head. A thread's shard is its thread index (see `crate::thread`): a small
//! number, reused after the thread exits, so that the live threads of a process spread over
//! distinct shards.

use crossbeam_utils::CachePadded;

use crate::stack::TaggedStack;
use crate::sync::{AtomicU32, AtomicU64};

/// One shard's lists. Each head has a cache line of its own (the counters share the free
/// list's: the shard's own threads write them all).
pub(super) struct Shard {
    /// Vacant slots, ready for `insert`.
    pub(super) free: TaggedStack,
    /// Full removal batches handed to the collector; every [`FLUSH_EVERY`]th one pushes
    /// the thread's epoch bag to the collector's shared queue. A hint, never a safety
    /// matter.
    pub(super) deferred: AtomicU32,
    /// Fresh slots this shard claimed while other shards had vacant ones, up to
    /// `Arena::growth_before_stealing`. Only grows (a `trim` does not give it back), so a
    /// shard that keeps running dry ends up taking other shards' slots.
    pub(super) grown: AtomicU64,
    /// The removal batch being filled: `count << 32 | link` of slots removed but not yet
    /// handed to the epoch collector.
    pub(super) removed: CachePadded<AtomicU64>,
}

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            free: TaggedStack::new(),
            deferred: AtomicU32::new(0),
            grown: AtomicU64::new(0),
            removed: CachePadded::new(AtomicU64::new(0)),
        }
    }
}

/// A thread pushes its epoch bag (up to 64 deferred functions, each here a whole removal
/// batch) to the collector's shared queue once every this many full batches of its shard,
/// rather than after each: each push allocates a bag and passes through state that every
/// thread of the collector shares, and pushing after every batch cost two threads churning
/// one arena about a quarter of their throughput. A batch left in the bag waits until the
/// thread defers more, refills, flushes or exits, so an idle thread holds at most
/// `FLUSH_EVERY - 1` full batches. One under loom, where models count on each batch reaching
/// the collector at once.
pub(super) const FLUSH_EVERY: u32 = if cfg!(loom) { 1 } else { 8 };

/// Shards per arena: the machine's parallelism rounded up to a power of two, at most 64.
/// (More shards would spread more threads apart, but every shard's partial removal batch
/// holds removed values back: four per core doubled what a thread-heavy test held.)
/// Two under loom, so that models cover both a thread's own shard and stealing.
pub(super) fn shard_count() -> usize {
    if cfg!(loom) {
        return 2;
    }
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
    #[cfg(loom)]
    unreachable!()
}
