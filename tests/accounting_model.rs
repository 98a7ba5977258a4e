//! Every statistic against a model of the pool: random allocations and frees on two pools,
//! on this thread and on a worker (frees of the other thread's blocks among them), with
//! trims and thread-cache flushes between them, under eleven configurations (exact counters
//! on and off, small and empty bins, a byte limit, no thread caches, a low largest cached
//! block, tracing, larger blocks). The model predicts each thread's bins, so it predicts the
//! cache hits, the bytes cached in threads and the peaks exactly; each check compares them
//! with `stats()`, `snapshot()`, `class_stats()` and the trace, and reads back a marker
//! written into every live buffer.
//!
//! It covers the free's hot path (a block back into its allocator's own bin, counted) and
//! every way out of it: another thread's block, a thread whose last pool operation was on
//! the other pool, a full bin, a byte limit, a class the caches skip, tracing.

use std::collections::HashMap;
use std::sync::mpsc;

use ferropool::{BufferPool, PoolBuffer, PoolConfig, PoolEventKind};

/// A thread that runs the closures sent to it, one after another (so it keeps one thread
/// index and one thread cache per pool).
struct Worker {
    jobs: Option<mpsc::Sender<Box<dyn FnOnce() + Send>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn new() -> Self {
        let (jobs, received) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let thread = std::thread::spawn(move || {
            while let Ok(job) = received.recv() {
                job();
            }
        });
        Self {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    fn run<R: Send + 'static>(&self, job: impl FnOnce() -> R + Send + 'static) -> R {
        let (result, answer) = mpsc::channel();
        let job = Box::new(move || {
            let _ = result.send(job());
        });
        self.jobs.as_ref().unwrap().send(job).unwrap();
        answer.recv().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.jobs.take());
        let _ = self.thread.take().unwrap().join();
    }
}

const MAIN: usize = 0;
const WORKER: usize = 1;

/// A live buffer, the thread that allocated it, its pool, and the marker in its first bytes.
struct Live {
    buffer: PoolBuffer,
    by: usize,
    pool: usize,
    mark: u64,
}

impl Live {
    fn marker(&self) -> u64 {
        // SAFETY: every block holds at least 8 bytes (the smallest class), and `alloc` wrote
        // them.
        unsafe { self.buffer.as_ptr().cast::<u64>().read_unaligned() }
    }
}

/// One thread's bins in one pool: blocks cached per block size, and their bytes.
#[derive(Default)]
struct Bins {
    count: HashMap<usize, usize>,
    bytes: u64,
}

/// What the pools must report.
struct Model {
    config: PoolConfig,
    bins: HashMap<(usize, usize), Bins>,
    hits: [u64; 2],
    allocations: [u64; 2],
    frees: [u64; 2],
    peak: [u64; 2],
    peak_requested: [u64; 2],
}

struct Sim {
    pools: [BufferPool; 2],
    model: Model,
    live: Vec<Live>,
    worker: Worker,
    mark: u64,
    rng: u64,
}

const SIZES: &[usize] = &[
    1,
    7,
    100,
    1000,
    1024,
    3000,
    4096,
    5000,
    8192,
    65536,
    100_000,
    1 << 20,
    (1 << 20) + 1,
    3 << 20,
];

impl Sim {
    fn new(config: PoolConfig) -> Self {
        let pool = || BufferPool::with_config(config.clone()).unwrap();
        Self {
            pools: [pool(), pool()],
            model: Model {
                config,
                bins: HashMap::new(),
                hits: [0; 2],
                allocations: [0; 2],
                frees: [0; 2],
                peak: [0; 2],
                peak_requested: [0; 2],
            },
            live: Vec::new(),
            worker: Worker::new(),
            mark: 0x5eed_0000_0000_0000,
            rng: 0x1234_5678_9abc_def1,
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Block bytes and requested bytes live in pool `p`.
    fn in_use(&self, p: usize) -> (u64, u64) {
        let mine = self.live.iter().filter(|live| live.pool == p);
        mine.fold((0, 0), |(bytes, requested), live| {
            let block = live.buffer.capacity() as u64;
            (bytes + block, requested + live.buffer.len() as u64)
        })
    }

    fn alloc(&mut self, p: usize, size: usize, thread: usize) {
        let pool = self.pools[p].clone();
        let mut buffer = if thread == MAIN {
            pool.alloc(size).unwrap()
        } else {
            self.worker.run(move || pool.alloc(size).unwrap())
        };
        let block = buffer.capacity();
        let bins = self.model.bins.entry((p, thread)).or_default();
        let cached = bins.count.entry(block).or_default();
        if BufferPool::class_size_for(size).unwrap() == block && *cached > 0 {
            *cached -= 1;
            bins.bytes -= block as u64;
            self.model.hits[p] += 1;
        }
        self.model.allocations[p] += 1;
        self.mark += 1;
        // SAFETY: every block holds at least 8 bytes (the smallest class), and the buffer is
        // ours alone.
        unsafe { buffer.as_mut_ptr().cast::<u64>().write_unaligned(self.mark) };
        self.live.push(Live {
            buffer,
            by: thread,
            pool: p,
            mark: self.mark,
        });
        let (bytes, requested) = self.in_use(p);
        self.model.peak[p] = self.model.peak[p].max(bytes);
        self.model.peak_requested[p] = self.model.peak_requested[p].max(requested);
    }

    fn free(&mut self, index: usize, thread: usize) {
        let live = self.live.swap_remove(index);
        assert_eq!(live.marker(), live.mark, "a live block was overwritten");
        let block = live.buffer.capacity();
        let config = &self.model.config;
        // A block goes to the freeing thread's bin only if that thread allocated it, its
        // class is cached, and the bin has room in blocks and bytes.
        if thread == live.by
            && config.thread_cache_bytes > 0
            && block <= config.thread_cache_max_block
        {
            let (max_blocks, max_bytes) = (
                config.thread_cache_blocks_per_class,
                config.thread_cache_bytes as u64,
            );
            let bins = self.model.bins.entry((live.pool, thread)).or_default();
            let cached = bins.count.entry(block).or_default();
            if *cached < max_blocks && bins.bytes + block as u64 <= max_bytes {
                *cached += 1;
                bins.bytes += block as u64;
            }
        }
        self.model.frees[live.pool] += 1;
        if thread == MAIN {
            drop(live.buffer);
        } else {
            let buffer = live.buffer;
            self.worker.run(move || drop(buffer));
        }
    }

    fn trim(&mut self, p: usize) {
        self.pools[p].trim();
        self.model.bins.retain(|&(pool, _), _| pool != p);
    }

    fn flush(&mut self, p: usize, thread: usize) {
        let pool = self.pools[p].clone();
        if thread == MAIN {
            pool.flush_thread_cache();
        } else {
            self.worker.run(move || pool.flush_thread_cache());
        }
        self.model.bins.remove(&(p, thread));
    }

    fn random_step(&mut self) {
        let r = self.next();
        let p = ((r >> 8) & 1) as usize;
        let thread = if (r >> 9).is_multiple_of(4) {
            WORKER
        } else {
            MAIN
        };
        match r % 16 {
            0..=6 => self.alloc(p, SIZES[(r >> 16) as usize % SIZES.len()], thread),
            7..=13 if !self.live.is_empty() => {
                let index = (r >> 20) as usize % self.live.len();
                self.free(index, thread);
            }
            14 if (r >> 24).is_multiple_of(8) => self.trim(p),
            15 if (r >> 24).is_multiple_of(4) => self.flush(p, thread),
            _ => {}
        }
    }

    fn check(&self, when: &str) {
        for (p, pool) in self.pools.iter().enumerate() {
            let stats = pool.stats();
            let context = format!("{when}, pool {p}: {stats:?}");
            let mine: Vec<&Live> = self.live.iter().filter(|live| live.pool == p).collect();
            let (bytes, requested) = self.in_use(p);
            let model = &self.model;
            let binned: u64 = (model.bins.iter())
                .filter(|((pool, _), _)| *pool == p)
                .map(|(_, bins)| bins.bytes)
                .sum();
            assert_eq!(stats.in_use_bytes, bytes, "in use: {context}");
            assert_eq!(stats.requested_bytes, requested, "requested: {context}");
            assert_eq!(
                stats.allocations, model.allocations[p],
                "allocations: {context}"
            );
            assert_eq!(stats.frees, model.frees[p], "frees: {context}");
            assert_eq!(stats.in_use_blocks, mine.len() as u64, "blocks: {context}");
            assert_eq!(stats.cache_hits, model.hits[p], "hits: {context}");
            assert_eq!(
                stats.cache_hits + stats.cache_misses,
                stats.allocations,
                "hits and misses: {context}"
            );
            assert_eq!(stats.cached_in_threads_bytes, binned, "in bins: {context}");
            assert_eq!(
                stats.reserved_bytes,
                stats.in_use_bytes + stats.cached_in_threads_bytes + stats.cached_in_lists_bytes,
                "reserved: {context}"
            );
            assert_eq!(
                stats.allocated_bytes_total - stats.freed_bytes_total,
                bytes,
                "totals: {context}"
            );
            if model.config.exact_peaks {
                assert_eq!(stats.peak_in_use_bytes, model.peak[p], "peak: {context}");
            }
            if model.config.exact_requested {
                let peak = model.peak_requested[p];
                assert_eq!(
                    stats.peak_requested_bytes, peak,
                    "requested peak: {context}"
                );
            }
            let snapshot = pool.snapshot();
            assert_eq!(snapshot.len(), mine.len(), "snapshot: {context}");
            let snapshot_requested: u64 = snapshot.iter().map(|b| b.requested as u64).sum();
            assert_eq!(
                snapshot_requested, requested,
                "snapshot requested: {context}"
            );
            let by_class: u64 = pool.class_stats().iter().map(|c| c.in_use_blocks).sum();
            assert_eq!(by_class, mine.len() as u64, "class stats: {context}");
            if model.config.trace_capacity > 0 {
                let events = pool.trace_events();
                let count = |kind| events.iter().filter(|e| e.kind == kind).count() as u64;
                let traced = (count(PoolEventKind::Alloc), count(PoolEventKind::Free));
                let expected = (model.allocations[p], model.frees[p]);
                assert_eq!(traced, expected, "traced allocations and frees: {context}");
            }
            for live in &mine {
                assert_eq!(live.marker(), live.mark, "a marker: {context}");
            }
        }
    }
}

fn configs() -> Vec<(&'static str, PoolConfig)> {
    let base = PoolConfig {
        larger_blocks: false,
        huge_pages: false,
        ..PoolConfig::default()
    };
    let with = |name, config| (name, config);
    vec![
        with("default", base.clone()),
        with(
            "no exact counters",
            PoolConfig {
                exact_peaks: false,
                ..base.clone()
            },
        ),
        with(
            "both exact counters",
            PoolConfig {
                exact_requested: true,
                ..base.clone()
            },
        ),
        with(
            "exact requested alone",
            PoolConfig {
                exact_peaks: false,
                exact_requested: true,
                ..base.clone()
            },
        ),
        with(
            "two blocks per bin",
            PoolConfig {
                thread_cache_blocks_per_class: 2,
                exact_requested: true,
                ..base.clone()
            },
        ),
        with(
            "no block per bin",
            PoolConfig {
                thread_cache_blocks_per_class: 0,
                ..base.clone()
            },
        ),
        with(
            "10,000 bytes per thread",
            PoolConfig {
                thread_cache_bytes: 10_000,
                exact_requested: true,
                ..base.clone()
            },
        ),
        with(
            "no thread caches",
            PoolConfig {
                thread_cache_bytes: 0,
                exact_requested: true,
                ..base.clone()
            },
        ),
        with(
            "4 KiB largest cached block",
            PoolConfig {
                thread_cache_max_block: 4096,
                ..base.clone()
            },
        ),
        with(
            "tracing",
            PoolConfig {
                trace_capacity: 1 << 16,
                exact_requested: true,
                ..base.clone()
            },
        ),
        with(
            "larger blocks",
            PoolConfig {
                larger_blocks: true,
                ..base
            },
        ),
    ]
}

#[test]
fn every_statistic_follows_the_model_of_the_bins() {
    let (steps, every): (u32, u32) = if cfg!(miri) { (150, 50) } else { (3000, 50) };
    for (name, config) in configs() {
        let mut sim = Sim::new(config);
        for step in 0..steps {
            sim.random_step();
            if step.is_multiple_of(every) {
                sim.check(&format!("{name}, step {step}"));
            }
        }
        sim.check(&format!("{name}, before the last frees"));
        while !sim.live.is_empty() {
            let r = sim.next();
            let thread = if r.is_multiple_of(3) { WORKER } else { MAIN };
            let index = (r >> 8) as usize % sim.live.len();
            sim.free(index, thread);
        }
        sim.check(&format!("{name}, all freed"));
        for p in 0..2 {
            sim.trim(p);
        }
        sim.check(&format!("{name}, trimmed"));
        for pool in &sim.pools {
            assert_eq!(pool.stats().reserved_bytes, 0, "{name}: {:?}", pool.stats());
        }
    }
}

/// A bin fills to its limit while the freeing thread's last operation alternates between two
/// pools (so every free finds its cache the slow way).
#[test]
fn bins_fill_to_their_limit_while_frees_alternate_between_pools() {
    let config = PoolConfig {
        thread_cache_blocks_per_class: 3,
        exact_requested: true,
        ..PoolConfig::default()
    };
    let a = BufferPool::with_config(config.clone()).unwrap();
    let b = BufferPool::with_config(config).unwrap();
    let from_a: Vec<_> = (0..10).map(|_| a.alloc(4000).unwrap()).collect();
    let from_b: Vec<_> = (0..10).map(|_| b.alloc(4000).unwrap()).collect();
    for (x, y) in from_a.into_iter().zip(from_b) {
        drop(x);
        drop(y);
    }
    for pool in [&a, &b] {
        let stats = pool.stats();
        assert_eq!(
            (stats.in_use_bytes, stats.requested_bytes),
            (0, 0),
            "{stats:?}"
        );
        assert_eq!(stats.cached_in_threads_bytes, 3 * 4096, "{stats:?}");
        assert_eq!(stats.cached_in_lists_bytes, 7 * 4096, "{stats:?}");
        assert_eq!(
            (stats.frees, stats.peak_requested_bytes),
            (10, 40_000),
            "{stats:?}"
        );
    }
    let again: Vec<_> = (0..10).map(|_| a.alloc(4000).unwrap()).collect();
    let stats = a.stats();
    assert_eq!(
        (stats.cache_hits, stats.system_allocations),
        (3, 10),
        "{stats:?}"
    );
    drop(again);
}
