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
    /// Default 64. Larger batches amortise the deferral (each one pushes a bag onto the
    /// collector's global queue, which every thread of the collector shares: 256 made a
    /// two-thread churn about 20% faster); smaller ones recycle slots, and drop removed
    /// values, sooner. A removed value waits in its thread's batch until the batch is full
    /// (or [`SlotArena::flush`](super::SlotArena::flush) takes it), so values that own much memory call for small
    /// batches.
    pub removal_batch: u32,
    /// The epoch collector that protects readers. `None` uses crossbeam-epoch's global one.
    pub collector: Option<Collector>,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            first_page_len: 64,
            removal_batch: 64,
            collector: None,
        }
    }
}
