//! The command line.

use std::path::PathBuf;

use clap::Parser;

/// Train an MLP on the CPU with activation checkpointing, every allocation in ferropool.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Args {
    /// Training steps.
    #[arg(long, default_value_t = 60)]
    pub steps: usize,
    /// Examples per batch.
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Width of the hidden layers.
    #[arg(long, default_value_t = 512)]
    pub hidden: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 6)]
    pub layers: usize,
    /// Keep the input of every N-th layer; recompute the rest in the backward pass.
    #[arg(long, default_value_t = 2)]
    pub checkpoint_every: usize,
    /// Threads for the forward pass and the replay (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Pool byte budget, e.g. 256MiB, 1GiB or 1000000 (default: none).
    #[arg(long, value_parser = parse_bytes)]
    pub budget: Option<u64>,
    /// Adam learning rate.
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f32,
    /// Seed of the data and the initial weights.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Run the same training on the pool, on `Vec<f32>` with glibc, and on `Vec<f32>` with
    /// mimalloc (each in a child process), and compare.
    #[arg(long)]
    pub compare: bool,
    /// Write the pool's event trace in the Chrome Trace Event format (opens in Perfetto).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Draw the pool's memory timeline as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print one machine-readable summary line only (used by --compare).
    #[arg(long, hide = true)]
    pub summary_only: bool,
}

impl Args {
    /// The threads to use.
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1)
    }
}

/// A byte count with an optional binary unit.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        other => return Err(format!("unknown unit {other:?} (use B, KiB, MiB or GiB)")),
    };
    number
        .parse::<u64>()
        .map_err(|e| format!("{text:?}: {e}"))?
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} overflows 64 bits"))
}
