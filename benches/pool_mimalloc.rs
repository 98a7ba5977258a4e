//! The `Vec<u8>` workloads of `benches/pool.rs` with mimalloc as the global allocator.
#![allow(missing_docs)]

mod common;
mod pool_common;

use criterion::Criterion;
use pool_common::*;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mimalloc = System("mimalloc_vec");
    let mut c = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1))
        .configure_from_args();
    no_touch(&mut c, &mimalloc);
    with_touch(&mut c, &mimalloc);
    with_fill(&mut c, &mimalloc);
    training_trace(&mut c, &mimalloc);
    c.final_summary();
    fault_table(&mimalloc);
    scaling_table(&mimalloc);
}
