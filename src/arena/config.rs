//! The configuration of a [`SlotArena`](super::SlotArena).

use crate::sync::epoch::Collector;

/// Configuration of a [`SlotArena`](super::SlotArena).
///
/// ```
/// use ferropool::{ArenaConfig, SlotArena};
/// let arena: SlotArena<u64> = SlotArena::with_config(ArenaConfig {
///     first_page_len: 4,
///     removal_batch: 8,
///     ..ArenaConfig::default()
/// })?;
/// assert_eq!(arena.capacity(), 0); // pages are allocated on the first insert
/// # Ok::<(), ferropool::ArenaError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ArenaConfig {
    /// Slots in the first page; each later page doubles. A power of two in `1..=65536`.
    pub first_page_len: u32,
    /// Removed slots handed to the epoch collector per deferred call, in `1..=4096`.
    /// Default 64. A removed value waits in its thread's batch until the batch is full (or
    /// [`SlotArena::flush`](super::SlotArena::flush) takes it, or, once the thread is idle,
    /// another thread's insert does), then in its thread's epoch
    /// bag for up to 7 more batches (see [Destructors](super::SlotArena#destructors)).
    /// Values that own much memory therefore call for small batches; larger ones amortise
    /// the deferral further. Each thread cache keeps room for one batch's slot indices
    /// (4 bytes a slot, counted in
    /// [`SlotArena::thread_state_bytes`](super::SlotArena::thread_state_bytes)).
    pub removal_batch: u32,
    /// Bytes of fresh slots each shard may claim for itself, while other shards still have
    /// vacant slots, before it takes theirs. Default 1 MiB; 0 takes other shards' slots
    /// first.
    ///
    /// A thread whose shard runs dry (its removals are still in their grace period) could take
    /// vacant slots from another shard, but then two threads write slots that share cache lines,
    /// and each insert that runs dry pays a refill (benches/README.md has the figures). Claiming a
    /// fresh chunk instead keeps every thread on its own slots. The bound keeps the arena from
    /// growing without end when one thread only inserts while another frees: past it, a dry shard
    /// takes other shards' slots as it would with 0. A claim counts the memory it takes: a chunk,
    /// or the whole page (each twice the one before) when the chunk starts a new one; a claim that
    /// would pass the bound is not made. So the arena holds at most this many bytes per shard (see
    /// `shards`) beyond what it would hold with 0, give or take a page when two threads of one
    /// shard run dry at the same moment.
    pub growth_before_stealing: usize,
    /// The epoch collector that protects readers. `None` uses crossbeam-epoch's global one.
    pub collector: Option<Collector>,
    /// Free-list shards, a power of two in `1..=64`. `None` (the default): the machine's
    /// parallelism rounded up to a power of two, at most 64. Threads spread over the shards
    /// in the order they first use the arena. Set it to make an arena behave the same on
    /// every machine (tests of how shards share slots, say).
    pub shards: Option<usize>,
    /// Slot indices the arena may use, in `1..=u32::MAX`: at most this many values live at
    /// once, and an insert past that fails with
    /// [`ArenaError::Full`](super::ArenaError::Full). Default `u32::MAX` (every index
    /// below `u32::MAX`, which is reserved). The page that holds the last index is
    /// allocated whole, so [`capacity`](super::SlotArena::capacity) may exceed it. A capped
    /// arena hands each full removal batch to the epoch collector at once (uncapped ones
    /// every 8 batches), so that an idle thread keeps no removed slot from the inserts, and
    /// [`ArenaError::Full`](super::ArenaError::Full) says what else may hold a slot.
    ///
    /// ```
    /// use ferropool::{ArenaConfig, ArenaError, SlotArena};
    /// let arena = SlotArena::with_config(ArenaConfig { max_slots: 2, ..ArenaConfig::default() })?;
    /// arena.insert('a')?;
    /// arena.insert('b')?;
    /// assert!(matches!(arena.insert('c'), Err(ArenaError::Full { capacity: 2 })));
    /// # Ok::<(), ArenaError>(())
    /// ```
    pub max_slots: u32,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            first_page_len: 64,
            removal_batch: 64,
            growth_before_stealing: 1 << 20,
            collector: None,
            shards: None,
            max_slots: u32::MAX,
        }
    }
}
