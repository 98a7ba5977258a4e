//! What one run measured, and the training loop that measures it.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::allocator;
use crate::args::Args;
use crate::backend::Backend;
use crate::model::Trainer;

pub use ferropool_figures::{minor_faults, peak_rss};

/// What one run measured, in steady state (the second half of the steps); `--json` prints
/// it as one line, which `compare` reads back.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// What ran: `pool`, `glibc`, `mimalloc` or `pytorch`.
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
    /// The pool's own calls to the system (reservations, and requests past its budget) per
    /// steady-state step (`None`: no pool).
    pub pool_system_calls_per_step: Option<f64>,
    /// Peak resident memory of the process, bytes.
    pub peak_rss: u64,
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

/// Runs the training; `on_step` sees (step, loss). `system_calls` reads the calls made to
/// the system so far by the backend's own allocator, if it has one apart from the global
/// allocator (the pool's statistics).
pub fn train<B: Backend>(
    backend: &B,
    args: &Args,
    system_calls: impl Fn() -> u64,
    mut on_step: impl FnMut(usize, f32),
) -> anyhow::Result<Summary> {
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
    for step in 0..args.steps {
        if step == warmup {
            faults = minor_faults();
            before = calls();
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
    summary.steps_per_s = measured / started.elapsed().as_secs_f64();
    summary.faults_per_step = (minor_faults() - faults) as f64 / measured;
    let after = calls();
    let per_step = |a: u64, b: u64| (a - b) as f64 / measured;
    summary.glibc_calls_per_step = Some(per_step(after.0, before.0));
    summary.mimalloc_calls_per_step = Some(per_step(after.1, before.1));
    summary.pool_system_calls_per_step =
        (allocator::choice() == allocator::Choice::Pool).then(|| per_step(after.2, before.2));
    summary.peak_rss = peak_rss();
    Ok(summary)
}
