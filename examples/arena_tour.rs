//! A tour of `SlotArena` from several threads: writers insert and remove records while
//! readers resolve keys concurrently, then the arena reports what happened.
//!
//! Run it with `cargo run --release --example arena_tour`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferropool::{ArenaError, SlotArena};

/// A descriptor-like record: which buffer, at what offset, how many elements.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Record {
    buffer: u32,
    offset: u64,
    len: u64,
}

fn main() {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2);
    let per_thread = 200_000u64;
    let arena = Arc::new(SlotArena::new());
    let stale_reads = Arc::new(AtomicU64::new(0));
    let good_reads = Arc::new(AtomicU64::new(0));

    // Records every reader can see; writers churn their own keys around them.
    let stable: Vec<_> = (0..64u32)
        .map(|i| {
            arena
                .insert(Record {
                    buffer: i,
                    offset: 0,
                    len: 1 << 10,
                })
                .expect("insert")
        })
        .collect();
    let stable = Arc::new(stable);

    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (arena, stable, stale, good) = (
                Arc::clone(&arena),
                Arc::clone(&stable),
                Arc::clone(&stale_reads),
                Arc::clone(&good_reads),
            );
            std::thread::spawn(move || {
                let mut last = None;
                for i in 0..per_thread {
                    let guard = arena.pin();
                    // Churn: insert, read back, remove the previous one.
                    let record = Record {
                        buffer: t as u32,
                        offset: i * 64,
                        len: 64,
                    };
                    let key = arena.insert(record).expect("insert");
                    assert_eq!(*arena.get(key, &guard).expect("fresh key"), record);
                    if let Some(old) = last.replace(key) {
                        arena.remove(old, &guard).expect("own key");
                        // The removed key is stale at once, with a typed error.
                        match arena.get(old, &guard) {
                            Err(ArenaError::Stale { .. }) => stale.fetch_add(1, Ordering::Relaxed),
                            other => panic!("a removed key resolved: {other:?}"),
                        };
                    }
                    // Concurrent reads of the shared records.
                    let k = stable[(i as usize + t) % stable.len()];
                    assert_eq!(arena.get(k, &guard).expect("stable key").len, 1 << 10);
                    good.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker panicked");
    }
    let elapsed = started.elapsed();
    let ops = threads as u64 * per_thread * 5; // insert, 2 gets, remove, stale get
    println!("ferropool arena tour: {threads} threads x {per_thread} rounds in {elapsed:.2?}");
    println!(
        "  {:.1} M arena operations/s",
        ops as f64 / elapsed.as_secs_f64() / 1e6
    );
    println!(
        "  reads of shared records:      {}",
        good_reads.load(Ordering::Relaxed)
    );
    println!(
        "  removed keys reported stale:  {}",
        stale_reads.load(Ordering::Relaxed)
    );
    println!(
        "  live records now:             {} (64 shared + 1 per thread)",
        arena.len()
    );
    println!("  slots allocated:              {}", arena.capacity());
    assert_eq!(arena.len(), 64 + threads);
}
