//! `sweep`: the trade-off between memory and speed. The same training in child processes:
//! with each fixed `--checkpoint-every`, fitted to each budget of a list, and with `--torch`
//! in PyTorch with `torch.utils.checkpoint` at each fixed k (for the GPT, compiled with
//! `torch.compile` too); alternated run by run, medians in one table, and with `--plot` the
//! frontier as SVG.

use anyhow::{anyhow, Context};
use std::path::PathBuf;
use std::process::Command;

use ferropool_figures::spread;

use crate::allocator::{Choice, VARIABLE};
use crate::args::{Args, ModelKind, SweepArgs};
use crate::compare::{torch_command, RunFiles};
use crate::measure::Summary;
use crate::plot::Series;
use crate::show::{bytes, table};

/// The default budgets, as fractions of the peak live bytes of the run that keeps
/// everything, measured in the first round.
const DEFAULT_FRACTIONS: [f64; 6] = [0.5, 0.6, 0.7, 0.75, 0.8, 0.9];

/// One configuration of the sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Point {
    /// `--checkpoint-every k`, no budget.
    Every(usize),
    /// Fitted to this budget (bytes).
    Fitted(u64),
    /// PyTorch with `torch.utils.checkpoint` every k layers or blocks (0: none), compiled
    /// with `torch.compile` or not.
    Torch { every: usize, compiled: bool },
}

/// What the runs of one point gave: their summaries, or why one failed.
#[derive(Debug)]
struct Runs {
    point: Point,
    summaries: Vec<Summary>,
    failed: Option<String>,
}

impl Runs {
    fn new(point: Point) -> Self {
        Self {
            point,
            summaries: Vec::new(),
            failed: None,
        }
    }

    /// The median of `f` over the runs (`None`: no run completed).
    fn median(&self, f: impl Fn(&Summary) -> f64) -> Option<f64> {
        (!self.summaries.is_empty() && self.failed.is_none())
            .then(|| spread(self.summaries.iter().map(f).collect()).0)
    }
}

/// The sweep's fixed state: the program, the training, the PyTorch interpreter and the
/// files every GPT run starts from.
struct Sweep<'a> {
    exe: PathBuf,
    args: &'a SweepArgs,
    files: RunFiles,
    /// The `--checkpoint-every` that keeps everything: the reference of the budgets.
    reference: usize,
}

/// Runs the sweep and prints the table.
pub fn sweep(args: &SweepArgs) -> anyhow::Result<()> {
    let train = &args.train;
    train.check_all()?;
    if train.budget.is_some() || train.checkpoint_every.is_some() {
        return Err(anyhow!(
            "sweep chooses the budgets and --checkpoint-every itself: give it --budgets and \
             --every instead"
        ));
    }
    if train.trace.is_some() || train.json || train.save_init.is_some() || train.load.is_some() {
        return Err(anyhow!(
            "sweep writes no trace, JSON or weights: run `train` for those"
        ));
    }
    let sweep = Sweep {
        exe: std::env::current_exe().context("locating this program to run its children")?,
        args,
        files: RunFiles::write(train, "sweep")?,
        reference: match train.model {
            ModelKind::Gpt => 0,
            ModelKind::Mlp => 1,
        },
    };
    sweep.run()
}

impl Sweep<'_> {
    /// The points, their runs, the table and the plot.
    fn run(&self) -> anyhow::Result<()> {
        let (args, train) = (self.args, &self.args.train);
        let mut every = args.every.clone();
        if !every.contains(&self.reference) {
            every.insert(0, self.reference);
        }
        let torch: &[bool] = match (args.torch.is_some(), train.model) {
            (false, _) => &[],
            (true, ModelKind::Gpt) => &[false, true],
            (true, ModelKind::Mlp) => &[false],
        };
        let mut points: Vec<Runs> = every
            .iter()
            .map(|&k| Point::Every(k))
            .chain(args.budgets.iter().map(|&b| Point::Fitted(b)))
            .chain(torch.iter().flat_map(|&compiled| {
                every
                    .iter()
                    .map(move |&every| Point::Torch { every, compiled })
            }))
            .map(Runs::new)
            .collect();
        println!(
            "sweeping the training ({} layers, batch {}, {} threads, {} steps): {} fixed \
             --checkpoint-every, {} budgets{}, {} run(s) each, alternated...",
            train.layers,
            train.batch,
            train.threads(),
            train.steps,
            every.len(),
            match args.budgets.len() {
                0 => DEFAULT_FRACTIONS.len(),
                n => n,
            },
            if torch.is_empty() { "" } else { ", PyTorch" },
            args.runs
        );
        for round in 0..args.runs {
            self.round(round, &mut points)?;
        }
        let reference = reference_of(&points, self.reference)?;
        print_table(&points, &reference, args.runs);
        if let Some(path) = &train.plot {
            crate::plot::frontier(series(&points), path)?;
            println!("frontier -> {}", path.display());
        }
        Ok(())
    }

    /// One run of every point that has not failed; in the first round, once the run that
    /// keeps everything is measured, the default budgets join the points.
    fn round(&self, round: usize, points: &mut Vec<Runs>) -> anyhow::Result<()> {
        let mut i = 0;
        while i < points.len() {
            let runs = &mut points[i];
            if runs.failed.is_none() {
                match crate::child::run(&mut self.command(runs.point)) {
                    Ok(summary) => runs.summaries.push(summary),
                    Err(failed) => runs.failed = Some(failed.message),
                }
            }
            let reference = runs.point == Point::Every(self.reference);
            if round == 0 && reference && self.args.budgets.is_empty() {
                let live = reference_of(points, self.reference)?
                    .peak_live_bytes
                    .ok_or_else(|| anyhow!("the run that keeps everything has no pool"))?;
                let at = points
                    .iter()
                    .position(|r| !matches!(r.point, Point::Every(_)))
                    .unwrap_or(points.len());
                let fitted = DEFAULT_FRACTIONS
                    .iter()
                    .map(|f| Runs::new(Point::Fitted((live as f64 * f) as u64)));
                points.splice(at..at, fitted);
            }
            i += 1;
        }
        Ok(())
    }

    /// The child process that runs `point`.
    fn command(&self, point: Point) -> Command {
        let train = &self.args.train;
        if let Point::Torch { every, compiled } = point {
            let python = self
                .args
                .torch
                .as_deref()
                .expect("torch points need --torch");
            let train = Args {
                checkpoint_every: Some(every),
                ..train.clone()
            };
            return torch_command(python, &train, &self.files, compiled);
        }
        let mut command = Command::new(&self.exe);
        command
            .env(VARIABLE, Choice::PoolMimalloc.name())
            .args(["train", "--json"])
            .args(train.training_flags());
        if let Some(init) = &self.files.init {
            command.arg("--load").arg(init);
        }
        match point {
            Point::Every(k) => command.args(["--checkpoint-every", &k.to_string()]),
            Point::Fitted(budget) => command.args(["--budget", &budget.to_string()]),
            Point::Torch { .. } => unreachable!("returned above"),
        };
        command
    }
}

/// The first summary of the run that keeps everything; its error if it failed.
fn reference_of(points: &[Runs], every: usize) -> anyhow::Result<Summary> {
    let runs = points
        .iter()
        .find(|r| r.point == Point::Every(every))
        .ok_or_else(|| anyhow!("no run keeps everything"))?;
    match (&runs.failed, runs.summaries.first()) {
        (None, Some(summary)) => Ok(summary.clone()),
        (why, _) => Err(anyhow!(
            "the run that keeps everything failed: {}",
            why.as_deref().unwrap_or("no summary")
        )),
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

/// A point's name and budget, as the table shows them (`peak`: the reference's peak live).
fn label(point: Point, peak: f64) -> (String, String) {
    let mib = |v: f64| bytes(v as u64).to_string();
    match point {
        Point::Every(0) => ("ferropool, everything kept".into(), "-".into()),
        Point::Every(k) => (format!("ferropool, checkpoint every {k}"), "-".into()),
        Point::Fitted(b) => (
            "ferropool, fitted".into(),
            format!("{} ({:.0}%)", mib(b as f64), b as f64 / peak * 100.0),
        ),
        Point::Torch { every, compiled } => {
            let how = if compiled {
                "PyTorch compiled"
            } else {
                "PyTorch"
            };
            match every {
                0 => (format!("{how}, everything kept"), "-".into()),
                k => (format!("{how}, checkpoint every {k}"), "-".into()),
            }
        }
    }
}

/// A completed point's row of the table.
fn row(points: &[Runs], r: &Runs, name: String, budget: String) -> Vec<String> {
    let mib = |v: f64| bytes(v as u64).to_string();
    let cell = |v: Option<f64>, show: &dyn Fn(f64) -> String| v.map_or("-".into(), show);
    let figure = |f: fn(&Summary) -> Option<u64>| {
        r.median(|s| f(s).map_or(f64::NAN, |v| v as f64))
            .filter(|v| !v.is_nan())
    };
    let live = figure(|s| s.peak_live_bytes);
    let reserved = figure(|s| s.peak_reserved_bytes);
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
    vec![
        name,
        budget,
        cell(live, &mib),
        cell(reserved, &mib),
        match (live, reserved) {
            (Some(l), Some(r)) => format!("{:.2}x", r / l),
            _ => "-".into(),
        },
        // Every row's process, the same quantity for each: what a machine must hold; then
        // its RSS before the first step (for PyTorch mostly its interpreter) and the peak
        // above it.
        cell(r.median(|s| s.peak_rss as f64), &mib),
        cell(figure(|s| s.baseline_rss), &mib),
        cell(
            r.median(|s| match s.baseline_rss {
                Some(b) => s.peak_rss.saturating_sub(b) as f64,
                None => f64::NAN,
            })
            .filter(|v| !v.is_nan()),
            &mib,
        ),
        cell(steps, &|v| format!("{v:.2}")),
        match r.point {
            Point::Fitted(_) => cell(r.median(|s| s.recompute_share.unwrap_or(0.0)), &|v| {
                format!("{:.0}%", v * 100.0)
            }),
            _ => "-".into(),
        },
        best,
        ratio,
    ]
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
        "RSS at the first step",
        "peak RSS above it",
        "steps/s",
        "recomputing",
        "best fixed k under the budget",
        "fitted vs it",
    ]);
    let mut failures = Vec::new();
    for r in points {
        let (name, budget) = label(r.point, peak);
        match &r.failed {
            Some(why) => {
                failures.push(format!("{name} at {budget}: {why}"));
                figures.add_row([name, budget, format!("failed ({})", failures.len())]);
            }
            None => {
                figures.add_row(row(points, r, name, budget));
            }
        }
    }
    let identical = points
        .iter()
        .filter(|r| !matches!(r.point, Point::Torch { .. }))
        .flat_map(|r| &r.summaries)
        .all(|s| {
            (s.first_loss.to_bits(), s.last_loss.to_bits())
                == (
                    reference.first_loss.to_bits(),
                    reference.last_loss.to_bits(),
                )
        });
    println!();
    println!("{figures}");
    for (i, why) in failures.iter().enumerate() {
        println!("({}) {why}", i + 1);
    }
    println!();
    println!(
        "(steady state: the second half of the steps; medians of {runs} run(s), alternated. \
         Budget: % of the peak live of the run that keeps everything. Recomputing: the share \
         of the time spent recomputing evicted tensors; a fixed k replays the forward pass \
         of every block or layer but the kept ones. Losses of every ferropool run \
         bit-identical to the run that keeps everything: {})",
        if identical { "yes" } else { "NO" }
    );
}

/// The plotted series of `points`: steps/s against each process's peak RSS (the same
/// quantity for every series), the fitted runs as a line, the fixed ones as points labelled
/// by their k.
fn series(points: &[Runs]) -> Vec<Series> {
    use plotters::style::{BLUE, GREEN, MAGENTA, RED};
    let mut series = vec![
        Series {
            label: "ferropool, fitted to the budget",
            color: BLUE,
            line: true,
            points: vec![],
        },
        Series {
            label: "ferropool, fixed --checkpoint-every k",
            color: RED,
            line: false,
            points: vec![],
        },
        Series {
            label: "PyTorch + torch.utils.checkpoint",
            color: GREEN,
            line: false,
            points: vec![],
        },
        Series {
            label: "PyTorch compiled",
            color: MAGENTA,
            line: false,
            points: vec![],
        },
    ];
    for r in points {
        let (index, k) = match r.point {
            Point::Fitted(_) => (0, None),
            Point::Every(k) => (1, Some(k)),
            Point::Torch { every, compiled } => (2 + usize::from(compiled), Some(every)),
        };
        let memory = r.median(|s| s.peak_rss as f64);
        if let (Some(memory), Some(steps)) = (memory, r.median(|s| s.steps_per_s)) {
            let label = k.map(|k| format!("k={k}"));
            series[index]
                .points
                .push((memory / (1 << 20) as f64, steps, label));
        }
    }
    series[0].points.sort_by(|a, b| a.0.total_cmp(&b.0));
    series.retain(|s| !s.points.is_empty());
    series
}
