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

#![allow(missing_docs)] // criterion's macros generate undocumented items

mod common;

use std::hint::black_box;
use std::sync::RwLock;
use std::time::Duration;

use common::run_threads;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
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
criterion_main!(benches);
