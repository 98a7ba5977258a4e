//! The command line. Every value is checked as it is parsed: a bad one is refused with exit
//! code 2 and a message that says what the flag accepts.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Train an MLP on the CPU with activation checkpointing, every allocation in ferropool.
///
/// Without a subcommand it trains (as `train`).
#[derive(Parser, Debug, Clone)]
#[command(version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The training, when no subcommand is given.
    #[command(flatten)]
    pub train: Args,
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Train on the pool (the default).
    Train(Args),
    /// Run the same training on the pool, on `Vec<f32>` with glibc and on `Vec<f32>` with
    /// mimalloc (each in a child process that gets this command's training flags), and with
    /// `--torch` in PyTorch too; print them side by side.
    Compare(CompareArgs),
    /// The trade-off between memory and speed: the training with each fixed
    /// `--checkpoint-every` and fitted to each of a list of budgets (each in a child process,
    /// alternated run by run), and with `--torch` in PyTorch at each fixed k; one table of
    /// medians, and with `--plot` the frontier.
    Sweep(SweepArgs),
}

/// `sweep`'s flags: the training's (without `--budget` and `--checkpoint-every`, which it
/// chooses; `--plot` draws the frontier, steps/s against peak memory), and its own.
#[derive(clap::Args, Debug, Clone)]
pub struct SweepArgs {
    /// The training every run does.
    #[command(flatten)]
    pub train: Args,
    /// Budgets of the fitted runs, comma-separated (default: 50, 60, 70, 75, 80 and 90% of
    /// the peak live bytes of `--checkpoint-every 1`, measured first).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub budgets: Vec<u64>,
    /// The fixed `--checkpoint-every` values, comma-separated (1 is always run: the
    /// reference).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 3, 6], value_parser = at_least_one)]
    pub every: Vec<usize>,
    /// Runs of each configuration (the table shows medians).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub runs: usize,
    /// A Python interpreter with PyTorch: also runs `scripts/torch_mlp.py` (the same recipe
    /// with `torch.utils.checkpoint`) at each fixed k.
    #[arg(long, value_name = "PYTHON")]
    pub torch: Option<PathBuf>,
}

/// `compare`'s flags: the training's, and its own.
#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// The training every run does.
    #[command(flatten)]
    pub train: Args,
    /// Rounds: each runs every variant once, in turn; the table shows medians (min-max).
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub rounds: usize,
    /// A Python interpreter with PyTorch: also runs `scripts/torch_mlp.py` (the same recipe
    /// in PyTorch) each round.
    #[arg(long, value_name = "PYTHON")]
    pub torch: Option<PathBuf>,
}

/// The training's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Training steps (at least 1).
    #[arg(long, default_value_t = 60, value_parser = at_least_one)]
    pub steps: usize,
    /// Examples per batch (at least 1).
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub batch: usize,
    /// Width of the hidden layers (at least 1).
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub hidden: usize,
    /// Hidden layers (at least 1).
    #[arg(long, default_value_t = 6, value_parser = at_least_one)]
    pub layers: usize,
    /// Keep the input of every N-th layer; recompute the rest in the backward pass (N at
    /// least 1; default 2). With --budget and without this flag the job chooses instead: it
    /// keeps every layer's input that fits under the budget, and the pool evicts the rest and
    /// recomputes it when the backward pass reads it.
    #[arg(long, value_parser = at_least_one)]
    pub checkpoint_every: Option<usize>,
    /// Threads for the forward pass and the replay (at least 1, at most the 65,535 a thread
    /// pool may have; default: all cores).
    #[arg(long, value_parser = thread_count)]
    pub threads: Option<usize>,
    /// Byte budget of the training's pool, e.g. 256MiB, 1.5GiB, 10MB or 1000000 (default:
    /// none).
    ///
    /// It caps what the training's own pool reserves from the system: the model's
    /// parameters and Adam state, and the step's tensors (activations, checkpoints,
    /// gradients) come from it and must fit in it. Without --checkpoint-every the job fits
    /// them by eviction and recomputation, and a budget below the least the run needs stops
    /// it with an error (exit code 1) that names that least, the whole MiB at which the run
    /// completes and below which it does not; with --checkpoint-every, a run whose tensors do
    /// not fit stops with an error that says what it needed.
    /// Outside the budget stay the GEMM's packing buffers (one of the size of the L2 cache per
    /// thread, and one per GEMM call in flight), the scratch arena, small allocations, the
    /// binary and the stacks: the process-wide pool serves them, and the run's table
    /// reports that pool's peak.
    /// Units, in any case: B; k, M, G, T, P, E or kB, MB, ... (powers of 1000); Ki, Mi, Gi,
    /// Ti, Pi, Ei or KiB, MiB, ... (powers of 1024). A fraction such as 1.5GiB is rounded to
    /// the nearest byte; `1e9` is 10^9 bytes.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub budget: Option<u64>,
    /// Adam learning rate (a finite number above 0).
    #[arg(long, default_value_t = 2e-3, value_parser = positive_finite)]
    pub lr: f32,
    /// Seed of the data and the initial weights.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Write the pool's event trace in the Chrome Trace Event format (opens in Perfetto).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Draw the pool's memory timeline as SVG (the path must end in .svg).
    #[arg(long, value_parser = svg_path)]
    pub plot: Option<PathBuf>,
    /// Print the run's figures as one JSON line only (what `compare` reads from its
    /// children).
    #[arg(long)]
    pub json: bool,
}

/// What the forward pass keeps for the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The input of every n-th layer, as `--checkpoint-every` says (or by default); the rest
    /// is recomputed from them.
    Every(usize),
    /// Every layer's input as an evictable value: what fits under the budget stays, and the
    /// pool evicts the rest, which the backward pass recomputes when it reads it.
    Fitted,
}

/// `--checkpoint-every`'s default.
pub const DEFAULT_CHECKPOINT_EVERY: usize = 2;

impl Args {
    /// What the forward pass keeps: the job fits it to the budget when there is one and no
    /// `--checkpoint-every`.
    pub fn keep(&self) -> Keep {
        match (self.checkpoint_every, self.budget) {
            (Some(every), _) => Keep::Every(every),
            (None, Some(_)) => Keep::Fitted,
            (None, None) => Keep::Every(DEFAULT_CHECKPOINT_EVERY),
        }
    }

    /// The threads to use.
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1)
    }
}

/// A whole number of at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if count >= 1 => Ok(count),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

/// A thread count: at least 1, and no more than a rayon thread pool may have (it caps a
/// larger request silently, and the job sizes its per-thread state by the request).
fn thread_count(text: &str) -> Result<usize, String> {
    let most = rayon::max_num_threads();
    match at_least_one(text)? {
        count if count <= most => Ok(count),
        _ => Err(format!("expected at most {most} threads")),
    }
}

/// A finite number above 0.
fn positive_finite(text: &str) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err("expected a finite number above 0, e.g. 2e-3".into()),
    }
}

/// A path ending in `.svg`: the timeline is written as SVG only.
fn svg_path(text: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(text);
    match path.extension().and_then(|e| e.to_str()) {
        Some(extension) if extension.eq_ignore_ascii_case("svg") => Ok(path),
        _ => Err("the timeline is written as SVG only: give a path ending in .svg".into()),
    }
}

/// What [`parse_bytes`] accepts, for its errors.
const BYTE_UNITS: &str = "expected a number of bytes above 0 with an optional unit, in any \
     case: B; k, M, G, T, P, E or kB, MB, GB, TB, PB, EB (powers of 1000); Ki, Mi, Gi, Ti, Pi, \
     Ei or KiB, MiB, GiB, TiB, PiB, EiB (powers of 1024); e.g. 256MiB, 1.5GiB, 10MB, 1000000 \
     or 1e9";

/// A byte count above 0, as the `parse-size` crate reads it: a decimal number (with an
/// optional exponent, `1e9`) and an optional unit, decimal prefixes powers of 1000 and binary
/// ones powers of 1024, a fraction rounded to the nearest byte, a count past 2^64 refused
/// rather than clamped. Space is allowed between the number and the unit only (parse-size
/// would read `1 2 MiB` as 12 MiB).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let number_ends = text.find(char::is_whitespace).unwrap_or(text.len());
    if text[number_ends..].contains(|c: char| c.is_ascii_digit()) {
        return Err(format!("a space inside the number; {BYTE_UNITS}"));
    }
    match parse_size::parse_size(text) {
        Ok(0) => Err(format!("0 bytes; {BYTE_UNITS}")),
        Ok(bytes) => Ok(bytes),
        Err(parse_size::Error::Empty) => Err(format!("no number; {BYTE_UNITS}")),
        Err(parse_size::Error::PosOverflow) => Err(format!("more than 2^64 bytes; {BYTE_UNITS}")),
        Err(_) => Err(format!("not a byte count; {BYTE_UNITS}")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_with_binary_and_si_units() {
        for (text, bytes) in [
            ("1000000", 1_000_000),
            ("4096B", 4096),
            ("10MiB", 10 << 20),
            ("10 MiB", 10 << 20),
            ("256m", 256_000_000),
            ("256Mi", 256 << 20),
            ("1.5GiB", 3 << 29),
            ("1.5 gib", 3 << 29),
            ("10MB", 10_000_000),
            ("10mb", 10_000_000),
            ("2kB", 2_000),
            ("2KB", 2_000),
            ("2KiB", 2_048),
            ("0.5K", 500),
            ("0.5KiB", 512),
            ("1e6", 1_000_000),
            ("  64 MiB ", 64 << 20),
            ("1PiB", 1 << 50),
            ("0.5B", 1),
            ("18446744073709551615", u64::MAX),
            ("3.GB", 3_000_000_000),
            ("1TiB", 1 << 40),
            ("1.0000001B", 1),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn garbage_and_zero_are_refused_with_the_units() {
        for text in [
            "",
            "lots",
            "MiB",
            "10 XB",
            "1.2.3MiB",
            "-5MiB",
            "0",
            "0.1B",
            ".5KiB",
            " ",
            "1 2 MiB",
            "1 2",
            "1 MiB 5",
            "18446744073709551616",
            "19EB",
            "20EiB",
            "99999999999999999999",
        ] {
            let error = parse_bytes(text).expect_err(text);
            assert!(
                error.contains("MiB") && error.contains("MB"),
                "{text}: {error}"
            );
        }
    }
}
