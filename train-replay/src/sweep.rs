//! `sweep`: the trade-off between memory and speed. The same training in child processes:
//! with each fixed `--checkpoint-every`, fitted to each budget of a list, and with `--torch`
//! in PyTorch with `torch.utils.checkpoint` at each fixed k; alternated run by run, medians
//! in one table, and with `--plot` the frontier as SVG.

use anyhow::{anyhow, Context};
use std::path::Path;
use std::process::Command;

use ferropool_figures::spread;

use crate::allocator::{Choice, VARIABLE};
use crate::args::{Args, SweepArgs};
use crate::compare::torch_command;
use crate::measure::Summary;
use crate::show::{bytes, table};

/// The default budgets, as fractions of the peak live bytes of the run that keeps every
/// layer's input (`--checkpoint-every 1`), measured in the first round.
const DEFAULT_FRACTIONS: [f64; 6] = [0.5, 0.6, 0.7, 0.75, 0.8, 0.9];

/// One configuration of the sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Point {
    /// `--checkpoint-every k`, no budget.
    Every(usize),
    /// Fitted to this budget (bytes).
    Fitted(u64),
    /// PyTorch with `torch.utils.checkpoint` every k layers.
    Torch(usize),
}

/// What the runs of one point gave: their summaries, or why one failed.
#[derive(Debug)]
struct Runs {
    point: Point,
    summaries: Vec<Summary>,
    failed: Option<String>,
}

impl Runs {
    /// The median of `f` over the runs (`None`: no run completed).
    fn median(&self, f: impl Fn(&Summary) -> f64) -> Option<f64> {
        (!self.summaries.is_empty() && self.failed.is_none())
            .then(|| spread(self.summaries.iter().map(f).collect()).0)
    }
}

/// Runs the sweep and prints the table.
pub fn sweep(args: &SweepArgs) -> anyhow::Result<()> {
    let train = &args.train;
    if train.budget.is_some() || train.checkpoint_every.is_some() {
        return Err(anyhow!(
            "sweep chooses the budgets and --checkpoint-every itself: give it --budgets and \
             --every instead"
        ));
    }
    if train.trace.is_some() || train.json {
        return Err(anyhow!(
            "sweep writes no trace or JSON: run `train` for those"
        ));
    }
    let exe = std::env::current_exe().context("locating this program to run its children")?;
    let mut every = args.every.clone();
    if !every.contains(&1) {
        every.insert(0, 1); // the reference: every input kept
    }
    let mut points: Vec<Runs> = every
        .iter()
        .map(|&k| Point::Every(k))
        .chain(args.budgets.iter().map(|&b| Point::Fitted(b)))
        .chain(
            args.torch
                .iter()
                .flat_map(|_| every.iter().map(|&k| Point::Torch(k))),
        )
        .map(|point| Runs {
            point,
            summaries: Vec::new(),
            failed: None,
        })
        .collect();
    println!(
        "sweeping the training ({} layers, batch {}, {} threads, {} steps): {} fixed \
         --checkpoint-every, {} budgets{}, {} run(s) each, alternated...",
        train.layers,
        train.batch,
        train.threads(),
        train.steps,
        every.len(),
        if args.budgets.is_empty() {
            DEFAULT_FRACTIONS.len()
        } else {
            args.budgets.len()
        },
        if args.torch.is_some() {
            ", PyTorch"
        } else {
            ""
        },
        args.runs
    );
    for round in 0..args.runs {
        let mut i = 0;
        while i < points.len() {
            let runs = &mut points[i];
            if runs.failed.is_none() {
                let mut command = match runs.point {
                    Point::Torch(k) => torch_command(
                        args.torch.as_deref().expect("torch points need --torch"),
                        &Args {
                            checkpoint_every: Some(k),
                            ..train.clone()
                        },
                    ),
                    point => child(&exe, train, point),
                };
                match run(&mut command) {
                    Ok(summary) => runs.summaries.push(summary),
                    Err(why) => runs.failed = Some(why),
                }
            }
            // The default budgets, once the first run that keeps every input is measured.
            if round == 0 && runs.point == Point::Every(1) && args.budgets.is_empty() {
                let reference = points[i]
                    .summaries
                    .first()
                    .and_then(|s| s.peak_live_bytes)
                    .ok_or_else(|| anyhow!("the run that keeps every input failed"))?;
                let at = points
                    .iter()
                    .position(|r| !matches!(r.point, Point::Every(_)))
                    .unwrap_or(points.len());
                let fitted = DEFAULT_FRACTIONS.iter().map(|f| Runs {
                    point: Point::Fitted((reference as f64 * f) as u64),
                    summaries: Vec::new(),
                    failed: None,
                });
                points.splice(at..at, fitted);
            }
            i += 1;
        }
    }
    let reference = points
        .iter()
        .find(|r| r.point == Point::Every(1))
        .and_then(|r| r.summaries.first().cloned())
        .ok_or_else(|| anyhow!("the run that keeps every input failed"))?;
    print_table(&points, &reference, args.runs);
    if let Some(path) = &train.plot {
        plot(&points, path)?;
        println!("frontier -> {}", path.display());
    }
    Ok(())
}

/// The child that trains at `point` on the pool.
fn child(exe: &Path, train: &Args, point: Point) -> Command {
    let mut command = Command::new(exe);
    command
        .env(VARIABLE, Choice::PoolMimalloc.name())
        .args(["train", "--json"]);
    for (flag, value) in [
        ("--steps", train.steps.to_string()),
        ("--batch", train.batch.to_string()),
        ("--hidden", train.hidden.to_string()),
        ("--layers", train.layers.to_string()),
        ("--threads", train.threads().to_string()),
        ("--lr", train.lr.to_string()),
        ("--seed", train.seed.to_string()),
    ] {
        command.args([flag, &value]);
    }
    match point {
        Point::Every(k) => command.args(["--checkpoint-every", &k.to_string()]),
        Point::Fitted(budget) => command.args(["--budget", &budget.to_string()]),
        Point::Torch(_) => unreachable!("PyTorch runs its own script"),
    };
    command
}

/// Runs one child and reads its JSON line; its error message if it failed.
fn run(command: &mut Command) -> Result<Summary, String> {
    let output = command
        .output()
        .map_err(|e| format!("did not start: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    match Summary::parse(&text) {
        Some(summary) if output.status.success() => Ok(summary),
        _ => Err(String::from_utf8_lossy(&output.stderr)
            .trim()
            .trim_start_matches("error: ")
            .to_owned()),
    }
}

/// The fastest fixed `--checkpoint-every` whose peak live fits under `budget`: (k, steps/s).
fn best_fixed(points: &[Runs], budget: u64) -> Option<(usize, f64)> {
    points
        .iter()
        .filter_map(|r| match r.point {
            Point::Every(k) => Some((k, r)),
            _ => None,
        })
        .filter(|(_, r)| {
            r.median(|s| s.peak_live_bytes.unwrap_or(u64::MAX) as f64)
                .is_some_and(|live| live <= budget as f64)
        })
        .filter_map(|(k, r)| Some((k, r.median(|s| s.steps_per_s)?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// The table: one row per point, medians over the runs.
fn print_table(points: &[Runs], reference: &Summary, runs: usize) {
    let peak = reference.peak_live_bytes.unwrap_or(1).max(1) as f64;
    let mut figures = table([
        "run",
        "budget",
        "peak live",
        "peak reserved",
        "reserved / live",
        "peak RSS",
        "steps/s",
        "recomputing",
        "best fixed k under the budget",
        "fitted vs it",
    ]);
    let mib = |v: f64| bytes(v as u64).to_string();
    let mut identical = true;
    let mut failures = Vec::new();
    for r in points {
        let (name, budget) = match r.point {
            Point::Every(k) => (format!("ferropool, checkpoint every {k}"), "-".to_owned()),
            Point::Fitted(b) => (
                "ferropool, fitted".to_owned(),
                format!("{} ({:.0}%)", mib(b as f64), b as f64 / peak * 100.0),
            ),
            Point::Torch(k) => (format!("PyTorch, checkpoint every {k}"), "-".to_owned()),
        };
        if let Some(why) = &r.failed {
            failures.push(format!("{name} at {budget}: {why}"));
            figures.add_row([name, budget, format!("failed ({})", failures.len())]);
            continue;
        }
        identical &= r.summaries.iter().all(|s| {
            matches!(r.point, Point::Torch(_))
                || (s.first_loss.to_bits(), s.last_loss.to_bits())
                    == (
                        reference.first_loss.to_bits(),
                        reference.last_loss.to_bits(),
                    )
        });
        let cell = |v: Option<f64>, show: &dyn Fn(f64) -> String| v.map_or("-".into(), show);
        let live = r.median(|s| s.peak_live_bytes.map_or(f64::NAN, |v| v as f64));
        let reserved = r.median(|s| s.peak_reserved_bytes.map_or(f64::NAN, |v| v as f64));
        let live = live.filter(|v| !v.is_nan());
        let reserved = reserved.filter(|v| !v.is_nan());
        let steps = r.median(|s| s.steps_per_s);
        let (best, ratio) = match (r.point, steps) {
            (Point::Fitted(b), Some(steps)) => match best_fixed(points, b) {
                Some((k, fixed)) => (
                    format!("{k} ({fixed:.2} steps/s)"),
                    format!("{:.2}x", steps / fixed),
                ),
                None => ("none fits".into(), "-".into()),
            },
            _ => ("-".into(), "-".into()),
        };
        figures.add_row([
            name,
            budget,
            cell(live, &mib),
            cell(reserved, &mib),
            match (live, reserved) {
                (Some(l), Some(r)) => format!("{:.2}x", r / l),
                _ => "-".into(),
            },
            // Every row's process, the same quantity for each: what a machine must hold.
            cell(r.median(|s| s.peak_rss as f64), &mib),
            cell(steps, &|v| format!("{v:.2}")),
            match r.point {
                Point::Fitted(_) => cell(r.median(|s| s.recompute_share.unwrap_or(0.0)), &|v| {
                    format!("{:.0}%", v * 100.0)
                }),
                _ => "-".into(),
            },
            best,
            ratio,
        ]);
    }
    println!();
    println!("{figures}");
    for (i, why) in failures.iter().enumerate() {
        println!("({}) {why}", i + 1);
    }
    println!();
    println!(
        "(steady state: the second half of the steps; medians of {runs} run(s), alternated. \
         Budget: % of the peak live of checkpoint every 1. Recomputing: the share of the \
         time spent recomputing evicted inputs; a fixed k replays (k - 1)/k of the forward \
         pass. Losses of every ferropool run bit-identical to checkpoint every 1: {})",
        if identical { "yes" } else { "NO" }
    );
}

/// Draws the frontier: steps/s against each process's peak RSS (the same quantity for every
/// series), the fitted runs as a line, the fixed ones as points.
fn plot(points: &[Runs], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let error = |e: &dyn std::fmt::Display| anyhow!("drawing the frontier: {e}");
    let to_mib = |v: f64| v / (1 << 20) as f64;
    /// A series: its label, its colour, its points (MiB, steps/s).
    type Series = (&'static str, RGBColor, Vec<(f64, f64)>);
    let mut series: [Series; 3] = [
        ("ferropool, fitted to the budget", BLUE, Vec::new()),
        ("ferropool, fixed --checkpoint-every", RED, Vec::new()),
        ("PyTorch + torch.utils.checkpoint", GREEN, Vec::new()),
    ];
    for r in points {
        let index = match r.point {
            Point::Fitted(_) => 0,
            Point::Every(_) => 1,
            Point::Torch(_) => 2,
        };
        let memory = r.median(|s| s.peak_rss as f64);
        if let (Some(memory), Some(steps)) = (memory, r.median(|s| s.steps_per_s)) {
            series[index].2.push((to_mib(memory), steps));
        }
    }
    series[0].2.sort_by(|a, b| a.0.total_cmp(&b.0));
    let all = series.iter().flat_map(|s| s.2.iter());
    let right = all.clone().map(|p| p.0).fold(1.0, f64::max) * 1.1;
    let top = all.map(|p| p.1).fold(0.1, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "memory against speed (train-replay sweep)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..right, 0.0..top)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .x_desc("peak resident memory of the process (MiB)")
        .y_desc("steps/s")
        .draw()
        .map_err(|e| error(&e))?;
    for (i, (label, color, data)) in series.into_iter().enumerate() {
        if data.is_empty() {
            continue;
        }
        if i == 0 {
            chart
                .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
                .map_err(|e| error(&e))?;
        }
        chart
            .draw_series(data.into_iter().map(|p| Circle::new(p, 5, color.filled())))
            .map_err(|e| error(&e))?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| error(&e))?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}
