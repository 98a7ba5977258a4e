//! Workloads shared by `benches/pool.rs` (glibc, ferropool) and
//! `benches/pool_mimalloc.rs` (the same `Vec` workloads with mimalloc as global allocator).

use std::hint::black_box;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};

pub(crate) const KIB: usize = 1 << 10;
pub(crate) const MIB: usize = 1 << 20;
pub(crate) const SIZES: [usize; 5] = [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB];
pub(crate) const PAGE: usize = 4096;

use crate::common;
pub(crate) use ferropool_figures::minor_faults;

/// Sizes of the direct-call alloc + free runner: three classes the thread caches keep, and
/// one served by the class's shared list.
pub(crate) const PAIR_SIZES: [usize; 4] = [4 * KIB, 64 * KIB, MIB, 16 * MIB];

/// Calls per run of the direct-call runner.
pub(crate) const PAIR_CALLS: u32 = 5_000_000;

/// Nanoseconds per call of `pair` (one allocation and its free) on this thread: the best of
/// five runs of `n` calls.
pub(crate) fn pair_ns(n: u32, mut pair: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..n {
                pair();
            }
            started.elapsed().as_secs_f64() * 1e9 / f64::from(n)
        })
        .fold(f64::INFINITY, f64::min)
}

/// One alloc + free of a `Vec<u8>` of `size` bytes from the global allocator, called as a
/// user calls it (no wrapper between the loop and the allocator).
#[inline(always)]
pub(crate) fn vec_pair(size: usize) {
    let mut buf = Vec::<u8>::with_capacity(black_box(size));
    black_box(buf.as_mut_ptr());
    drop(buf);
}

/// Writes one byte per 4 KiB page.
#[inline]
pub(crate) fn touch(ptr: *mut u8, len: usize) {
    let mut offset = 0;
    while offset < len {
        // SAFETY: (bench) callers pass the start and length of a buffer they own.
        unsafe { ptr.add(offset).write_volatile(1) };
        offset += PAGE;
    }
}

/// The training-step trace: 48 buffer sizes from 16 KiB to 48 MiB (about 400 MiB in all).
pub(crate) fn step_sizes() -> Vec<usize> {
    (0..48)
        .map(|i| {
            let t = i as f64 / 47.0;
            let size = (16.0 * KIB as f64) * (3072.0f64).powf(t); // 16 KiB .. 48 MiB
            (size as usize).next_multiple_of(PAGE)
        })
        .collect()
}

/// A way to get and give back buffers, for the generic workloads.
pub(crate) trait Source: Sync {
    type Buf: Send;
    fn name(&self) -> &'static str;
    fn get(&self, size: usize) -> Self::Buf;
    fn ptr(buf: &mut Self::Buf) -> *mut u8;
}

/// `Vec<u8>` from whatever the global allocator is.
pub(crate) struct System(pub &'static str);

impl Source for System {
    type Buf = Vec<u8>;
    fn name(&self) -> &'static str {
        self.0
    }
    #[inline]
    fn get(&self, size: usize) -> Vec<u8> {
        Vec::with_capacity(size)
    }
    fn ptr(buf: &mut Vec<u8>) -> *mut u8 {
        buf.as_mut_ptr()
    }
}

pub(crate) fn no_touch<S: Source>(c: &mut Criterion, source: &S) {
    let mut group = c.benchmark_group("alloc_free_no_touch");
    for size in SIZES {
        group.bench_with_input(BenchmarkId::new(source.name(), size), &size, |b, &size| {
            b.iter(|| {
                let mut buf = source.get(size);
                black_box(S::ptr(&mut buf));
                drop(buf);
            })
        });
    }
    group.finish();
}

pub(crate) fn with_touch<S: Source>(c: &mut Criterion, source: &S) {
    let mut group = c.benchmark_group("alloc_touch_free");
    group.sample_size(10);
    for size in SIZES {
        group.bench_with_input(BenchmarkId::new(source.name(), size), &size, |b, &size| {
            b.iter(|| {
                let mut buf = source.get(size);
                touch(S::ptr(&mut buf), size);
                drop(buf);
            })
        });
    }
    group.finish();
}

/// Large buffers written in full (every byte, as a kernel writing its output does): where
/// huge pages pay off. `with_touch` writes one byte per page at the same offset in every
/// page, which on huge pages (physically contiguous) falls into a few cache sets.
pub(crate) const FILL_SIZES: [usize; 2] = [16 * MIB, 64 * MIB];

pub(crate) fn with_fill<S: Source>(c: &mut Criterion, source: &S) {
    let mut group = c.benchmark_group("alloc_fill_free");
    group.sample_size(10);
    for size in FILL_SIZES {
        group.bench_with_input(BenchmarkId::new(source.name(), size), &size, |b, &size| {
            b.iter(|| {
                let mut buf = source.get(size);
                // SAFETY: (bench) `size` bytes of the buffer are ours.
                unsafe { S::ptr(&mut buf).write_bytes(1, size) };
                black_box(S::ptr(&mut buf));
                drop(buf);
            })
        });
    }
    group.finish();
}

/// One step of the trace: allocate and touch every buffer, free them on another thread.
/// Returns the time the allocations took (a clock read on each side of each one).
pub(crate) fn run_step<S: Source>(
    source: &S,
    sizes: &[usize],
    to_freer: &mpsc::SyncSender<Vec<S::Buf>>,
) -> Duration {
    let mut bufs = Vec::with_capacity(sizes.len());
    let mut allocating = Duration::ZERO;
    for &size in sizes {
        let started = Instant::now();
        let mut buf = source.get(size);
        allocating += started.elapsed();
        touch(S::ptr(&mut buf), size);
        bufs.push(buf);
    }
    to_freer.send(bufs).unwrap();
    allocating
}

/// Runs `steps` steps with a freer thread; returns (time per step, faults per step), measured
/// after `warmup` steps.
pub(crate) fn trace_steps<S: Source>(source: &S, warmup: u64, steps: u64) -> (Duration, f64) {
    let (times, faults) = trace_step_times(source, warmup, steps);
    let total: Duration = times.iter().map(|time| time.total).sum();
    (total / steps as u32, faults as f64 / steps as f64)
}

/// One step of the trace, timed in parts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepTime {
    /// From the first allocation until the freer thread reported its frees done.
    pub(crate) total: Duration,
    /// The producing thread's part: allocating and touching every buffer, and the send.
    pub(crate) producing: Duration,
    /// Of `producing`, the allocation calls alone.
    pub(crate) allocating: Duration,
    /// The freer thread's part: dropping the step's buffers.
    pub(crate) freeing: Duration,
}

impl StepTime {
    /// What is neither thread's work: the two hand-offs between them (the freer woken with
    /// the buffers, the producer woken with the report), which the scheduler decides.
    pub(crate) fn hand_offs(&self) -> Duration {
        self.total.saturating_sub(self.producing + self.freeing)
    }
}

/// Runs `steps` steps with one freer thread, after `warmup` steps with the same thread (so
/// that its stack and its first frees are behind it); returns each step's times and the
/// minor faults of the whole process over the timed steps.
pub(crate) fn trace_step_times<S: Source>(
    source: &S,
    warmup: u64,
    steps: u64,
) -> (Vec<StepTime>, u64) {
    let sizes = step_sizes();
    let (tx, rx) = mpsc::sync_channel::<Vec<S::Buf>>(1);
    let (done_tx, done_rx) = mpsc::channel::<Duration>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            for bufs in rx {
                let started = Instant::now();
                drop(bufs);
                done_tx.send(started.elapsed()).unwrap();
            }
        });
        for _ in 0..warmup {
            run_step(source, &sizes, &tx);
            done_rx.recv().unwrap();
        }
        let faults = minor_faults();
        let times = (0..steps)
            .map(|_| {
                let started = Instant::now();
                let allocating = run_step(source, &sizes, &tx);
                let producing = started.elapsed();
                let freeing = done_rx.recv().unwrap();
                StepTime {
                    total: started.elapsed(),
                    producing,
                    allocating,
                    freeing,
                }
            })
            .collect();
        let faults = minor_faults() - faults;
        drop(tx);
        (times, faults)
    })
}

pub(crate) fn training_trace<S: Source>(c: &mut Criterion, source: &S) {
    let mut group = c.benchmark_group("training_step_trace");
    group.sample_size(10);
    group.bench_function(source.name(), |b| {
        b.iter_custom(|iters| trace_steps(source, 1, iters).0 * iters as u32)
    });
    group.finish();
}

/// Minor faults per cycle of alloc + touch + free in steady state, per size.
pub(crate) fn fault_table<S: Source>(source: &S) {
    for size in SIZES {
        let cycle = || {
            let mut buf = source.get(size);
            touch(S::ptr(&mut buf), size);
            drop(buf);
        };
        for _ in 0..3 {
            cycle();
        }
        let before = minor_faults();
        let cycles = 20;
        for _ in 0..cycles {
            cycle();
        }
        let per = (minor_faults() - before) as f64 / cycles as f64;
        println!(
            "faults/cycle  {:<10} {:>9} bytes: {per:>8.1}",
            source.name(),
            size
        );
    }
    let (step, faults) = trace_steps(source, 2, 5);
    println!(
        "training step {:<10} {:>8.2} ms/step, {faults:.0} faults/step",
        source.name(),
        step.as_secs_f64() * 1e3
    );
}

/// The training-step trace with its buffers allocated on one thread and freed on another,
/// every step: system allocations and faults per steady-state step, and the time against the
/// floor of touching the same pages in buffers never freed. `system_allocations` reads the
/// source's count of them (0 where it keeps none).
pub(crate) fn producer_consumer<S: Source>(source: &S, system_allocations: &dyn Fn() -> u64) {
    const ROUNDS: usize = 9;
    let sizes = step_sizes();
    let time_touching = |bufs: &mut dyn Iterator<Item = (*mut u8, usize)>| {
        let started = Instant::now();
        for (ptr, len) in bufs {
            touch(black_box(ptr), len);
        }
        started.elapsed().as_secs_f64() * 1e3
    };
    // Two floors, touching memory that stays resident: `Vec`s (4 KiB pages, scattered), and
    // the source's own blocks of a step's sizes held for the whole run (for the pool, blocks
    // of the same classes as a step's, so the same kind of pages and cache sets: what a
    // step costs over it is the allocator's and the hand-overs'). Each round measures both
    // right before its step, so that the machine's drift moves a round's figures together.
    let mut resident: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![1u8; s]).collect();
    let mut held: Vec<S::Buf> = sizes.iter().map(|&s| source.get(s)).collect();
    time_touching(
        &mut held
            .iter_mut()
            .zip(&sizes)
            .map(|(b, &len)| (S::ptr(b), len)),
    ); // resident now
    trace_steps(source, 2, 1); // the source reserves what a step needs
    let before = system_allocations();
    let mut faults = 0;
    /// A round: its step's parts and the two floors measured right before it, in ms.
    struct Round {
        step: StepTime,
        vec_floor: f64,
        held_floor: f64,
    }
    let ms = |time: Duration| time.as_secs_f64() * 1e3;
    let rounds: Vec<Round> = (0..ROUNDS)
        .map(|_| {
            let vec_floor =
                time_touching(&mut resident.iter_mut().map(|b| (b.as_mut_ptr(), b.len())));
            let held_floor = time_touching(
                &mut held
                    .iter_mut()
                    .zip(&sizes)
                    .map(|(b, &len)| (S::ptr(b), len)),
            );
            // One warm-up step with the freer thread of the timed one.
            let (times, step_faults) = trace_step_times(source, 1, 1);
            faults += step_faults;
            Round {
                step: times[0],
                vec_floor,
                held_floor,
            }
        })
        .collect();
    let system = system_allocations() - before;
    drop((resident, held));
    let spread = |key: &dyn Fn(&Round) -> f64| common::spread(rounds.iter().map(key).collect());
    let step = spread(&|r| ms(r.step.total));
    let over_vec = spread(&|r| ms(r.step.total) / r.vec_floor);
    let over_held = spread(&|r| ms(r.step.total) / r.held_floor);
    println!(
        "producer/consumer step {:<10} {ROUNDS} rounds, medians (min-max): {:.2} ms ({:.2}-{:.2}); over touching resident Vecs {:.2}x ({:.2}-{:.2}), over touching its blocks held {:.2}x ({:.2}-{:.2}); {faults} faults and {system} system allocations in the timed steps",
        source.name(),
        step.1, step.0, step.2, over_vec.1, over_vec.0, over_vec.2, over_held.1, over_held.0, over_held.2,
    );
    // The step in parts: the producer's (allocations, touching, the send) against the same
    // floor, the freer's drops, and the two hand-offs between the threads, which are the
    // scheduler's (a sleeping thread woken on another CPU) rather than either allocator's.
    let producing = spread(&|r| ms(r.step.producing) / r.held_floor);
    let allocating = spread(&|r| ms(r.step.allocating) * 1e3);
    let freeing = spread(&|r| ms(r.step.freeing) * 1e3);
    let hand_offs = spread(&|r| ms(r.step.hand_offs()) * 1e3);
    let slowest = rounds
        .iter()
        .max_by(|a, b| {
            (ms(a.step.total) / a.held_floor).total_cmp(&(ms(b.step.total) / b.held_floor))
        })
        .expect("at least one round");
    println!(
        "producer/consumer step {:<10} in parts: producing over the held blocks' floor {:.2}x ({:.2}-{:.2}), of which allocating {:.0} us ({:.0}-{:.0}); freeing {:.0} us ({:.0}-{:.0}); hand-offs {:.0} us ({:.0}-{:.0}); the round furthest over its floor: {:.2}x, floor {:.3} ms, producing {:.3} ms (allocating {:.0} us), freeing {:.0} us, hand-offs {:.0} us",
        source.name(),
        producing.1, producing.0, producing.2, allocating.1, allocating.0, allocating.2, freeing.1, freeing.0, freeing.2,
        hand_offs.1, hand_offs.0, hand_offs.2,
        ms(slowest.step.total) / slowest.held_floor, slowest.held_floor,
        ms(slowest.step.producing), ms(slowest.step.allocating) * 1e3, ms(slowest.step.freeing) * 1e3, ms(slowest.step.hand_offs()) * 1e3,
    );
}

/// The thread-scaling workload: `threads` threads, each allocating buffers of mixed sizes (4
/// KiB to 3 MiB, a fixed pseudo-random sequence per thread), writing their first and last byte
/// if `touch` (else touching none: the allocator alone), and freeing half of them itself and
/// handing the other half to its neighbour, which frees them (when its inbox holds fewer than
/// 64; else it frees them itself, so that a descheduled neighbour cannot make the live set
/// grow). Returns allocations per second, all threads together.
pub(crate) fn scaling<S: Source>(
    source: &S,
    threads: usize,
    per_thread: usize,
    touch: bool,
) -> f64 {
    let inboxes: Vec<Mutex<Vec<S::Buf>>> = (0..threads).map(|_| Mutex::new(Vec::new())).collect();
    let elapsed = common::run_threads(threads, per_thread as u64, &|t, iters| {
        let neighbour = &inboxes[(t + 1) % threads];
        let mut rng = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut outgoing = Vec::with_capacity(16);
        for i in 0..iters {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let size = 4 * KIB + (rng % (3 * MIB as u64 - 4 * KIB as u64)) as usize;
            let mut buf = source.get(size);
            if touch {
                let ptr = S::ptr(&mut buf);
                // SAFETY: (bench) the buffer holds `size` bytes.
                unsafe {
                    ptr.write_volatile(1);
                    ptr.add(size - 1).write_volatile(1);
                }
            }
            if rng & (1 << 40) == 0 {
                drop(buf);
            } else {
                outgoing.push(buf);
            }
            if outgoing.len() == 16 || i + 1 == iters {
                let mut inbox = neighbour.lock().unwrap();
                if inbox.len() < 64 {
                    inbox.append(&mut outgoing);
                }
                drop(inbox);
                // A neighbour that has not kept up (descheduled): free them here, so the
                // live set stays bounded.
                outgoing.clear();
                let mine = std::mem::take(&mut *inboxes[t].lock().unwrap());
                drop(mine);
            }
        }
    });
    drop(inboxes);
    (threads * per_thread) as f64 / elapsed.as_secs_f64()
}

/// Prints the scaling workload's throughput at 1, 2, 4, 8 and 16 threads (medians of 5).
pub(crate) fn scaling_table<S: Source>(source: &S) {
    let per_thread = 200_000;
    let mut one = 0.0;
    for threads in [1, 2, 4, 8, 16] {
        let runs = (0..5).map(|_| scaling(source, threads, per_thread / threads.min(4), true));
        let median = common::spread(runs.collect()).1;
        if threads == 1 {
            one = median;
        }
        println!(
            "scaling {:<12} {threads:>2} threads: {:>8.2} M allocations/s ({:.2}x one thread)",
            source.name(),
            median / 1e6,
            median / one
        );
    }
}
