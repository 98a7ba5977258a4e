//! Integration tests of `SlotArena`'s invariants, through the public API only, one module
//! per concern: `basics` (keys, discards, pages, configuration, errors), `capped` (arenas
//! at their cap, `trim` beside every operation), `reclaim` (removal batches, grace periods,
//! idle and exited threads, sweeps) and `shards` (growth bounds, stealing, hands).

mod common;

/// The tests, a module per concern (each a file in `tests/arena/`), and the helpers they
/// share.
mod arena {
    mod basics;
    mod capped;
    mod reclaim;
    mod shards;

    use std::collections::HashSet;
    use std::sync::Arc;

    use super::common::{self, scaled, DropLedger};
    use ferropool::{ArenaConfig, ArenaError, Collector, SlotArena, SlotPhase};

    fn small(collector: &Collector, first_page_len: u32, removal_batch: u32) -> ArenaConfig {
        ArenaConfig {
            first_page_len,
            removal_batch,
            collector: Some(collector.clone()),
            ..ArenaConfig::default()
        }
    }

    /// [`small`], capped at `max_slots` slot indices, with `shards` shards.
    fn capped(
        collector: &Collector,
        max_slots: u32,
        shards: usize,
        first_page_len: u32,
        removal_batch: u32,
    ) -> SlotArena<u32> {
        SlotArena::with_config(ArenaConfig {
            max_slots,
            shards: Some(shards),
            ..small(collector, first_page_len, removal_batch)
        })
        .unwrap()
    }
}
