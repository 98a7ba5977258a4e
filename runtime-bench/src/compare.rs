//! `--compare`: the same training under every allocator, each in a child process of this
//! binary, alternated round by round, then a Markdown table (`comfy-table`) of medians
//! (min-max) with ratios against mimalloc measured in the same run.

use std::process::Command;

use anyhow::{bail, Context};
use ferropool_figures::spread;

use crate::allocator::{self, Choice};
use crate::train::{Recipe, Summary};

/// Runs `rounds` rounds at each thread count and prints the table.
pub fn run(recipe: &Recipe, thread_counts: &[usize], rounds: usize) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let mut tables = Vec::new();
    for &threads in thread_counts {
        let mut runs: Vec<Vec<Summary>> = vec![Vec::new(); Choice::ALL.len()];
        for round in 1..=rounds {
            for (i, choice) in Choice::ALL.into_iter().enumerate() {
                eprintln!(
                    "{threads} thread(s), round {round}/{rounds}: {}",
                    choice.name()
                );
                let output = Command::new(&exe)
                    .env(allocator::VARIABLE, choice.name())
                    .args(["--threads", &threads.to_string()])
                    .args(["--steps", &recipe.steps.to_string()])
                    .args(["--batch", &recipe.batch.to_string()])
                    .args(["--layers", &recipe.layers.to_string()])
                    .args(["--hidden", &recipe.hidden.to_string()])
                    .args(["--lr", &recipe.lr.to_string()])
                    .output()
                    .with_context(|| format!("running {}", exe.display()))?;
                if !output.status.success() {
                    bail!(
                        "the {} run failed ({}): {}",
                        choice.name(),
                        output.status,
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
                let stdout = String::from_utf8(output.stdout).context("the child's output")?;
                let line = stdout.lines().last().context("the child printed nothing")?;
                let summary: Summary = serde_json::from_str(line)
                    .with_context(|| format!("reading the child's line {line:?}"))?;
                runs[i].push(summary);
            }
        }
        tables.push(table(recipe, threads, rounds, &runs));
    }
    println!("{}", tables.join("\n"));
    Ok(())
}

fn table(recipe: &Recipe, threads: usize, rounds: usize, runs: &[Vec<Summary>]) -> String {
    type Figure = fn(&Summary) -> f64;
    type Show = fn(f64) -> String;
    let figures: [(Figure, Show); 5] = [
        (|s| s.steps_per_s, |v| format!("{v:.2}")),
        (|s| s.faults_per_step, |v| format!("{v:.0}")),
        (|s| s.cpu_ms_per_step, |v| format!("{v:.1}")),
        (
            |s| s.thp_bytes as f64 / f64::from(1 << 20),
            |v| format!("{v:.0}"),
        ),
        (
            |s| s.peak_rss as f64 / f64::from(1 << 20),
            |v| format!("{v:.0}"),
        ),
    ];
    let mimalloc = Choice::ALL
        .iter()
        .position(|&c| c == Choice::Mimalloc)
        .expect("mimalloc is a choice");
    // Each allocator's median and range of each figure.
    let spreads: Vec<[(f64, f64, f64); 5]> = runs
        .iter()
        .map(|r| figures.map(|(get, _)| spread(r.iter().map(get).collect())))
        .collect();
    let mut out = format!(
        "MLP {} -> {} x {} -> {}, batch {}, {} steps (second half timed), {threads} thread(s), {rounds} round(s): medians (min-max)\n\n",
        crate::train::INPUT,
        recipe.layers,
        recipe.hidden,
        crate::train::CLASSES,
        recipe.batch,
        recipe.steps,
    );
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::ASCII_MARKDOWN)
        .set_header([
            "allocator",
            "steps/s",
            "vs mimalloc",
            "faults/step",
            "vs mimalloc",
            "CPU ms/step",
            "vs mimalloc",
            "in huge pages (MiB)",
            "vs mimalloc",
            "peak RSS (MiB)",
            "vs mimalloc",
        ]);
    for (i, choice) in Choice::ALL.into_iter().enumerate() {
        let mut row = vec![choice.name().to_owned()];
        for (f, (_, show)) in figures.iter().enumerate() {
            let (median, min, max) = spreads[i][f];
            let base = spreads[mimalloc][f].0;
            row.push(format!("{} ({}-{})", show(median), show(min), show(max)));
            row.push(if base == 0.0 {
                "-".to_string()
            } else {
                format!("{:.2}x", median / base)
            });
        }
        table.add_row(row);
    }
    out.push_str(&table.to_string());
    out.push('\n');
    out
}
