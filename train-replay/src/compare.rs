//! `--compare`: the same training in three child processes, on the pool, on `Vec<f32>` with
//! glibc, and on `Vec<f32>` with mimalloc, side by side.

use crate::allocator::{Choice, VARIABLE};
use crate::args::Args;
use crate::measure::{mib, Summary};

/// Runs the three trainings and prints the table.
pub fn compare(args: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let run_child = |choice: Choice| -> Result<Summary, String> {
        let mut command = std::process::Command::new(&exe);
        command.env(VARIABLE, choice.name()).args([
            "--summary-only",
            "--steps",
            &args.steps.to_string(),
            "--batch",
            &args.batch.to_string(),
            "--hidden",
            &args.hidden.to_string(),
            "--layers",
            &args.layers.to_string(),
            "--checkpoint-every",
            &args.checkpoint_every.to_string(),
            "--lr",
            &args.lr.to_string(),
            "--seed",
            &args.seed.to_string(),
            "--threads",
            &args.threads().to_string(),
        ]);
        if let Some(budget) = args.budget {
            command.args(["--budget", &budget.to_string()]);
        }
        let output = command.output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        Summary::parse(&text).ok_or_else(|| {
            format!(
                "the {} run failed: {}",
                choice.name(),
                String::from_utf8_lossy(&output.stderr)
                    .trim()
                    .trim_start_matches("error: ")
            )
        })
    };
    println!(
        "running the same training ({} threads, {} steps) on ferropool, on Vec<f32> with glibc, and on Vec<f32> with mimalloc...",
        args.threads(),
        args.steps
    );
    let runs = [
        run_child(Choice::Pool)?,
        run_child(Choice::Glibc)?,
        run_child(Choice::Mimalloc)?,
    ];
    let [pool, glibc, mimalloc] = &runs;
    let row = |name: &str, cells: [String; 3], note: String| {
        println!(
            "| {name:<30} | {:>14} | {:>14} | {:>14} | {note} |",
            cells[0], cells[1], cells[2]
        );
    };
    println!();
    println!(
        "| {:<30} | {:>14} | {:>14} | {:>14} | ferropool vs glibc, mimalloc |",
        "", "ferropool", "Vec<f32> glibc", "Vec<f32> mimalloc"
    );
    println!("|{:-<32}|{:->16}|{:->16}|{:->16}|------|", "", "", "", "");
    let each = |f: &dyn Fn(&Summary) -> String| [f(pool), f(glibc), f(mimalloc)];
    row(
        "steps/s",
        each(&|s| format!("{:.2}", s.steps_per_s)),
        format!(
            "{:.2}x, {:.2}x",
            pool.steps_per_s / glibc.steps_per_s,
            pool.steps_per_s / mimalloc.steps_per_s
        ),
    );
    row(
        "minor page faults per step",
        each(&|s| format!("{:.1}", s.faults_per_step)),
        String::new(),
    );
    row(
        "allocator calls per step",
        each(&|s| format!("{:.1}", s.allocs_per_step)),
        String::new(),
    );
    row(
        "peak RSS",
        each(&|s| mib(s.peak_rss)),
        format!(
            "{:.2}x, {:.2}x",
            pool.peak_rss as f64 / glibc.peak_rss as f64,
            pool.peak_rss as f64 / mimalloc.peak_rss as f64
        ),
    );
    row(
        "loss, first -> last",
        each(&|s| format!("{:.3} -> {:.3}", s.first_loss, s.last_loss)),
        String::new(),
    );
    println!(
        "(steady state: the second half of the steps. Allocator calls: calls that reach glibc or mimalloc; for ferropool, those below its front end's 4 KiB threshold plus the pool's own calls to the system.)"
    );
    Ok(())
}
