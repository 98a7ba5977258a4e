//! The `Vec<u8>` workloads of `benches/pool.rs` with mimalloc as the global allocator.
#![allow(missing_docs)]

mod common;
mod pool_common;

use criterion::Criterion;
use pool_common::*;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    if std::env::var_os("FERROPOOL_BENCH_ONLY_PAIR").is_some() {
        pair_table();
        return;
    }
    let mimalloc = System("mimalloc_vec");
    if std::env::var_os("FERROPOOL_BENCH_ONLY_STEP").is_some() {
        producer_consumer(&mimalloc, &|| 0);
        return;
    }
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
    producer_consumer(&mimalloc, &|| 0);
    scaling_table(&mimalloc);
    pair_table();
}

/// `benches/pool.rs`'s direct-call alloc + free runner, for `Vec` on mimalloc.
fn pair_table() {
    for size in PAIR_SIZES {
        let ns = pair_ns(PAIR_CALLS, || vec_pair(size));
        println!(
            "alloc + free, direct calls, best of 5 x {PAIR_CALLS}, {size:>8} B: mimalloc Vec {ns:5.1} ns"
        );
    }
}
