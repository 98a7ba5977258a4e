//! `BufferPool` against `Vec<u8>` on glibc and the floor of touching
//! already-resident memory. mimalloc runs the same workloads in `benches/pool_mimalloc.rs`.
//! After criterion's groups, a table of minor page faults per cycle and per training step.
#![allow(missing_docs)] // criterion's macros generate undocumented items

mod common;
mod pool_common;

use std::alloc::GlobalAlloc;
use std::hint::black_box;
use std::mem::MaybeUninit;

use criterion::{BenchmarkId, Criterion};
use ferropool::{BufferPool, PoolBuffer};
use pool_common::*;

struct Pool(BufferPool);

impl Source for Pool {
    type Buf = PoolBuffer;
    fn name(&self) -> &'static str {
        "ferropool"
    }
    #[inline]
    fn get(&self, size: usize) -> PoolBuffer {
        self.0.alloc(size).unwrap()
    }
    fn ptr(buf: &mut PoolBuffer) -> *mut u8 {
        buf.as_mut_ptr()
    }
}

/// The floor: touching a buffer that is already resident (no allocation at all).
fn floor(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_touch_free");
    group.sample_size(10);
    for size in SIZES {
        let mut resident = vec![0u8; size];
        group.bench_with_input(
            BenchmarkId::new("floor_resident", size),
            &size,
            |b, &size| b.iter(|| touch(black_box(resident.as_mut_ptr()), size)),
        );
    }
    group.finish();
    let mut group = c.benchmark_group("alloc_fill_free");
    group.sample_size(10);
    for size in FILL_SIZES {
        let mut resident = vec![0u8; size];
        group.bench_with_input(
            BenchmarkId::new("floor_resident", size),
            &size,
            |b, &size| {
                b.iter(|| {
                    // SAFETY: (bench) `size` bytes of `resident` are ours.
                    unsafe { black_box(resident.as_mut_ptr()).write_bytes(1, size) }
                })
            },
        );
    }
    group.finish();
    let sizes = step_sizes();
    let mut resident: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
    let mut group = c.benchmark_group("training_step_trace");
    group.sample_size(10);
    group.bench_function("floor_resident", |b| {
        b.iter(|| {
            for buf in &mut resident {
                touch(black_box(buf.as_mut_ptr()), buf.len());
            }
        })
    });
    group.finish();
}

/// A cold 64 MiB block: a fresh pool each time, so the block comes from the system; touch
/// every page, then close the pool. Compares the madvise options (huge pages are on by
/// default, pre-faulting off).
fn cold_blocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("cold_64mib_alloc_touch");
    group.sample_size(10);
    let configs: [(&str, bool, bool); 4] = [
        ("no_advice", false, false),
        ("prefault", true, false),
        ("huge_pages", false, true),
        ("prefault_huge_pages", true, true),
    ];
    for (name, prefault, huge_pages) in configs {
        let cycle = || {
            let pool = BufferPool::with_config(ferropool::PoolConfig {
                prefault,
                huge_pages,
                ..ferropool::PoolConfig::default()
            })
            .unwrap();
            let mut buffer = pool.alloc(64 * MIB).unwrap();
            touch(buffer.as_mut_ptr(), 64 * MIB);
        };
        group.bench_function(name, |b| b.iter(cycle));
        let before = minor_faults();
        for _ in 0..5 {
            cycle();
        }
        println!(
            "cold 64 MiB {name}: {:.0} faults per cycle",
            (minor_faults() - before) as f64 / 5.0
        );
    }
    group.finish();
}

/// The producer/consumer runner for the pool, then for glibc's `Vec`, in one invocation.
fn producer_consumers(pool: &Pool, glibc: &System) {
    producer_consumer(pool, &|| pool.0.stats().system_allocations);
    producer_consumer(glibc, &|| 0);
}

/// The training-step trace with overlap: a producer thread allocates a step's 48 buffers
/// (touching one byte a page) and hands them over; a consumer thread frees them in reverse
/// order while the producer already runs the next step (a channel of one step: at most two
/// steps' buffers out at once), for 400 steps. Prints the last step at which the pool took
/// memory from the system, how many steps did, and the step times.
fn overlap_table() {
    const STEPS: usize = 400;
    let pool = BufferPool::new();
    let sizes = step_sizes();
    let (send, receive) = std::sync::mpsc::sync_channel::<Vec<ferropool::PoolBuffer>>(1);
    let consumer = std::thread::spawn(move || {
        for mut bufs in receive {
            while let Some(buf) = bufs.pop() {
                drop(buf);
            }
        }
    });
    let mut grew = Vec::new();
    let mut peaks = Vec::new();
    let mut os_steps = Vec::new();
    let mut times = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let before = pool.stats().system_allocations;
        let os_before = pool.stats().os_calls;
        let peak_before = pool.stats().peak_in_use_bytes;
        let started = std::time::Instant::now();
        let bufs: Vec<_> = sizes
            .iter()
            .map(|&size| {
                let mut buf = pool.alloc(size).unwrap();
                touch(buf.as_mut_ptr(), size);
                buf
            })
            .collect();
        send.send(bufs).unwrap();
        times.push(started.elapsed().as_secs_f64() * 1e3);
        let after = pool.stats();
        if after.system_allocations > before {
            grew.push(step + 1);
            peaks.push(after.peak_in_use_bytes > peak_before);
        }
        if after.os_calls > os_before {
            os_steps.push(step + 1);
        }
    }
    drop(send);
    consumer.join().unwrap();
    let steady = &mut times[20..];
    steady.sort_by(f64::total_cmp);
    let stats = pool.stats();
    println!(
        "overlapped steps, 400 of 48 buffers (16 KiB-48 MiB): new blocks in {} steps ({} of them a new peak in use), the last at step {}; calls to the OS (map, unmap, purge) in {} steps, the last at step {}; after step 20: median {:.2} ms, max {:.2} ms a step; peak reserved {} MiB, peak in use {} MiB, mapped {} MiB",
        grew.len(),
        peaks.iter().filter(|&&p| p).count(),
        grew.last().copied().unwrap_or(0),
        os_steps.len(),
        os_steps.last().copied().unwrap_or(0),
        steady[steady.len() / 2],
        steady[steady.len() - 1],
        stats.peak_reserved_bytes >> 20,
        stats.peak_in_use_bytes >> 20,
        stats.mapped_bytes >> 20,
    );
}

/// Alloc + free on one thread, the pool and glibc's `Vec` alternated size by size, each
/// called directly from the timing loop (criterion's groups add their own loop's cost).
fn pair_table() {
    let pool = BufferPool::new();
    for size in PAIR_SIZES {
        let ours = pair_ns(PAIR_CALLS, || {
            let mut buf = pool.alloc(black_box(size)).unwrap();
            black_box(buf.as_mut_ptr());
            drop(buf);
        });
        let glibc = pair_ns(PAIR_CALLS, || vec_pair(size));
        // The same through the `GlobalAlloc` front end (a raw block: a header, and a colour).
        let front = ferropool::PoolAllocator::with_threshold(0);
        let layout = std::alloc::Layout::from_size_align(size, 64).unwrap();
        let raw = pair_ns(PAIR_CALLS, || {
            // SAFETY: (bench) a non-zero size; the block goes back with its layout.
            unsafe {
                let ptr = front.alloc(black_box(layout));
                front.dealloc(black_box(ptr), layout);
            }
        });
        println!(
            "alloc + free, direct calls, best of 5 x {PAIR_CALLS}, {size:>8} B: ferropool {ours:5.1} ns, glibc Vec {glibc:5.1} ns (ferropool {:.2}x glibc's time); ferropool's GlobalAlloc {raw:5.1} ns",
            ours / glibc
        );
    }
    // Two threads, each allocating and freeing a 4 KiB block of its own, on one pool: what
    // the threads share (the exact counter, with `exact_peaks`; block records side by side),
    // and glibc's `Vec` doing the same in the same invocation.
    let two_threads = |pair: &(dyn Fn() + Sync)| {
        let runs = (0..5).map(|_| {
            let elapsed = common::run_threads(2, u64::from(PAIR_CALLS), &|_, n| {
                for _ in 0..n {
                    pair();
                }
            });
            elapsed.as_secs_f64() * 1e9 / f64::from(PAIR_CALLS)
        });
        common::spread(runs.collect())
    };
    for exact_peaks in [true, false] {
        let pool = BufferPool::with_config(ferropool::PoolConfig {
            exact_peaks,
            ..Default::default()
        })
        .unwrap();
        let (low, median, high) = two_threads(&|| {
            let mut buf = pool.alloc(black_box(4096)).unwrap();
            black_box(buf.as_mut_ptr());
            drop(buf);
        });
        println!(
            "alloc + free, 2 threads, own 4 KiB blocks, exact_peaks: {exact_peaks:<5}: {median:5.1} ns per pair per thread (median of 5 x {PAIR_CALLS}; runs {low:.1}-{high:.1})"
        );
    }
    let (low, median, high) = two_threads(&|| vec_pair(4096));
    println!(
        "alloc + free, 2 threads, own 4 KiB blocks, glibc Vec          : {median:5.1} ns per pair per thread (median of 5 x {PAIR_CALLS}; runs {low:.1}-{high:.1})"
    );
}

/// Median of `rounds` timings of `f`, in microseconds.
fn median_us(rounds: usize, mut f: impl FnMut() -> std::time::Duration) -> f64 {
    common::spread((0..rounds).map(|_| f().as_secs_f64() * 1e6).collect()).1
}

/// `trim` of a pool whose one user caches a block, and a pool's whole life (made, used,
/// closed), on this thread: medians in microseconds.
fn one_user_pool_costs() -> (f64, f64) {
    let pool = BufferPool::new();
    let trim = median_us(201, || {
        drop(pool.alloc(4096).unwrap()); // cached by this thread
        let started = std::time::Instant::now();
        black_box(pool.trim());
        started.elapsed()
    });
    let close = median_us(201, || {
        let pool = BufferPool::new();
        drop(pool.alloc(4096).unwrap());
        let started = std::time::Instant::now();
        drop(pool);
        started.elapsed()
    });
    (trim, close)
}

/// The cost of a pool used by one thread, by that thread's index: on this thread (a low
/// index), and on the last of 10,000 live threads to claim an index (about 10,000).
fn thread_index_table() {
    const HELD: usize = 10_000;
    let (low_trim, low_close) = one_user_pool_costs();
    let barrier = std::sync::Barrier::new(HELD);
    let order = std::sync::atomic::AtomicUsize::new(0);
    let result = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..HELD {
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn_scoped(scope, || {
                    // Threads claim their index on their first pool operation, in order.
                    let me = order.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    drop(BufferPool::global().alloc(8).unwrap());
                    barrier.wait();
                    if me == HELD - 1 {
                        *result.lock().unwrap() = Some(one_user_pool_costs());
                    }
                    barrier.wait();
                })
                .unwrap();
        }
    });
    let (high_trim, high_close) = result.into_inner().unwrap().unwrap();
    println!("one-user pool by thread index: trim {low_trim:.1} us / close {low_close:.1} us at a low index; trim {high_trim:.1} us / close {high_close:.1} us on the last of {HELD} live threads to claim an index (about {HELD})");
}

/// The thread-scaling workload (`pool_common::scaling`: mixed sizes, half of the frees by the
/// neighbour thread), touching no byte (what the allocator costs), at 1 and 2 threads, with the
/// default configuration, with `exact_peaks: false` and with `larger_blocks: false`: a fresh
/// pool per run, warmed by a quarter-length run first; rounds alternate the six variants.
/// Prints the medians, the 2-thread / 1-thread ratios and the memory each pool reserved.
fn cross_thread_table() {
    const ROUNDS: usize = 7;
    // Allocations per timed run, all threads together: at about 20 M/s a run lasts some 50
    // ms, so that one descheduling of a virtual CPU (a few ms) does not halve a round.
    const PER_RUN: usize = 1_000_000;
    // (name, exact_peaks, larger_blocks)
    let configs = [
        ("default", true, true),
        ("exact_peaks: false", false, true),
        ("larger_blocks: false", true, false),
    ];
    // Per configuration and thread count: (M allocations/s, MiB reserved at the end).
    let mut runs = vec![[Vec::new(), Vec::new()]; configs.len()];
    for _ in 0..ROUNDS {
        for (runs, &(_, exact_peaks, larger_blocks)) in runs.iter_mut().zip(&configs) {
            for (threads, runs) in [1, 2].into_iter().zip(runs.iter_mut()) {
                let config = ferropool::PoolConfig {
                    exact_peaks,
                    larger_blocks,
                    ..Default::default()
                };
                let pool = Pool(BufferPool::with_config(config).unwrap());
                scaling(&pool, threads, PER_RUN / 4 / threads, false);
                let rate = scaling(&pool, threads, PER_RUN / threads, false) / 1e6;
                runs.push((rate, pool.0.stats().reserved_bytes as f64 / MIB as f64));
            }
        }
    }
    let median = |values: Vec<f64>| {
        let (low, median, high) = common::spread(values);
        (median, low, high)
    };
    for ((name, ..), [one, two]) in configs.iter().zip(runs) {
        let rates = |runs: &[(f64, f64)]| median(runs.iter().map(|r| r.0).collect());
        let reserved = |runs: &[(f64, f64)]| median(runs.iter().map(|r| r.1).collect()).0;
        let ((r1, lo1, hi1), (r2, lo2, hi2)) = (rates(&one), rates(&two));
        println!(
            "cross-thread frees, no touch, {name:<22} 1 thread {r1:6.2}, 2 threads {r2:6.2} M allocations/s ({:.2}x; runs {lo1:.2}-{hi1:.2} / {lo2:.2}-{hi2:.2}); reserved {:.0} / {:.0} MiB",
            r2 / r1,
            reserved(&one),
            reserved(&two),
        );
    }
}

/// Elements of the tensors the elementwise runner chains ops over: 64 KiB, 256 KiB, 1 MiB and
/// 4 MiB of `f32`.
const ELEMENTWISE_LENS: [usize; 4] = [16 << 10, 64 << 10, 256 << 10, 1 << 20];

/// A framework's out-of-place elementwise op: `out = x * scale + shift`, four streams.
#[inline(never)]
fn scale_shift(out: &mut [MaybeUninit<f32>], x: &[f32], scale: &[f32], shift: &[f32]) {
    for (((out, x), scale), shift) in out.iter_mut().zip(x).zip(scale).zip(shift) {
        out.write(x * scale + shift);
    }
}

/// Nanoseconds per element of `ops` chained ops on tensors of `len` elements, each op's
/// output a fresh allocation from `allocator` (with `align`) and its input freed after it,
/// as a framework runs a chain of elementwise ops: the streams are wherever the allocator
/// puts its blocks within their pages.
fn elementwise_ns(allocator: &dyn GlobalAlloc, align: usize, len: usize, ops: usize) -> f64 {
    let layout = std::alloc::Layout::from_size_align(len * 4, align).unwrap();
    let fresh = || {
        // SAFETY: (bench) a non-zero size.
        let ptr = unsafe { allocator.alloc(layout) }.cast::<MaybeUninit<f32>>();
        assert!(!ptr.is_null());
        // SAFETY: (bench) a fresh block of `len` elements, ours until freed.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    };
    let filled = |value: f32| {
        let tensor = fresh();
        tensor.fill(MaybeUninit::new(value));
        // SAFETY: (bench) every element written just above.
        unsafe { std::slice::from_raw_parts_mut(tensor.as_mut_ptr().cast::<f32>(), len) }
    };
    let free = |tensor: &mut [f32]| {
        // SAFETY: (bench) allocated above with `layout`, not used again.
        unsafe { allocator.dealloc(tensor.as_mut_ptr().cast(), layout) }
    };
    let (scale, shift, mut x) = (filled(0.5), filled(1.0), filled(1.0));
    let started = std::time::Instant::now();
    for _ in 0..ops {
        let out = fresh();
        scale_shift(out, x, scale, shift);
        // SAFETY: (bench) `scale_shift` wrote every element.
        let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<f32>(), len) };
        free(std::mem::replace(&mut x, out));
    }
    let ns = started.elapsed().as_nanos() as f64 / (ops * len) as f64;
    black_box(x[len - 1]);
    free(x);
    free(scale);
    free(shift);
    ns
}

/// The elementwise runner: ferropool's front end as a framework's allocator (where each
/// raw block gets a colour: its own offset within its pages), the same front end asked for
/// page-aligned blocks (which get no colour, so every block sits at one offset, as before
/// colours), glibc and mimalloc (called directly, not as the global allocator), alternated
/// over 7 rounds after one of warm-up; ns per element, medians (min-max).
fn elementwise_table() {
    let pool = ferropool::PoolAllocator::new();
    let glibc = std::alloc::System;
    let mimalloc = mimalloc::MiMalloc;
    let variants: [(&str, &dyn GlobalAlloc, usize); 4] = [
        ("ferropool", &pool, 64),
        ("ferropool, page-aligned", &pool, 4096),
        ("glibc", &glibc, 64),
        ("mimalloc", &mimalloc, 64),
    ];
    for len in ELEMENTWISE_LENS {
        let ops = (256 << 20) / (len * 4);
        let mut runs = vec![Vec::new(); variants.len()];
        for round in 0..8 {
            for ((_, allocator, align), runs) in variants.iter().zip(&mut runs) {
                let ns = elementwise_ns(*allocator, *align, len, ops);
                if round > 0 {
                    runs.push(ns);
                }
            }
        }
        let mut line = format!(
            "elementwise out = x * scale + shift, {:>5} KiB:",
            (len * 4) >> 10
        );
        for ((name, ..), runs) in variants.iter().zip(runs) {
            let (low, median, high) = common::spread(runs);
            line += &format!(" {name} {median:.3} ({low:.3}-{high:.3})");
        }
        println!("{line} ns/element");
    }
}

fn main() {
    if std::env::var_os("FERROPOOL_BENCH_ONLY_ELEMENTWISE").is_some() {
        elementwise_table();
        return;
    }
    if std::env::var_os("FERROPOOL_BENCH_ONLY_INDEX").is_some() {
        thread_index_table();
        return;
    }
    if std::env::var_os("FERROPOOL_BENCH_ONLY_PAIR").is_some() {
        pair_table();
        return;
    }
    if std::env::var_os("FERROPOOL_BENCH_ONLY_CROSS").is_some() {
        cross_thread_table();
        return;
    }
    if std::env::var_os("FERROPOOL_BENCH_ONLY_OVERLAP").is_some() {
        overlap_table();
        return;
    }
    let pool = Pool(BufferPool::new());
    let glibc = System("glibc_vec");
    if std::env::var_os("FERROPOOL_BENCH_ONLY_STEP").is_some() {
        producer_consumers(&pool, &glibc);
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1))
        .configure_from_args();
    no_touch(&mut c, &pool);
    no_touch(&mut c, &glibc);
    with_touch(&mut c, &pool);
    with_touch(&mut c, &glibc);
    with_fill(&mut c, &pool);
    with_fill(&mut c, &glibc);
    floor(&mut c);
    training_trace(&mut c, &pool);
    training_trace(&mut c, &glibc);
    cold_blocks(&mut c);
    c.final_summary();
    fault_table(&pool);
    fault_table(&glibc);
    producer_consumers(&pool, &glibc);
    scaling_table(&pool);
    scaling_table(&glibc);
    thread_index_table();
    cross_thread_table();
    pair_table();
    elementwise_table();
    let stats = pool.0.stats();
    println!(
        "ferropool stats: {} allocations, hit rate {:.3}, {} system allocations, peak reserved {:.2}",
        stats.allocations,
        stats.cache_hit_rate(),
        stats.system_allocations,
        bytesize::ByteSize(stats.peak_reserved_bytes).display().iec()
    );
}
