//! What one run measured, and the training loop that measures it.

use std::time::Instant;

use crate::allocator;
use crate::args::Args;
use crate::backend::Backend;
use crate::model::Trainer;

#[path = "../../support/procfs.rs"]
mod procfs;
pub use procfs::{minor_faults, peak_rss};

/// What one run measured, in steady state (the second half of the steps).
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Loss of the first step.
    pub first_loss: f32,
    /// Loss of the last step.
    pub last_loss: f32,
    /// Steady-state steps per second.
    pub steps_per_s: f64,
    /// Minor page faults per steady-state step.
    pub faults_per_step: f64,
    /// Calls to a general-purpose allocator (or, for the pool, to the system) per
    /// steady-state step.
    pub allocs_per_step: f64,
    /// Peak resident memory of the process.
    pub peak_rss: u64,
}

impl Summary {
    /// One machine-readable line.
    pub fn line(&self) -> String {
        format!(
            "SUMMARY first_loss={} last_loss={} steps_per_s={} faults_per_step={} allocs_per_step={} peak_rss={}",
            self.first_loss, self.last_loss, self.steps_per_s, self.faults_per_step, self.allocs_per_step, self.peak_rss
        )
    }

    /// Reads the line back.
    pub fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("SUMMARY "))?;
        let field = |name: &str| -> Option<f64> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))?
                .parse()
                .ok()
        };
        Some(Self {
            first_loss: field("first_loss")? as f32,
            last_loss: field("last_loss")? as f32,
            steps_per_s: field("steps_per_s")?,
            faults_per_step: field("faults_per_step")?,
            allocs_per_step: field("allocs_per_step")?,
            peak_rss: field("peak_rss")? as u64,
        })
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
) -> Result<Summary, String> {
    let mut trainer = Trainer::new(backend, args)?;
    let calls = || allocator::general_calls() + system_calls();
    let warmup = (args.steps / 2).min(args.steps.saturating_sub(1));
    let mut summary = Summary::default();
    let (mut faults, mut allocs, mut started) = (0, 0, Instant::now());
    for step in 0..args.steps {
        if step == warmup {
            faults = minor_faults();
            allocs = calls();
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
    summary.allocs_per_step = (calls() - allocs) as f64 / measured;
    summary.peak_rss = peak_rss();
    Ok(summary)
}

/// `bytes` in MiB, for tables.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// `bytes` in the largest binary unit that keeps the number at least 1 ("256.00 KiB",
/// "10.00 MiB"), as the pool's own messages write them.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let (mut value, mut unit) = (bytes as f64 / 1024.0, 0);
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}
