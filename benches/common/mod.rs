//! Helpers shared by the benches.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Runs `body(thread, iters)` on `threads` threads released together; returns the wall time.
pub(crate) fn run_threads(
    threads: usize,
    iters: u64,
    body: &(impl Fn(usize, u64) + Sync),
) -> Duration {
    let start_line = Barrier::new(threads);
    // Each worker times itself; the run lasts from the first start to the last end. (Timing
    // from the spawning thread would miss the work done before it is scheduled again, which
    // with more threads than cores can be most of it.)
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let start_line = &start_line;
                scope.spawn(move || {
                    start_line.wait();
                    let started = Instant::now();
                    body(t, iters);
                    (started, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let last = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    last - first
}

/// The least, the median and the greatest of `values` (at least one): what the runners
/// print for a set of repeated runs.
#[allow(dead_code, reason = "unused by the retain bench")]
pub(crate) fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let last = values.len() - 1;
    (values[0], values[values.len() / 2], values[last])
}
