//! `compare`: the same training in child processes, on the pool, on `Vec<f32>` with glibc,
//! on `Vec<f32>` with mimalloc and, with `--torch`, in PyTorch; alternated round by round,
//! medians side by side.

use anyhow::{anyhow, Context};
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use crate::allocator::{COMPARED, VARIABLE};
use crate::args::{Args, CompareArgs, Keep};
use ferropool_figures::spread;

use crate::measure::Summary;
use crate::show::{bytes, table};

/// The PyTorch recipe, next to this package's sources.
const TORCH_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_mlp.py");

/// Runs the rounds and prints the table.
pub fn compare(args: &CompareArgs) -> anyhow::Result<()> {
    let train = &args.train;
    if train.trace.is_some() || train.plot.is_some() || train.json {
        return Err(anyhow!(
            "compare writes no trace, plot or JSON: run `train` for those"
        ));
    }
    let exe = std::env::current_exe().context("locating this program to run its children")?;
    let forwarded = training_flags(std::env::args_os().skip(1));
    let mut variants: Vec<(&str, Command)> = COMPARED
        .into_iter()
        .map(|choice| {
            let mut command = Command::new(&exe);
            command
                .env(VARIABLE, choice.name())
                .args(["train", "--json"])
                .args(&forwarded);
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
        variants.push(("pytorch", torch_command(python, train)));
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
    Ok(())
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
        } else if text == "--rounds" || text == "--torch" {
            skip_value = true;
        } else if !(text.starts_with("--rounds=") || text.starts_with("--torch=")) {
            kept.push(arg);
        }
    }
    kept
}

/// The PyTorch run of the same recipe.
pub(crate) fn torch_command(python: &Path, train: &Args) -> Command {
    let mut command = Command::new(python);
    command.arg(TORCH_SCRIPT);
    for (flag, value) in [
        ("--steps", train.steps.to_string()),
        ("--batch", train.batch.to_string()),
        ("--hidden", train.hidden.to_string()),
        ("--layers", train.layers.to_string()),
        (
            "--checkpoint-every",
            match train.keep() {
                Keep::Every(every) => every.to_string(),
                // PyTorch has no budget: it keeps every layer's input, as the pool does when
                // the budget holds them all.
                Keep::Fitted => "1".into(),
            },
        ),
        ("--threads", train.threads().to_string()),
        ("--lr", train.lr.to_string()),
        ("--seed", train.seed.to_string()),
    ] {
        command.args([flag, &value]);
    }
    command
}

/// Runs one child and reads its JSON line.
fn run_child(name: &str, command: &mut Command) -> anyhow::Result<Summary> {
    let output = command
        .output()
        .map_err(|e| anyhow!("starting the {name} run: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    match Summary::parse(&text) {
        Some(summary) if output.status.success() => Ok(summary),
        _ => Err(anyhow!(
            "the {name} run failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .trim()
                .trim_start_matches("error: ")
        )),
    }
}

/// The table: one column per variant, medians over the rounds (and the range when there are
/// several), ratios of the pool against each of the others.
fn print_table(names: &[&str], runs: &[Vec<Summary>], rounds: usize) {
    let column = |name: &str| match name {
        "pool" => "ferropool".to_string(),
        "pytorch" => "PyTorch".to_string(),
        other => format!("Vec<f32> {other}"),
    };
    let median =
        |runs: &[Summary], f: &dyn Fn(&Summary) -> f64| spread(runs.iter().map(f).collect());
    let cell = |runs: &[Summary], f: &dyn Fn(&Summary) -> f64, show: &dyn Fn(f64) -> String| {
        let (m, lo, hi) = median(runs, f);
        if rounds > 1 {
            format!("{} ({}-{})", show(m), show(lo), show(hi))
        } else {
            show(m)
        }
    };
    let ratios = |f: &dyn Fn(&Summary) -> f64| {
        let pool = median(&runs[0], f).0;
        names[1..]
            .iter()
            .zip(&runs[1..])
            .map(|(name, runs)| format!("{:.2}x {name}", pool / median(runs, f).0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut header: Vec<String> = vec![String::new()];
    header.extend(names.iter().map(|n| column(n)));
    header.push("ferropool vs".into());
    let mut figures = table(header);
    let mut row =
        |label: &str, f: &dyn Fn(&Summary) -> f64, show: &dyn Fn(f64) -> String, ratio| {
            let mut cells = vec![label.to_owned()];
            cells.extend(runs.iter().map(|r| cell(r, f, show)));
            cells.push(if ratio { ratios(f) } else { String::new() });
            figures.add_row(cells);
        };
    let calls = |value: Option<f64>| value.unwrap_or(f64::NAN);
    row("steps/s", &|s| s.steps_per_s, &|v| format!("{v:.2}"), true);
    row(
        "minor page faults per step",
        &|s| s.faults_per_step,
        &|v| format!("{v:.1}"),
        false,
    );
    // Calls are `NaN` where a run does not count them (PyTorch).
    let calls_cell = |v: f64| {
        if v.is_nan() {
            "-".into()
        } else {
            format!("{v:.1}")
        }
    };
    row(
        "calls to glibc per step",
        &|s| calls(s.glibc_calls_per_step),
        &calls_cell,
        false,
    );
    row(
        "calls to mimalloc per step",
        &|s| calls(s.mimalloc_calls_per_step),
        &calls_cell,
        false,
    );
    row(
        "peak RSS",
        &|s| s.peak_rss as f64,
        &|v| bytes(v as u64).to_string(),
        true,
    );
    let mut losses = vec!["loss, first -> last".to_owned()];
    losses.extend(
        runs.iter()
            .map(|r| format!("{:.3} -> {:.3}", r[0].first_loss, r[0].last_loss)),
    );
    losses.push(String::new());
    figures.add_row(losses);
    println!();
    println!("{figures}");
    println!();
    println!(
        "(steady state: the second half of the steps; {rounds} round(s), medians (min-max). Calls: those that reach glibc or mimalloc; ferropool's front end sends requests under 4 KiB to mimalloc. PyTorch's calls are not counted.)"
    );
}

#[cfg(test)]
mod tests {
    use super::training_flags;

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
        ];
        let kept = training_flags(args.iter().map(Into::into));
        assert_eq!(kept, ["--steps", "4", "--batch", "8"]);
    }
}
