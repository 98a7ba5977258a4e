//! What one run measured, and the training loop that measures it.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use ferropool::{BufferPool, PoolAllocator};

use crate::allocator;
use crate::args::Args;
use crate::backend::Backend;
use crate::model::Trainer;

pub use ferropool_figures::{minor_faults, peak_rss};

/// What one run measured, in steady state (the second half of the steps); `--json` prints
/// it as one line, which `compare` reads back.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// What ran: `pool-mimalloc`, `glibc`, `mimalloc` or `pytorch`.
    pub allocator: String,
    /// Loss of the first step.
    pub first_loss: f32,
    /// Loss of the last step.
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
    /// The peak bytes in use of the process-wide pool that the global allocator's front end
    /// serves (GEMM packing buffers, the scratch arena): what stays outside the training's
    /// pool and its budget. An upper bound: the training's pool takes its blocks under 32
    /// KiB through the global allocator, so those count here too (the last layer's weight,
    /// moments and gradients: a few hundred KiB). `None`: no pool.
    #[serde(default)]
    pub outside_peak_bytes: Option<u64>,
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

/// Runs the training; `on_step` sees (step, loss). `pool` is the backend's pool, if it has
/// one: its statistics give the calls made to the system, the peaks and the evictions.
pub fn train<B: Backend>(
    backend: &B,
    args: &Args,
    pool: Option<&BufferPool>,
    mut on_step: impl FnMut(usize, f32),
) -> anyhow::Result<Summary> {
    let stats = || pool.map(BufferPool::stats);
    // The front end's pool (the training has a pool of its own).
    let front = pool
        .filter(|_| allocator::choice().is_pool())
        .map(|_| BufferPool::global())
        .filter(|front| pool.is_some_and(|pool| pool.id() != front.id()));
    // The pools' calls to the OS (maps, unmaps and purges of their pages), and the requests
    // a pool refused that went to the front end's fallback allocator.
    let system_calls = || {
        stats().map_or(0, |s| s.os_calls)
            + front.map_or(0, |front| front.stats().os_calls)
            + PoolAllocator::fallback_allocations()
    };
    let mut trainer = Trainer::new(backend, args)?;
    let calls = || {
        (
            allocator::glibc_calls(),
            allocator::mimalloc_calls(),
            system_calls(),
        )
    };
    let warmup = (args.steps / 2).min(args.steps.saturating_sub(1));
    let mut summary = Summary {
        allocator: allocator::choice().name().into(),
        ..Summary::default()
    };
    let (mut faults, mut before, mut started) = (0, (0, 0, 0), Instant::now());
    let mut pool_before = None;
    for step in 0..args.steps {
        if step == warmup {
            faults = minor_faults();
            before = calls();
            pool_before = stats();
            started = Instant::now();
        }
        let loss = trainer.step(args.batch)?;
        if step == 0 {
            summary.first_loss = loss;
        }
        summary.last_loss = loss;
        on_step(step, loss);
    }
    let measured = (args.steps - warmup).max(1) as f64;
    let elapsed = started.elapsed().as_secs_f64();
    summary.steps_per_s = measured / elapsed;
    if let (Some(b), Some(a)) = (pool_before, stats()) {
        summary.peak_live_bytes = Some(a.peak_in_use_bytes);
        summary.peak_reserved_bytes = Some(a.peak_reserved_bytes);
        summary.evictions_per_step = Some((a.evictions - b.evictions) as f64 / measured);
        summary.recomputed_bytes_per_step =
            Some((a.recomputed_bytes - b.recomputed_bytes) as f64 / measured);
        summary.recompute_share =
            Some((a.recompute_ns - b.recompute_ns) as f64 / 1e9 / elapsed.max(1e-9));
    }
    summary.faults_per_step = (minor_faults() - faults) as f64 / measured;
    let after = calls();
    let per_step = |a: u64, b: u64| (a - b) as f64 / measured;
    summary.glibc_calls_per_step = Some(per_step(after.0, before.0));
    summary.mimalloc_calls_per_step = Some(per_step(after.1, before.1));
    summary.pool_system_calls_per_step = allocator::choice()
        .is_pool()
        .then(|| per_step(after.2, before.2));
    summary.outside_peak_bytes = front.map(|front| front.stats().peak_in_use_bytes);
    summary.peak_rss = peak_rss();
    Ok(summary)
}
