//! `runtime-bench`: an MLP trained with burn (flex backend, autodiff) under the global
//! allocator that `RUNTIME_BENCH_ALLOCATOR` picks: one JSON line per run, or `--compare`, which
//! runs all four allocators as child processes, alternated, and prints a markdown table.

mod allocator;
mod compare;
mod train;

use anyhow::{bail, Context};
use clap::Parser;

#[global_allocator]
static GLOBAL: &ferropool_choice::ChosenAllocator = &allocator::ALLOCATOR;

/// Trains an MLP with burn's flex backend under the allocator chosen by
/// RUNTIME_BENCH_ALLOCATOR (glibc, mimalloc, pool, pool-mimalloc; unset: pool) and prints one
/// JSON line; or, with --compare, runs them all and prints a table.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Worker threads: rayon's global pool, which burn-flex and its GEMM run on.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    threads: usize,
    /// Training steps; the second half is timed.
    #[arg(long, default_value_t = 60, value_parser = at_least_one())]
    steps: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 512, value_parser = at_least_one())]
    batch: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 6, value_parser = at_least_one())]
    layers: usize,
    /// Width of each hidden layer.
    #[arg(long, default_value_t = 512, value_parser = at_least_one())]
    hidden: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 0.002, value_parser = positive_finite)]
    lr: f64,
    /// Run every allocator in child processes, alternated, and print a markdown table.
    #[arg(long)]
    compare: bool,
    /// With --compare: rounds (each allocator runs once a round at each thread count).
    #[arg(long, default_value_t = 5, value_parser = at_least_one())]
    rounds: usize,
    /// With --compare: the thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = at_least_one())]
    thread_counts: Vec<usize>,
}

/// Bytes in GiB, for a message.
fn gib(bytes: usize) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Memory the system has available (`MemAvailable` of `/proc/meminfo`), in bytes; `None`
/// where it cannot be read.
fn available_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info
        .lines()
        .find(|line| line.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A whole number of at least 1 (clap refuses others with exit code 2).
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

/// A finite number above 0.
fn positive_finite(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err("expected a finite number above 0, e.g. 2e-3".into()),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(error) = allocator::ALLOCATOR.unknown_value_error() {
        bail!(error);
    }
    let recipe = train::Recipe {
        steps: args.steps,
        batch: args.batch,
        layers: args.layers,
        hidden: args.hidden,
        lr: args.lr,
        threads: args.threads,
    };
    // A model or batch too large to hold would end the process inside burn (an allocation
    // that fails aborts): refuse it here, with what it needs.
    let available = available_memory();
    match recipe.bytes() {
        Some(need) if available.is_none_or(|available| need <= available) => {}
        need => bail!(
            "--layers {}, --hidden {} and --batch {} need {}{}",
            args.layers,
            args.hidden,
            args.batch,
            need.map_or(
                "more memory than the address space holds".into(),
                |need| format!("at least {} of memory", gib(need))
            ),
            available.map_or("".into(), |a| format!("; {} are available", gib(a)))
        ),
    }
    if args.compare {
        return compare::run(&recipe, &args.thread_counts, args.rounds);
    }
    // burn-flex parallelises with rayon (its global pool), and so does its GEMM (the `gemm`
    // crate): the pool is sized here, before any thread starts.
    rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build_global()
        .context("starting rayon's global pool")?;
    let summary = train::run(&recipe);
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
