//! `compare`: the same training in child processes, on the pool, on `Vec<f32>` with glibc,
//! on `Vec<f32>` with mimalloc and, with `--torch`, in PyTorch; alternated round by round,
//! medians side by side.

use anyhow::{anyhow, Context};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::allocator::{COMPARED, VARIABLE};
use crate::args::{Args, CompareArgs, Keep, ModelKind};
use crate::data::{Text, Tokenizer};
use crate::error::BadInput;
use ferropool_figures::spread;

use crate::measure::Summary;
use crate::show::{bytes, table};

/// The PyTorch recipes, next to this package's sources.
const TORCH_MLP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_mlp.py");
const TORCH_GPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_gpt.py");

/// Runs the rounds and prints the table.
pub fn compare(args: &CompareArgs) -> anyhow::Result<()> {
    let train = &args.train;
    train.check_all()?;
    if train.trace.is_some() || train.plot.is_some() || train.json {
        return Err(anyhow!(
            "compare writes no trace, plot or JSON: run `train` for those"
        ));
    }
    if train.save_init.is_some() || train.load.is_some() {
        return Err(anyhow!(
            "compare writes the initial weights itself and starts every run from them: run \
             `train` for --save-init and --load"
        ));
    }
    let exe = std::env::current_exe().context("locating this program to run its children")?;
    let mut forwarded = training_flags(std::env::args_os().skip(1));
    let files = RunFiles::write(train, "compare")?;
    if let Some(path) = &files.init {
        forwarded.extend(["--load".into(), path.into()]);
    }
    run_rounds(args, &exe, &forwarded, &files)
}

/// What every run of a GPT's `compare` or `sweep` starts from, written once to the system's
/// temporary directory and removed when dropped: the initial weights, and for a tokenizer
/// other than bytes the text's tokens, which PyTorch reads rather than tokenizing again.
#[derive(Debug, Default)]
pub(crate) struct RunFiles {
    /// The initial weights (safetensors; the GPT only).
    pub init: Option<PathBuf>,
    /// The text's tokens (little-endian `u32`s; GPT-2's tokenizer only).
    pub tokens: Option<PathBuf>,
}

impl RunFiles {
    /// The files a run of `train` needs, named after `what` and this process.
    pub fn write(train: &Args, what: &str) -> anyhow::Result<Self> {
        let mut files = Self::default();
        if train.model != ModelKind::Gpt {
            return Ok(files);
        }
        let name = |ext: &str| {
            let id = std::process::id();
            std::env::temp_dir().join(format!("train-replay-{what}-{id}.{ext}"))
        };
        let init = files.init.insert(name("safetensors"));
        crate::model::gpt::save_init(&train.gpt_config()?, init)?;
        if train.tokenizer != Tokenizer::Bytes {
            let text = Text::load(
                train.data.as_deref(),
                train.context,
                train.vocab(),
                train.tokenizer,
            )?;
            text.write_tokens(files.tokens.insert(name("tokens")))?;
        }
        // The weights were made whole (GPT-2 small's, with their moments: 1.4 GiB) only to
        // be written: this process holds nothing of them while its children train.
        crate::allocator::give_back_cached();
        Ok(files)
    }
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        for path in [&self.init, &self.tokens].into_iter().flatten() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The rounds of `compare`: every variant in turn, `--rounds` times; then the table.
fn run_rounds(
    args: &CompareArgs,
    exe: &Path,
    forwarded: &[OsString],
    files: &RunFiles,
) -> anyhow::Result<()> {
    let train = &args.train;
    let mut variants: Vec<(&str, Command)> = COMPARED
        .into_iter()
        .map(|choice| {
            let mut command = Command::new(exe);
            command
                .env(VARIABLE, choice.name())
                .args(["train", "--json"])
                .args(forwarded);
            // The pool's variant is "pool" in messages and tables (it runs over mimalloc).
            let name = if choice.is_pool() {
                "pool"
            } else {
                choice.name()
            };
            (name, command)
        })
        .collect();
    if let Some(python) = &args.torch {
        variants.push(("pytorch", torch_command(python, train, files, false)));
        if train.model == ModelKind::Gpt {
            variants.push((
                "pytorch-compiled",
                torch_command(python, train, files, true),
            ));
        }
    }
    let names: Vec<&str> = variants.iter().map(|(name, _)| *name).collect();
    println!(
        "running the same training ({} threads, {} steps) {} time(s) each, alternated: {}...",
        train.threads(),
        train.steps,
        args.rounds,
        names.join(", ")
    );
    let mut runs: Vec<Vec<Summary>> = vec![Vec::new(); variants.len()];
    for _ in 0..args.rounds {
        for ((name, command), runs) in variants.iter_mut().zip(&mut runs) {
            runs.push(run_child(name, command)?);
        }
    }
    print_table(&names, &runs, args.rounds);
    agreement(args, &names, &runs)
}

/// The largest relative difference between the first losses of `ours` and `theirs` (from the
/// same weights on the same batches); infinite where either is NaN or infinite, or where one
/// run has fewer losses.
pub fn worst_difference(ours: &[f32], theirs: &[f32]) -> f64 {
    if ours.len() != theirs.len() {
        return f64::INFINITY;
    }
    ours.iter()
        .zip(theirs)
        .map(|(&a, &b)| match (a.is_finite(), b.is_finite()) {
            // Equal (zero included, where the quotient would be NaN and the fold drop it).
            (true, true) if a == b => 0.0,
            (true, true) => ((a as f64 - b as f64) / b as f64).abs(),
            _ => f64::INFINITY,
        })
        .fold(0.0, f64::max)
}

/// Prints how far each PyTorch run's first losses are from the pool's (the first round of
/// each; the GPT's, which start from the job's weights), and fails past `--agree`.
fn agreement(args: &CompareArgs, names: &[&str], runs: &[Vec<Summary>]) -> anyhow::Result<()> {
    // The MLP's PyTorch recipe draws weights of its own: nothing to agree on.
    if args.train.model != ModelKind::Gpt {
        return Ok(());
    }
    let ours = &runs[0][0].losses;
    let mut failed = Vec::new();
    for (name, runs) in names
        .iter()
        .zip(runs)
        .filter(|(n, _)| n.starts_with("pytorch"))
    {
        let worst = worst_difference(ours, &runs[0].losses);
        println!(
            "(the first {} losses of ferropool and {name}, from the same initial weights on \
             the same batches, differ by at most {worst:.1e} relative; --agree {:.0e})",
            ours.len(),
            args.agree
        );
        // NaN is the worst disagreement (`worst_difference` makes it infinite).
        if worst.is_nan() || worst > args.agree {
            failed.push(format!("{name} by {worst:.1e}"));
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(anyhow!(
            "the first losses disagree past --agree {:.0e}: {}",
            args.agree,
            failed.join(", ")
        )),
    }
}

/// The training flags of this command line, to hand to the children: every argument but the
/// subcommand's name and `compare`'s own flags (with their values).
fn training_flags(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut kept = Vec::new();
    let mut skip_value = false;
    for arg in args {
        let text = arg.to_string_lossy();
        if skip_value {
            skip_value = false;
        } else if text == "compare" && kept.is_empty() {
        } else if ["--rounds", "--torch", "--agree"].contains(&text.as_ref()) {
            skip_value = true;
        } else if !["--rounds=", "--torch=", "--agree="]
            .iter()
            .any(|own| text.starts_with(own))
        {
            kept.push(arg);
        }
    }
    kept
}

/// The PyTorch run of the same recipe (for the GPT: from the initial weights and on the
/// tokens of `files`, if written; compiled with `torch.compile` if `compiled`).
pub(crate) fn torch_command(
    python: &Path,
    train: &Args,
    files: &RunFiles,
    compiled: bool,
) -> Command {
    let mut command = Command::new(python);
    let every = match train.keep() {
        Keep::Every(every) => every,
        // PyTorch has no budget: it keeps everything, as the pool does when the budget holds
        // it all.
        Keep::Fitted => match train.model {
            ModelKind::Gpt => 0,
            ModelKind::Mlp => 1,
        },
    };
    let mut flags = vec![
        ("--steps", train.steps.to_string()),
        ("--batch", train.batch.to_string()),
        ("--layers", train.layers.to_string()),
        ("--checkpoint-every", every.to_string()),
        ("--threads", train.threads().to_string()),
        ("--lr", train.lr.to_string()),
        ("--seed", train.seed.to_string()),
    ];
    match train.model {
        ModelKind::Mlp => {
            command.arg(TORCH_MLP);
            flags.push(("--hidden", train.hidden.to_string()));
        }
        ModelKind::Gpt => {
            command.arg(TORCH_GPT);
            flags.extend([
                ("--context", train.context.to_string()),
                ("--width", train.width.to_string()),
                ("--heads", train.heads.to_string()),
                ("--vocab", train.vocab().to_string()),
                ("--weight-decay", train.weight_decay.to_string()),
                ("--beta1", train.beta1.to_string()),
                ("--beta2", train.beta2.to_string()),
                ("--eps", train.eps.to_string()),
                ("--losses", crate::measure::KEPT_LOSSES.to_string()),
            ]);
            match (&files.tokens, &train.data) {
                (Some(tokens), _) => flags.push(("--tokens", tokens.display().to_string())),
                (None, Some(data)) => flags.push(("--data", data.display().to_string())),
                (None, None) => {}
            }
            if let Some(init) = &files.init {
                flags.push(("--load", init.display().to_string()));
            }
            if compiled {
                command.arg("--compile");
            }
        }
    }
    for (flag, value) in flags {
        command.args([flag, &value]);
    }
    command
}

/// Runs one child and reads its JSON line; a command line it refused is this one's: the
/// same exit code and message.
fn run_child(name: &str, command: &mut Command) -> anyhow::Result<Summary> {
    crate::child::run(command).map_err(|failed| match failed.refused {
        true => BadInput(failed.message).into(),
        false => anyhow!("the {name} run failed: {}", failed.message),
    })
}

/// A figure of one run.
type Figure = dyn Fn(&Summary) -> f64;

/// The runs of each variant (the pool's first), as the table's columns show them.
struct Columns<'a> {
    names: &'a [&'a str],
    runs: &'a [Vec<Summary>],
    rounds: usize,
}

impl Columns<'_> {
    /// The header: a column per variant, and the pool's ratios.
    fn header(&self) -> Vec<String> {
        let column = |name: &str| match name {
            "pool" => "ferropool".to_string(),
            "pytorch" => "PyTorch".to_string(),
            "pytorch-compiled" => "PyTorch compiled".to_string(),
            other => format!("Vec<f32> {other}"),
        };
        let mut header = vec![String::new()];
        header.extend(self.names.iter().map(|n| column(n)));
        header.push("ferropool vs".into());
        header
    }

    /// `f`'s median over `runs` (with its range when there are several rounds).
    fn cell(&self, runs: &[Summary], f: &Figure, show: &dyn Fn(f64) -> String) -> String {
        let (m, lo, hi) = spread(runs.iter().map(f).collect());
        match self.rounds {
            1 => show(m),
            _ => format!("{} ({}-{})", show(m), show(lo), show(hi)),
        }
    }

    /// The pool's median of `f` over each other variant's.
    fn ratios(&self, f: &Figure) -> String {
        let median = |runs: &[Summary]| spread(runs.iter().map(f).collect()).0;
        let pool = median(&self.runs[0]);
        self.names[1..]
            .iter()
            .zip(&self.runs[1..])
            .map(|(name, runs)| format!("{:.2}x {name}", pool / median(runs)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A row: `label`, each variant's cell, and the ratios if `ratio`.
    fn row(
        &self,
        label: &str,
        f: &Figure,
        show: &dyn Fn(f64) -> String,
        ratio: bool,
    ) -> Vec<String> {
        let mut cells = vec![label.to_owned()];
        cells.extend(self.runs.iter().map(|r| self.cell(r, f, show)));
        cells.push(if ratio { self.ratios(f) } else { String::new() });
        cells
    }
}

/// The table: one column per variant, medians over the rounds (and the range when there are
/// several), ratios of the pool against each of the others.
fn print_table(names: &[&str], runs: &[Vec<Summary>], rounds: usize) {
    let columns = Columns {
        names,
        runs,
        rounds,
    };
    let mut figures = table(columns.header());
    // Calls are `NaN` where a run does not count them (PyTorch).
    let calls_cell = |v: f64| match v.is_nan() {
        true => "-".to_owned(),
        false => format!("{v:.1}"),
    };
    let one = |v: f64| format!("{v:.1}");
    // Three figures below 1 step/s (GPT-2 small runs at 0.05).
    let rate = |v: f64| match v < 1.0 {
        true => format!("{v:.3}"),
        false => format!("{v:.2}"),
    };
    figures.add_row(columns.row("steps/s", &|s| s.steps_per_s, &rate, true));
    figures.add_row(columns.row(
        "minor page faults per step",
        &|s| s.faults_per_step,
        &one,
        false,
    ));
    let glibc = |s: &Summary| s.glibc_calls_per_step.unwrap_or(f64::NAN);
    figures.add_row(columns.row("calls to glibc per step", &glibc, &calls_cell, false));
    let mimalloc = |s: &Summary| s.mimalloc_calls_per_step.unwrap_or(f64::NAN);
    figures.add_row(columns.row("calls to mimalloc per step", &mimalloc, &calls_cell, false));
    let rss = |v: f64| bytes(v as u64).to_string();
    figures.add_row(columns.row(
        "peak RSS (whole process)",
        &|s| s.peak_rss as f64,
        &rss,
        true,
    ));
    rss_rows(&mut figures, &columns);
    if runs.iter().any(|r| r[0].compile_s.is_some()) {
        let mut cells = vec!["compile time, s (apart)".to_owned()];
        cells.extend(runs.iter().map(|r| match r[0].compile_s {
            Some(_) => columns.cell(r, &|s| s.compile_s.unwrap_or(0.0), &one),
            None => "-".into(),
        }));
        cells.push(String::new());
        figures.add_row(cells);
    }
    let mut losses = vec!["loss, first -> last".to_owned()];
    let loss = |r: &Vec<Summary>| format!("{:.3} -> {:.3}", r[0].first_loss, r[0].last_loss);
    losses.extend(runs.iter().map(loss));
    losses.push(String::new());
    figures.add_row(losses);
    println!();
    println!("{figures}");
    println!();
    println!(
        "(steady state: the second half of the steps; {rounds} round(s), medians (min-max). \
         Calls: those that reach glibc or mimalloc; ferropool's front end sends requests \
         under 4 KiB to mimalloc. PyTorch's calls are not counted.)"
    );
}

/// The rows of each process's RSS before its first step (the program and its libraries, the
/// weights; PyTorch's interpreter and libraries are some 0.8 GiB of it) and its peak above
/// that, and the pool's whole peak against PyTorch's above its start.
fn rss_rows(figures: &mut comfy_table::Table, columns: &Columns<'_>) {
    let (names, runs) = (columns.names, columns.runs);
    // Each process's RSS before its first step (the program and its libraries, the weights;
    // PyTorch's interpreter and libraries are some 0.8 GiB of it) and its peak above that.
    let baseline = |s: &Summary| s.baseline_rss.map_or(f64::NAN, |b| b as f64);
    let above = |s: &Summary| match s.baseline_rss {
        Some(b) => s.peak_rss.saturating_sub(b) as f64,
        None => f64::NAN,
    };
    let rss_or_dash = |v: f64| match v.is_nan() {
        true => "-".to_owned(),
        false => bytes(v as u64).to_string(),
    };
    figures.add_row(columns.row("RSS before the first step", &baseline, &rss_or_dash, false));
    figures.add_row(columns.row("peak RSS above it", &above, &rss_or_dash, true));
    // The pool's whole peak against PyTorch's peak above its own start, which is mostly its
    // interpreter and libraries.
    if names.iter().any(|n| n.starts_with("pytorch")) {
        let median = |runs: &[Summary], f: &Figure| spread(runs.iter().map(f).collect()).0;
        let pool = median(&runs[0], &|s| s.peak_rss as f64);
        let mut cells =
            vec!["ferropool's whole peak RSS against PyTorch's above its start".to_owned()];
        cells.extend(runs.iter().map(|_| String::new()));
        let against: Vec<String> = names
            .iter()
            .zip(runs)
            .filter(|(name, _)| name.starts_with("pytorch"))
            .map(|(name, runs)| format!("{:.2}x {name}", pool / median(runs, &above)))
            .collect();
        cells.push(against.join(", "));
        figures.add_row(cells);
    }
}

#[cfg(test)]
mod tests {
    use super::{training_flags, worst_difference};

    #[test]
    fn a_nan_or_a_missing_loss_is_the_worst_disagreement() {
        assert_eq!(worst_difference(&[2.0, 4.0], &[2.0, 4.0]), 0.0);
        let near = worst_difference(&[2.0, 4.0], &[2.0, 4.004]);
        assert!((near - 1e-3).abs() < 1e-6, "{near}");
        // A NaN after a finite difference, on either side, and a shorter run.
        assert_eq!(
            worst_difference(&[2.0, f32::NAN], &[2.1, 4.0]),
            f64::INFINITY
        );
        assert_eq!(
            worst_difference(&[2.0, 4.0], &[2.0, f32::NAN]),
            f64::INFINITY
        );
        assert_eq!(worst_difference(&[2.0, 4.0], &[2.0]), f64::INFINITY);
        // A loss of zero: equal agrees, anything else against it is the worst.
        assert_eq!(worst_difference(&[0.0, 4.0], &[0.0, 4.0]), 0.0);
        assert_eq!(worst_difference(&[0.5], &[0.0]), f64::INFINITY);
    }

    #[test]
    fn the_children_get_the_training_flags_and_not_compares_own() {
        let args = [
            "compare",
            "--steps",
            "4",
            "--rounds",
            "3",
            "--torch=/x/python",
            "--batch",
            "8",
            "--torch",
            "py",
            "--rounds=2",
            "--agree",
            "1e-5",
            "--agree=1e-6",
        ];
        let kept = training_flags(args.iter().map(Into::into));
        assert_eq!(kept, ["--steps", "4", "--batch", "8"]);
    }
}
