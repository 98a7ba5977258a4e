//! `SlotArena` against the arenas a user would pick instead, in the same run:
//! `slab` (unsynchronised, the floor), `RwLock<slab::Slab>`, `sharded-slab` and
//! `concurrent-slotmap`.
//!
//! Workloads (see benches/README.md for how to read the numbers):
//! - `single/…`: one thread, insert + get + remove of one value per iteration;
//! - `own_keys_2t/…`: two threads at once, each inserting, reading and removing its own keys;
//!   time is wall time per iteration (each thread runs that many iterations concurrently);
//! - `shared_reads_{1,2}t/…`: 1 or 2 threads reading the same 256 prefilled keys; time is
//!   wall time for `iters` reads per thread, so scaling is `2 * t(1t) / t(2t)`.
//!
//! Every read (ours and the peers') takes its own protection: an epoch pin for ferropool and
//! concurrent-slotmap, a slot guard for sharded-slab, a read lock for `RwLock<Slab>`.
//!
//! The scaling tables are printed as Markdown a row at a time, on purpose: each row shows as
//! soon as its thread count is measured (a table crate would hold the rows to the end).

#![allow(missing_docs)] // criterion's macros generate undocumented items

mod common;

use std::hint::black_box;
use std::sync::RwLock;
use std::time::Duration;

use common::run_threads;
use criterion::{criterion_group, BenchmarkId, Criterion};
use ferropool::SlotArena;

const SHARED_KEYS: usize = 256;

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("single");
    group.bench_function("ferropool", |b| {
        let arena = SlotArena::new();
        b.iter(|| {
            let guard = arena.pin();
            let key = arena.insert([1, 2]).unwrap();
            black_box(arena.get(key, &guard).unwrap());
            black_box(arena.remove(key, &guard).unwrap());
        })
    });
    group.bench_function("slab", |b| {
        let mut slab = slab::Slab::new();
        b.iter(|| {
            let key = slab.insert([1u64, 2]);
            black_box(slab.get(key).unwrap());
            black_box(slab.remove(key));
        })
    });
    group.bench_function("rwlock_slab", |b| {
        let slab = RwLock::new(slab::Slab::new());
        b.iter(|| {
            let key = slab.write().unwrap().insert([1u64, 2]);
            black_box(*slab.read().unwrap().get(key).unwrap());
            black_box(slab.write().unwrap().remove(key));
        })
    });
    group.bench_function("sharded_slab", |b| {
        let slab = sharded_slab::Slab::new();
        b.iter(|| {
            let key = slab.insert([1u64, 2]).unwrap();
            black_box(*slab.get(key).unwrap());
            black_box(slab.remove(key));
        })
    });
    group.bench_function("concurrent_slotmap", |b| {
        let map = concurrent_slotmap::SlotMap::new(1 << 20);
        b.iter(|| {
            let guard = map.pin();
            let key = map.insert([1u64, 2], &guard);
            black_box(map.get(key, &guard).unwrap());
            black_box(map.remove(key, &guard).unwrap());
        })
    });
    group.finish();
}

fn own_keys_two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("own_keys_2t");
    group.bench_function("ferropool", |b| {
        let arena = SlotArena::new();
        b.iter_custom(|iters| {
            run_threads(2, iters, &|_, n| {
                for _ in 0..n {
                    let guard = arena.pin();
                    let key = arena.insert([1, 2]).unwrap();
                    black_box(arena.get(key, &guard).unwrap());
                    black_box(arena.remove(key, &guard).unwrap());
                }
            })
        })
    });
    group.bench_function("rwlock_slab", |b| {
        let slab = RwLock::new(slab::Slab::new());
        b.iter_custom(|iters| {
            run_threads(2, iters, &|_, n| {
                for _ in 0..n {
                    let key = slab.write().unwrap().insert([1u64, 2]);
                    black_box(*slab.read().unwrap().get(key).unwrap());
                    black_box(slab.write().unwrap().remove(key));
                }
            })
        })
    });
    group.bench_function("sharded_slab", |b| {
        let slab = sharded_slab::Slab::new();
        b.iter_custom(|iters| {
            run_threads(2, iters, &|_, n| {
                for _ in 0..n {
                    let key = slab.insert([1u64, 2]).unwrap();
                    black_box(*slab.get(key).unwrap());
                    black_box(slab.remove(key));
                }
            })
        })
    });
    group.bench_function("concurrent_slotmap", |b| {
        let map = concurrent_slotmap::SlotMap::new(1 << 22);
        b.iter_custom(|iters| {
            run_threads(2, iters, &|_, n| {
                for _ in 0..n {
                    let guard = map.pin();
                    let key = map.insert([1u64, 2], &guard);
                    black_box(map.get(key, &guard).unwrap());
                    black_box(map.remove(key, &guard).unwrap());
                }
            })
        })
    });
    group.finish();
}

fn shared_reads(c: &mut Criterion) {
    for threads in [1usize, 2] {
        let mut group = c.benchmark_group(format!("shared_reads_{threads}t"));
        group.bench_function(BenchmarkId::from_parameter("ferropool"), |b| {
            let arena = SlotArena::new();
            let keys: Vec<_> = (0..SHARED_KEYS as u64)
                .map(|i| arena.insert([i, i]).unwrap())
                .collect();
            b.iter_custom(|iters| {
                run_threads(threads, iters, &|t, n| {
                    for i in 0..n as usize {
                        let guard = arena.pin();
                        let key = keys[(i + t * 7) % SHARED_KEYS];
                        black_box(arena.get(key, &guard).unwrap());
                    }
                })
            })
        });
        group.bench_function(BenchmarkId::from_parameter("rwlock_slab"), |b| {
            let mut slab = slab::Slab::new();
            let keys: Vec<_> = (0..SHARED_KEYS as u64)
                .map(|i| slab.insert([i, i]))
                .collect();
            let slab = RwLock::new(slab);
            b.iter_custom(|iters| {
                run_threads(threads, iters, &|t, n| {
                    for i in 0..n as usize {
                        let key = keys[(i + t * 7) % SHARED_KEYS];
                        black_box(*slab.read().unwrap().get(key).unwrap());
                    }
                })
            })
        });
        group.bench_function(BenchmarkId::from_parameter("sharded_slab"), |b| {
            let slab = sharded_slab::Slab::new();
            let keys: Vec<_> = (0..SHARED_KEYS as u64)
                .map(|i| slab.insert([i, i]).unwrap())
                .collect();
            b.iter_custom(|iters| {
                run_threads(threads, iters, &|t, n| {
                    for i in 0..n as usize {
                        let key = keys[(i + t * 7) % SHARED_KEYS];
                        black_box(*slab.get(key).unwrap());
                    }
                })
            })
        });
        group.bench_function(BenchmarkId::from_parameter("concurrent_slotmap"), |b| {
            let map = concurrent_slotmap::SlotMap::new(1 << 16);
            let keys: Vec<_> = {
                let guard = map.pin();
                (0..SHARED_KEYS as u64)
                    .map(|i| map.insert([i, i], &guard))
                    .collect()
            };
            b.iter_custom(|iters| {
                run_threads(threads, iters, &|t, n| {
                    for i in 0..n as usize {
                        let guard = map.pin();
                        let key = keys[(i + t * 7) % SHARED_KEYS];
                        black_box(map.get(key, &guard).unwrap());
                    }
                })
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = single_thread, own_keys_two_threads, shared_reads
}

// ---- scaling tables: aggregate throughput at 1 to 16 threads, every peer in this run ----

/// Keys each thread (or the shared table) holds.
const KEYS: usize = 1000;
const THREADS: [usize; 5] = [1, 2, 4, 8, 16];

/// Runs `work` 5 times and returns the median of `ops / seconds`, in millions (on a shared
/// 2-core machine one run in three or four can lose a core to a neighbour).
fn mops(ops: usize, mut work: impl FnMut() -> Duration) -> f64 {
    median_mops(ops, (0..5).map(|_| work()).collect())
}

/// The median of `runs` of `ops` operations each, in M operations/s.
fn median_mops(ops: usize, runs: Vec<Duration>) -> f64 {
    let rates = runs.iter().map(|run| ops as f64 / run.as_secs_f64() / 1e6);
    common::spread(rates.collect()).1
}

/// The churn workload: each thread inserts `KEYS` keys of its own, reads them, removes them,
/// `rounds` times (3 operations per key and round).
fn churn_ops(threads: usize, rounds: usize) -> usize {
    threads * rounds * KEYS * 3
}

/// One run of ferropool's churn: each removal by `discard` (no pin) or by `remove` under a
/// pin of its own (the removed value is readable while the pin lives).
fn ours_churn(threads: usize, rounds: usize, discard: bool) -> Duration {
    let arena = SlotArena::new();
    run_threads(threads, rounds as u64, &|_, n| {
        let mut keys = Vec::with_capacity(KEYS);
        for _ in 0..n {
            keys.extend((0..KEYS as u64).map(|i| arena.insert([i, i]).unwrap()));
            for &key in &keys {
                let guard = arena.pin();
                black_box(arena.get(key, &guard).unwrap());
            }
            if discard {
                for key in keys.drain(..) {
                    arena.discard(black_box(key)).unwrap();
                }
            } else {
                for key in keys.drain(..) {
                    let guard = arena.pin();
                    black_box(arena.remove(key, &guard).unwrap());
                }
            }
        }
    })
}

/// One run of sharded-slab's churn.
fn sharded_churn(threads: usize, rounds: usize) -> Duration {
    let slab = sharded_slab::Slab::new();
    run_threads(threads, rounds as u64, &|_, n| {
        let mut keys = Vec::with_capacity(KEYS);
        for _ in 0..n {
            keys.extend((0..KEYS as u64).map(|i| slab.insert([i, i]).unwrap()));
            for &key in &keys {
                black_box(*slab.get(key).unwrap());
            }
            for key in keys.drain(..) {
                black_box(slab.remove(key));
            }
        }
    })
}

fn churn_table(rounds: usize, thread_counts: &[usize]) {
    println!("churn, aggregate M operations/s (each thread: insert {KEYS} own keys, read, remove; {rounds} rounds; ratios: median of the 5 rounds' own ratios)");
    println!("| threads | ferropool, discard | ferropool, pinned remove | sharded-slab | discard / sharded-slab | pinned remove / sharded-slab | concurrent-slotmap | RwLock<Slab> |");
    println!("|---|---|---|---|---|---|---|---|");
    for &threads in thread_counts {
        let ops = churn_ops(threads, rounds);
        // Five rounds, each a run of both removals and of sharded-slab, in an order that
        // rotates from round to round; a ratio is taken within each round, so that a
        // neighbour slowing the machine for a while weighs on both sides of it.
        let (mut discard, mut remove, mut sharded) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..5 {
            for which in 0..3 {
                match (run + which) % 3 {
                    0 => discard.push(ours_churn(threads, rounds, true)),
                    1 => remove.push(ours_churn(threads, rounds, false)),
                    _ => sharded.push(sharded_churn(threads, rounds)),
                }
            }
        }
        let within = |ours: &[Duration]| {
            let ratios = ours
                .iter()
                .zip(&sharded)
                .map(|(ours, sharded)| sharded.as_secs_f64() / ours.as_secs_f64());
            common::spread(ratios.collect()).1
        };
        let (discard_ratio, remove_ratio) = (within(&discard), within(&remove));
        let (discard, remove) = (median_mops(ops, discard), median_mops(ops, remove));
        let sharded = median_mops(ops, sharded);
        let slotmap = mops(ops, || {
            let map = concurrent_slotmap::SlotMap::new(1 << 22);
            run_threads(threads, rounds as u64, &|_, n| {
                let mut keys = Vec::with_capacity(KEYS);
                for _ in 0..n {
                    keys.extend((0..KEYS as u64).map(|i| map.insert([i, i], &map.pin())));
                    for &key in &keys {
                        let guard = map.pin();
                        black_box(map.get(key, &guard).unwrap());
                    }
                    for key in keys.drain(..) {
                        let guard = map.pin();
                        black_box(map.remove(key, &guard).unwrap());
                    }
                }
            })
        });
        let rwlock = mops(ops, || {
            let slab = RwLock::new(slab::Slab::new());
            run_threads(threads, rounds as u64, &|_, n| {
                let mut keys = Vec::with_capacity(KEYS);
                for _ in 0..n {
                    keys.extend((0..KEYS as u64).map(|i| slab.write().unwrap().insert([i, i])));
                    for &key in &keys {
                        black_box(*slab.read().unwrap().get(key).unwrap());
                    }
                    for key in keys.drain(..) {
                        black_box(slab.write().unwrap().remove(key));
                    }
                }
            })
        });
        println!(
            "| {threads} | {discard:.1} | {remove:.1} | {sharded:.1} | {discard_ratio:.2}x | {remove_ratio:.2}x | {slotmap:.1} | {rwlock:.1} |"
        );
    }
}

fn shared_read_table(passes: usize) {
    println!("shared-key reads, aggregate M reads/s ({KEYS} keys inserted up front, every thread reads all of them, {passes} passes; 10 times as many with a pin per pass)");
    println!("| threads | ferropool, pin per get | ferropool, pin per pass | concurrent-slotmap, pin per get | sharded-slab | RwLock<Slab> |");
    println!("|---|---|---|---|---|---|");
    let arena = SlotArena::new();
    let ours_keys: Vec<_> = (0..KEYS as u64)
        .map(|i| arena.insert([i, i]).unwrap())
        .collect();
    let map = concurrent_slotmap::SlotMap::new(1 << 16);
    let map_keys: Vec<_> = (0..KEYS as u64)
        .map(|i| map.insert([i, i], &map.pin()))
        .collect();
    let sharded = sharded_slab::Slab::new();
    let sharded_keys: Vec<_> = (0..KEYS as u64)
        .map(|i| sharded.insert([i, i]).unwrap())
        .collect();
    let mut slab = slab::Slab::new();
    let slab_keys: Vec<_> = (0..KEYS as u64).map(|i| slab.insert([i, i])).collect();
    let slab = RwLock::new(slab);
    let mut one = [0.0f64; 5];
    for threads in THREADS {
        let reads = threads * passes * KEYS;
        let cells = [
            mops(reads, || {
                run_threads(threads, passes as u64, &|_, n| {
                    for _ in 0..n {
                        for &key in &ours_keys {
                            let guard = arena.pin();
                            black_box(arena.get(key, &guard).unwrap());
                        }
                    }
                })
            }),
            // Ten times the passes: a pass costs about a microsecond here, and a run must
            // last long enough that thread start-up does not count.
            mops(reads * 10, || {
                run_threads(threads, 10 * passes as u64, &|_, n| {
                    for _ in 0..n {
                        let guard = arena.pin();
                        for &key in &ours_keys {
                            black_box(arena.get(key, &guard).unwrap());
                        }
                    }
                })
            }),
            mops(reads, || {
                run_threads(threads, passes as u64, &|_, n| {
                    for _ in 0..n {
                        for &key in &map_keys {
                            let guard = map.pin();
                            black_box(map.get(key, &guard).unwrap());
                        }
                    }
                })
            }),
            mops(reads, || {
                run_threads(threads, passes as u64, &|_, n| {
                    for _ in 0..n {
                        for &key in &sharded_keys {
                            black_box(*sharded.get(key).unwrap());
                        }
                    }
                })
            }),
            mops(reads, || {
                run_threads(threads, passes as u64, &|_, n| {
                    for _ in 0..n {
                        for &key in &slab_keys {
                            black_box(*slab.read().unwrap().get(key).unwrap());
                        }
                    }
                })
            }),
        ];
        if threads == 1 {
            one = cells;
        }
        let cell = |i: usize| format!("{:.1} ({:.1}x)", cells[i], cells[i] / one[i]);
        println!(
            "| {threads} | {} | {} | {} | {} | {} |",
            cell(0),
            cell(1),
            cell(2),
            cell(3),
            cell(4)
        );
    }
}

/// One thread inserts batches of `KEYS`, another reads and removes them.
fn cross_thread_table(batches: usize) {
    use std::sync::mpsc;
    let ops = batches * KEYS * 3;
    let ours = mops(ops, || {
        let arena = SlotArena::new();
        let (tx, rx) = mpsc::sync_channel(4);
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..batches {
                    let keys: Vec<_> = (0..KEYS as u64)
                        .map(|i| arena.insert([i, i]).unwrap())
                        .collect();
                    tx.send(keys).unwrap();
                }
                drop(tx);
            });
            s.spawn(|| {
                for keys in rx {
                    for key in keys {
                        let guard = arena.pin();
                        black_box(arena.get(key, &guard).unwrap());
                        black_box(arena.remove(key, &guard).unwrap());
                    }
                }
            });
        });
        start.elapsed()
    });
    let sharded = mops(ops, || {
        let slab = sharded_slab::Slab::new();
        let (tx, rx) = mpsc::sync_channel(4);
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..batches {
                    let keys: Vec<_> = (0..KEYS as u64)
                        .map(|i| slab.insert([i, i]).unwrap())
                        .collect();
                    tx.send(keys).unwrap();
                }
                drop(tx);
            });
            s.spawn(|| {
                for keys in rx {
                    for key in keys {
                        black_box(*slab.get(key).unwrap());
                        black_box(slab.remove(key));
                    }
                }
            });
        });
        start.elapsed()
    });
    let slotmap = mops(ops, || {
        let map = concurrent_slotmap::SlotMap::new(1 << 22);
        let (tx, rx) = mpsc::sync_channel(4);
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..batches {
                    let keys: Vec<_> = (0..KEYS as u64)
                        .map(|i| map.insert([i, i], &map.pin()))
                        .collect();
                    tx.send(keys).unwrap();
                }
                drop(tx);
            });
            s.spawn(|| {
                for keys in rx {
                    for key in keys {
                        let guard = map.pin();
                        black_box(map.get(key, &guard).unwrap());
                        black_box(map.remove(key, &guard).unwrap());
                    }
                }
            });
        });
        start.elapsed()
    });
    println!("cross-thread (one thread inserts batches of {KEYS}, another reads and removes them), M operations/s");
    println!(
        "| ferropool {ours:.1} | sharded-slab {sharded:.1} ({:.2}x) | concurrent-slotmap {slotmap:.1} |",
        ours / sharded
    );
}

/// Nanoseconds per call of `op`, per thread, with `threads` threads calling it at once: the
/// median of 5 runs of `calls` calls each (through `mops`, counting one thread's calls).
fn per_thread_ns(threads: usize, calls: u64, op: &(impl Fn(usize) + Sync)) -> f64 {
    let per_thread_mops = mops(calls as usize, || {
        run_threads(threads, calls, &|t, n| {
            for _ in 0..n {
                op(t);
            }
        })
    });
    1e3 / per_thread_mops
}

/// What an epoch pin costs as threads are added: a pin (and unpin) of an arena whose threads
/// share its collector, as every arena's threads must, against pins of arenas with a
/// collector each (nothing shared), and a locked add on a cache line of the thread's own
/// (the same instruction a pin's fence is, with nothing else). Both arenas have private
/// collectors, so both columns take the same code path (the global collector's pin is a
/// shorter one, and would carry the garbage of the tables run before).
fn pin_table(thread_counts: &[usize]) {
    const CALLS: u64 = 10_000_000;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!("epoch pin + unpin, ns per call per thread (median of 5 runs of {CALLS} calls each; rows above {cores} threads are oversubscribed)");
    println!("| threads | arena.pin(), one shared arena | arena.pin(), an arena and collector per thread | locked add, own cache line |");
    println!("|---|---|---|---|");
    for &threads in thread_counts {
        let shared: SlotArena<u64> = SlotArena::with_collector(ferropool::Collector::new());
        let shared_pin = per_thread_ns(threads, CALLS, &|_| drop(black_box(shared.pin())));
        let own: Vec<SlotArena<u64>> = (0..threads)
            .map(|_| SlotArena::with_collector(ferropool::Collector::new()))
            .collect();
        let own_pin = per_thread_ns(threads, CALLS, &|t| drop(black_box(own[t].pin())));
        let counters: Vec<_> = (0..threads)
            .map(|_| crossbeam_utils::CachePadded::new(std::sync::atomic::AtomicU64::new(0)))
            .collect();
        let locked_add = per_thread_ns(threads, CALLS, &|t| {
            black_box(counters[t].fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        });
        println!("| {threads} | {shared_pin:.2} | {own_pin:.2} | {locked_add:.2} |");
    }
}

fn main() {
    if std::env::var_os("FERROPOOL_BENCH_ONLY_PIN").is_some() {
        pin_table(&[1, 2]);
        return;
    }
    if std::env::var_os("FERROPOOL_BENCH_ONLY_CHURN").is_some() {
        // The churn table at 1 and 2 threads alone (about 20 s), for alternated runs.
        let rounds = std::env::var("FERROPOOL_BENCH_CHURN_ROUNDS")
            .ok()
            .and_then(|rounds| rounds.parse().ok())
            .unwrap_or(500);
        churn_table(rounds, &[1, 2]);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
    churn_table(500, &THREADS);
    pin_table(&THREADS);
    shared_read_table(2000);
    cross_thread_table(2000);
}
