//! Helpers shared by the benches.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Runs `body(thread, iters)` on `threads` threads released together; returns the wall time.
pub fn run_threads(threads: usize, iters: u64, body: &(impl Fn(usize, u64) + Sync)) -> Duration {
    let start_line = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let start_line = &start_line;
                scope.spawn(move || {
                    start_line.wait();
                    body(t, iters);
                })
            })
            .collect();
        start_line.wait();
        let started = Instant::now();
        for handle in handles {
            handle.join().unwrap();
        }
        started.elapsed()
    })
}
