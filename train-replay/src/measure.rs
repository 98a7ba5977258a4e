//! What one run measured ([`Summary`]), and the gauges the training loop reads it from:
//! the process's counters, its allocators' and its pools'.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use ferropool::{BufferPool, PoolAllocator};

use crate::allocator;
use crate::recomputes::{self, KindFigures, Tallies};

pub use ferropool_figures::{minor_faults, peak_rss};

/// What one run measured, in steady state (the second half of the steps); `--json` prints
/// it as one line, which `compare` reads back.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// What ran: `pool-mimalloc`, `glibc`, `mimalloc`, `pytorch` or `pytorch-compiled`.
    pub allocator: String,
    /// Loss of the first step.
    #[serde(deserialize_with = "nan_for_null")]
    pub first_loss: f32,
    /// Loss of the last step.
    #[serde(deserialize_with = "nan_for_null")]
    pub last_loss: f32,
    /// Steady-state steps per second.
    pub steps_per_s: f64,
    /// Minor page faults per steady-state step.
    pub faults_per_step: f64,
    /// Calls that reached glibc per steady-state step (`None`: not counted).
    pub glibc_calls_per_step: Option<f64>,
    /// Calls that reached mimalloc per steady-state step (`None`: not counted).
    pub mimalloc_calls_per_step: Option<f64>,
    /// The pool's own calls to the system (maps, unmaps and purges of its pages, and
    /// requests past its budget) per steady-state step (`None`: no pool).
    pub pool_system_calls_per_step: Option<f64>,
    /// Peak resident memory of the process, bytes.
    pub peak_rss: u64,
    /// Peak resident memory of the process once the model (and its optimiser) exists,
    /// before the first step: the program, its libraries, the weights (`None`: not
    /// measured). For PyTorch, the interpreter and its libraries are most of it; its
    /// optimiser makes its moments at the first step.
    #[serde(default)]
    pub baseline_rss: Option<u64>,
    /// The pool's peak bytes in use over the run (`None`: no pool).
    #[serde(default)]
    pub peak_live_bytes: Option<u64>,
    /// The pool's peak bytes reserved from the system over the run (`None`: no pool).
    #[serde(default)]
    pub peak_reserved_bytes: Option<u64>,
    /// Values the pool evicted per steady-state step (`None`: no pool).
    #[serde(default)]
    pub evictions_per_step: Option<f64>,
    /// Bytes the pool recomputed per steady-state step (`None`: no pool).
    #[serde(default)]
    pub recomputed_bytes_per_step: Option<f64>,
    /// The share of the steady-state time spent recomputing evicted values (`None`: no
    /// pool).
    #[serde(default)]
    pub recompute_share: Option<f64>,
    /// What was recomputed per steady-state step, by the kind of tensor (only the kinds
    /// recomputed). The bytes are the tensors' own sizes; `recomputed_bytes_per_step` counts
    /// the blocks they sit in, rounded up to a size class, so the kinds' sum is at most that
    /// (equal where every recomputed tensor fills its block).
    #[serde(default)]
    pub recomputed_by_kind: Vec<KindFigures>,
    /// The peak bytes in use of the process-wide pool that the global allocator's front end
    /// serves (GEMM packing buffers, the scratch arena): what stays outside the training's
    /// pool and its budget. An upper bound: the training's pool takes its blocks under 32
    /// KiB through the global allocator, so those count here too (the last layer's weight,
    /// moments and gradients: a few hundred KiB). `None`: no pool.
    #[serde(default)]
    pub outside_peak_bytes: Option<u64>,
    /// The share of `--budget` set aside for what stays outside the training's pool (the
    /// products' panel, the threads' tiles and scratch, small allocations; `None`: no budget).
    #[serde(default)]
    pub outside_reserve_bytes: Option<u64>,
    /// The losses of the first steps, at most [`KEPT_LOSSES`].
    #[serde(default, deserialize_with = "nans_for_nulls")]
    pub losses: Vec<f32>,
    /// A digest of the parameters' bits after the last step (`None`: not reported, as by
    /// PyTorch): two runs that trained the same bits report the same digest.
    #[serde(default)]
    pub params_digest: Option<u64>,
    /// The validation loss after the last step (`None`: the model has none).
    #[serde(default)]
    pub val_loss: Option<f32>,
    /// Values the pool evicted by its window step (a run of neighbours that makes room for a
    /// large request) per steady-state step (`None`: no pool).
    #[serde(default)]
    pub window_evictions_per_step: Option<f64>,
    /// The pool's evictions over the whole run by block size: (bytes, evictions), smallest
    /// first.
    #[serde(default)]
    pub evictions_by_size: Vec<(u64, u64)>,
    /// Seconds `torch.compile` took (a compiled PyTorch run only).
    #[serde(default)]
    pub compile_s: Option<f64>,
}

/// A loss that JSON holds as `null` where it was not finite (JSON has no NaN: `serde_json`
/// writes one as `null`, and `scripts/torch_gpt.py` does the same): NaN.
fn nan_for_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
}

/// [`nan_for_null`] for each loss of a list.
fn nans_for_nulls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
    let losses = Vec::<Option<f32>>::deserialize(d)?;
    Ok(losses.into_iter().map(|l| l.unwrap_or(f32::NAN)).collect())
}

impl Summary {
    /// One JSON line.
    pub fn line(&self) -> String {
        serde_json::to_string(self).expect("a summary is plain data")
    }

    /// Reads the line back from a child's output.
    pub fn parse(text: &str) -> Option<Self> {
        text.lines()
            .rev()
            .find_map(|line| serde_json::from_str(line.trim()).ok())
    }
}

/// The counters a step is measured by.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    ns: u128,
    faults: u64,
    glibc: u64,
    mimalloc: u64,
    system: u64,
    evictions: u64,
    window_evictions: u64,
    recomputed: u64,
    recompute_ns: u64,
    by_kind: Tallies,
}

impl std::ops::Sub for Counters {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self {
            ns: self.ns - o.ns,
            faults: self.faults - o.faults,
            glibc: self.glibc - o.glibc,
            mimalloc: self.mimalloc - o.mimalloc,
            system: self.system - o.system,
            evictions: self.evictions - o.evictions,
            window_evictions: self.window_evictions - o.window_evictions,
            recomputed: self.recomputed - o.recomputed,
            recompute_ns: self.recompute_ns - o.recompute_ns,
            by_kind: std::array::from_fn(|i| self.by_kind[i] - o.by_kind[i]),
        }
    }
}

impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, o: Self) {
        self.ns += o.ns;
        self.faults += o.faults;
        self.glibc += o.glibc;
        self.mimalloc += o.mimalloc;
        self.system += o.system;
        self.evictions += o.evictions;
        self.window_evictions += o.window_evictions;
        self.recomputed += o.recomputed;
        self.recompute_ns += o.recompute_ns;
        for (mine, theirs) in self.by_kind.iter_mut().zip(o.by_kind) {
            *mine += theirs;
        }
    }
}

/// Losses of the first steps a summary keeps (what `compare` checks against PyTorch's).
pub const KEPT_LOSSES: usize = 20;

/// Where a run's counters come from: the process, its allocators, and the backend's pool and
/// the front end's (if the training has a pool of its own beside it).
pub(crate) struct Gauges<'p> {
    pool: Option<&'p BufferPool>,
    front: Option<&'static BufferPool>,
    started: Instant,
}

impl<'p> Gauges<'p> {
    pub(crate) fn new(pool: Option<&'p BufferPool>) -> Self {
        let front = pool
            .filter(|_| allocator::choice().is_pool())
            .map(|_| BufferPool::global())
            .filter(|front| pool.is_some_and(|pool| pool.id() != front.id()));
        Self {
            pool,
            front,
            started: Instant::now(),
        }
    }

    /// Every counter a step is measured by, now.
    pub(crate) fn now(&self) -> Counters {
        let s = self.pool.map(BufferPool::stats);
        let of = |f: fn(&ferropool::PoolStats) -> u64| s.as_ref().map_or(0, f);
        Counters {
            ns: self.started.elapsed().as_nanos(),
            faults: minor_faults(),
            glibc: allocator::glibc_calls(),
            mimalloc: allocator::mimalloc_calls(),
            // The pools' calls to the OS (maps, unmaps and purges of their pages), and the
            // requests a pool refused that went to the front end's fallback allocator.
            system: of(|s| s.os_calls)
                + self.front.map_or(0, |front| front.stats().os_calls)
                + PoolAllocator::fallback_allocations(),
            evictions: of(|s| s.evictions),
            window_evictions: of(|s| s.window_evictions),
            recomputed: of(|s| s.recomputed_bytes),
            recompute_ns: of(|s| s.recompute_ns),
            by_kind: recomputes::now(),
        }
    }

    /// Completes `summary` from the counters of the `measured` steps in `window`.
    pub(crate) fn finish(&self, summary: &mut Summary, window: &Counters, measured: f64) {
        let seconds = window.ns as f64 / 1e9;
        let per_step = |count: u64| count as f64 / measured;
        summary.steps_per_s = measured / seconds.max(1e-9);
        summary.faults_per_step = per_step(window.faults);
        summary.glibc_calls_per_step = Some(per_step(window.glibc));
        summary.mimalloc_calls_per_step = Some(per_step(window.mimalloc));
        summary.pool_system_calls_per_step = allocator::choice()
            .is_pool()
            .then(|| per_step(window.system));
        if let Some(pool) = self.pool {
            let a = pool.stats();
            summary.peak_live_bytes = Some(a.peak_in_use_bytes);
            summary.peak_reserved_bytes = Some(a.peak_reserved_bytes);
            summary.evictions_per_step = Some(per_step(window.evictions));
            summary.window_evictions_per_step = Some(per_step(window.window_evictions));
            summary.recomputed_bytes_per_step = Some(per_step(window.recomputed));
            summary.recompute_share = Some(window.recompute_ns as f64 / 1e9 / seconds.max(1e-9));
            summary.recomputed_by_kind = recomputes::figures(&window.by_kind, measured);
            let classes = pool.class_stats();
            let evicted = classes.iter().filter(|c| c.evicted_blocks > 0);
            summary.evictions_by_size = evicted
                .map(|c| (c.block_bytes as u64, c.evicted_blocks))
                .collect();
        }
        summary.outside_peak_bytes = self.front.map(|front| front.stats().peak_in_use_bytes);
        summary.peak_rss = peak_rss();
    }
}
