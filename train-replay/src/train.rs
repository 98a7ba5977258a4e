//! `train`: the training loop ([`train()`]), and a run on the pool as a user sees it: a
//! progress bar, the falling loss (and the GPT's validation loss and sample), the pool's
//! statistics, and on request the trace and the memory timeline.

use anyhow::anyhow;
use std::io::IsTerminal;
use std::time::Instant;

use ferropool::{BufferPool, PoolConfig, PoolEvent};

use crate::allocator;
use crate::args::{Args, Keep, ModelKind};
use crate::backend::Backend;
use crate::backend::{OverBudget, PoolBackend, VecBackend};
use crate::error::BadInput;
use crate::least::below_least;
use crate::measure::{peak_rss, Counters, Gauges, Summary, KEPT_LOSSES};
use crate::model::mlp::{CLASSES, INPUT};
use crate::outside;
use crate::plot::plot;
use crate::show::{bytes, table};

/// Runs the training on this process's allocator (see [`allocator`]); prints the summary
/// line only if `--json`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    args.check()?;
    if !allocator::choice().is_pool() {
        return run_baseline(args);
    }
    // The training's tensors, parameters and optimiser state come from a pool of their own,
    // with the budget if there is one. The process-wide pool, which the front end serves
    // every crate's allocations of 4 KiB and more from (the products' panel, the attention's
    // scratch), stays outside it: those bytes come and go as the threads run (a buffer of
    // the attention's scratch appears when a task first runs beside the others), and inside
    // the training's pool they would move the least a run needs with the threads' timing. They count
    // against --budget all the same: a share bounded from the shapes and the threads is set
    // aside for them (`outside`), and the training's pool gets the rest. The table reports
    // the share and that pool's peak. A tensor the budget refuses ends the run with an error.
    let outside = args.budget.map_or(0, |_| outside::reserve(args));
    if let Some(budget) = args.budget.filter(|&budget| budget < outside) {
        return Err(BadInput(format!(
            "--budget {:.2} is below the {:.2} set aside for what stays outside the training's \
             pool (the products' panel, the product tiles of {} thread(s) and the attention \
             scratch of the tasks they run at once, small allocations): give a budget above \
             it (a run below its least names that least, which includes the share), or fewer \
             --threads",
            bytes(budget),
            bytes(outside),
            args.threads()
        ))
        .into());
    }
    let pool = BufferPool::with_config(PoolConfig {
        budget: args.budget.map(|budget| budget.saturating_sub(outside)),
        ..PoolConfig::default()
    })?;
    let pool = &pool;
    // The ring comes from the system allocator, all of it now: it is resident for the whole
    // run, so it is taken out of the peak RSS below.
    let ring_bytes = if args.trace.is_some() || args.plot.is_some() {
        let events = trace_capacity(args);
        pool.enable_trace(events);
        (events * size_of::<PoolEvent>()).next_multiple_of(4096) as u64
    } else {
        0
    };
    let backend = PoolBackend { pool: pool.clone() };
    let mut progress = Progress::new(args);
    // Grown as steps end: `--steps` may be any count, and a run may be stopped early.
    let mut boundaries = Vec::new();
    let trained = train(&backend, args, Some(pool), |event| {
        if let Event::Step { step, .. } = event {
            boundaries.extend(pool.trace_now_ns());
            pool.trace_mark(step as u64);
        }
        progress.show(event);
    });
    progress.finish();
    let mut summary = match trained {
        Err(error) if args.keep() == Keep::Fitted && error.is::<OverBudget>() => {
            return Err(below_least(&backend, args, outside, &error));
        }
        Err(error) => match error.downcast_ref::<OverBudget>() {
            Some(over) => {
                let given = args.budget.unwrap_or(u64::MAX);
                return Err(anyhow!(over.message_of(given, outside)));
            }
            None => return Err(error),
        },
        Ok(summary) => summary,
    };
    summary.outside_reserve_bytes = args.budget.map(|_| outside);
    if args.json {
        println!("{}", summary.line());
        return Ok(());
    }
    let stats = pool.stats();
    println!("{}", summary_line(&summary));
    println!();
    println!("{}", memory_table(args, &summary, &stats, ring_bytes));
    println!();
    println!("(steady state after warm-up; small calls: below the front end's 4 KiB threshold, served by mimalloc under the pool; the pools' calls to the system: the maps, unmaps and purges of their own pages, the training's pool's and the front end's; the front end's pool also serves the training's pool its blocks under 32 KiB, which count in both)");
    // The exports come after every figure above was read (and from outside the pool).
    export(pool, args, ring_bytes, &boundaries)
}

/// The baselines: plain vectors from glibc or mimalloc. They have no pool to trace or to
/// budget: a trace or plot asked for would silently not be written.
fn run_baseline(args: &Args) -> anyhow::Result<()> {
    if args.trace.is_some() || args.plot.is_some() {
        return Err(anyhow::anyhow!(
            "--trace and --plot record the pool's events: this run uses {} ({} chooses)",
            allocator::choice().name(),
            allocator::VARIABLE
        ));
    }
    if args.budget.is_some() && !args.json {
        eprintln!(
            "note: --budget caps the pool; this run uses {} and ignores it",
            allocator::choice().name()
        );
    }
    let mut progress = Progress::new(args);
    let summary = train(&VecBackend, args, None, |event| progress.show(event))?;
    progress.finish();
    println!("{}", summary.line());
    Ok(())
}

/// The loss, first to last, and the speed.
fn summary_line(summary: &Summary) -> String {
    let val = summary
        .val_loss
        .map_or(String::new(), |v| format!(", validation loss {v:.4}"));
    format!(
        "loss {:.4} -> {:.4} ({}){val}, {:.2} steps/s",
        summary.first_loss,
        summary.last_loss,
        if summary.last_loss < summary.first_loss {
            "falling"
        } else {
            "NOT falling"
        },
        summary.steps_per_s
    )
}

/// What a run that is not `--json` shows as it goes: what trains, a progress bar on a
/// terminal (a line every few steps elsewhere), the validation losses and the sample.
struct Progress {
    quiet: bool,
    steps: usize,
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
}

impl Progress {
    fn new(args: &Args) -> Self {
        let quiet = args.json;
        if !quiet {
            announce(args);
        }
        Self {
            quiet,
            steps: args.steps,
            bar: (std::io::stderr().is_terminal() && !quiet).then(|| progress_bar(args.steps)),
            started: Instant::now(),
        }
    }

    fn show(&mut self, event: Event<'_>) {
        if self.quiet {
            return;
        }
        match (event, &self.bar) {
            (Event::Step { loss, .. }, Some(bar)) => {
                bar.set_message(format!("{loss:.4}"));
                bar.inc(1);
            }
            (Event::Step { step, loss }, None) => {
                if step % 10 == 0 || step + 1 == self.steps {
                    let rate = (step + 1) as f64 / self.started.elapsed().as_secs_f64();
                    println!("step {:>4}  loss {loss:.4}  {rate:.2} steps/s", step + 1);
                }
            }
            (Event::Validation { step, loss }, bar) => {
                let line = format!("step {step:>4}  validation loss {loss:.4}");
                match bar {
                    Some(bar) => bar.println(line),
                    None => println!("{line}"),
                }
            }
            (Event::Sample(text), bar) => {
                if let Some(bar) = bar {
                    bar.finish_and_clear();
                }
                let text = crate::show::printable(text);
                println!("\nsample (seeded, temperature 0.8):\n----\n{text}\n----");
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Prints what the run trains and how (the first line of a run that is not `--json`).
fn announce(args: &Args) {
    let budget = args
        .budget
        .map_or(String::new(), |b| format!(", budget {:.2}", bytes(b)));
    let model = match args.model {
        ModelKind::Gpt => format!(
            "GPT of {} blocks, width {}, {} heads, context {}, vocabulary {}, batch {} x {}",
            args.layers,
            args.width,
            args.heads,
            args.context,
            args.vocab(),
            args.batch,
            args.context
        ),
        ModelKind::Mlp => format!(
            "MLP {INPUT} -> {} x {} -> {CLASSES}, batch {}",
            args.layers, args.hidden, args.batch
        ),
    };
    let unit = if args.model == ModelKind::Gpt {
        "block"
    } else {
        "layer"
    };
    println!(
        "ferropool train-replay: {model}, {}, {} thread(s), {} steps{budget}",
        match args.keep() {
            Keep::Every(0) => "every tensor kept".to_owned(),
            Keep::Every(every) => format!("checkpoint every {every} {unit}(s)"),
            Keep::Fitted => "tensors kept as the budget allows".to_owned(),
        },
        args.threads(),
        args.steps
    );
}

/// The progress bar of a run of `steps` steps on a terminal.
fn progress_bar(steps: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} steps  {per_sec}  loss {msg}",
        )
        .expect("valid template"),
    );
    bar
}
/// The table of the pool's figures after a run (`ring_bytes`: the trace ring, resident for
/// the whole run, taken out of the peak RSS).
fn memory_table(
    args: &Args,
    summary: &Summary,
    stats: &ferropool::PoolStats,
    ring_bytes: u64,
) -> comfy_table::Table {
    let mut rows = pool_rows(summary, stats, ring_bytes);
    if args.keep() == Keep::Fitted {
        rows.extend(eviction_rows(summary));
    }
    if let Some(outside) = summary.outside_peak_bytes {
        rows.push((
            "the front end's pool, peak live (GEMM packing, scratch; outside the training's)",
            bytes(outside).to_string(),
        ));
    }
    if let Some(reserve) = summary.outside_reserve_bytes {
        rows.push((
            "of --budget, set aside for what stays outside the training's pool",
            bytes(reserve).to_string(),
        ));
    }
    let mut memory = table(["memory (pool)", "value"]);
    for (name, value) in rows {
        memory.add_row([name.to_owned(), value]);
    }
    memory
}

/// The rows every run on the pool shows: its peaks, its caches, the calls that reached an
/// allocator or the system, the faults and the peak RSS.
fn pool_rows(
    summary: &Summary,
    stats: &ferropool::PoolStats,
    ring_bytes: u64,
) -> Vec<(&'static str, String)> {
    let peak_rss = match ring_bytes {
        0 => bytes(summary.peak_rss).to_string(),
        _ => format!(
            "{} (without the trace ring's {})",
            bytes(summary.peak_rss.saturating_sub(ring_bytes)),
            bytes(ring_bytes)
        ),
    };
    let per_step = |v: Option<f64>| format!("{:.1}", v.unwrap_or(0.0));
    let live = stats.peak_in_use_bytes.max(1) as f64;
    vec![
        (
            "peak live bytes",
            bytes(stats.peak_in_use_bytes).to_string(),
        ),
        (
            "peak reserved bytes",
            bytes(stats.peak_reserved_bytes).to_string(),
        ),
        (
            "reserved / live at the peak",
            format!("{:.2}x", stats.peak_reserved_bytes as f64 / live),
        ),
        (
            "rounding waste (now)",
            bytes(stats.rounding_waste_bytes()).to_string(),
        ),
        (
            "thread-cache hit rate",
            format!("{:.1}%", stats.cache_hit_rate() * 100.0),
        ),
        (
            "calls to glibc per step",
            per_step(summary.glibc_calls_per_step),
        ),
        (
            "small calls to mimalloc per step",
            per_step(summary.mimalloc_calls_per_step),
        ),
        (
            "pool's calls to the system per step",
            per_step(summary.pool_system_calls_per_step),
        ),
        (
            "minor page faults per step",
            format!("{:.1}", summary.faults_per_step),
        ),
        ("peak RSS", peak_rss),
    ]
}

/// The rows of a run fitted to its budget: what the pool evicted and recomputed.
fn eviction_rows(summary: &Summary) -> Vec<(&'static str, String)> {
    let sizes: Vec<String> = summary
        .evictions_by_size
        .iter()
        .map(|(size, count)| format!("{count} x {}", bytes(*size)))
        .collect();
    let per_step = |v: Option<f64>| format!("{:.1}", v.unwrap_or(0.0));
    vec![
        (
            "tensors evicted per step",
            per_step(summary.evictions_per_step),
        ),
        (
            "evicted by the window step per step",
            per_step(summary.window_evictions_per_step),
        ),
        (
            "evictions over the run, by block size",
            match sizes.is_empty() {
                true => "none".to_owned(),
                false => sizes.join(", "),
            },
        ),
        (
            "recomputed per step",
            bytes(summary.recomputed_bytes_per_step.unwrap_or(0.0) as u64).to_string(),
        ),
        (
            "time recomputing",
            format!("{:.1}%", summary.recompute_share.unwrap_or(0.0) * 100.0),
        ),
        ("recomputed per step, by kind", by_kind(summary)),
    ]
}

/// What a step recomputed, kind by kind: `qkv 12.0 MiB in 31 ms, ...`.
fn by_kind(summary: &Summary) -> String {
    let kinds: Vec<String> = summary
        .recomputed_by_kind
        .iter()
        .map(|k| {
            let ms = k.seconds_per_step * 1e3;
            format!(
                "{} {} in {ms:.0} ms",
                k.kind,
                bytes(k.bytes_per_step as u64)
            )
        })
        .collect();
    match kinds.is_empty() {
        true => "none".to_owned(),
        false => kinds.join(", "),
    }
}

/// Writes the trace (`--trace`) and the memory timeline (`--plot`) of the run whose step
/// boundaries are `boundaries`.
fn export(
    pool: &BufferPool,
    args: &Args,
    ring_bytes: u64,
    boundaries: &[u64],
) -> anyhow::Result<()> {
    if let Some(path) = &args.trace {
        std::fs::File::create(path)
            .and_then(|file| pool.write_trace_json(file))
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        println!(
            "trace: {} events -> {} (open it in https://ui.perfetto.dev)",
            pool.trace_events().len(),
            path.display()
        );
    }
    if ring_bytes > 0 && pool.trace_events().len() >= trace_capacity(args) {
        println!(
            "(the trace ring was full: its oldest events were dropped, the trace and the plot start later than the run)"
        );
    }
    if let Some(path) = &args.plot {
        plot(pool, boundaries, path)?;
        println!("memory timeline -> {}", path.display());
    }
    Ok(())
}

/// Events the trace ring keeps for a run: about 2.5 times what one step records (10-13
/// events per layer and thread, measured), for every step, and the start-up's.
fn trace_capacity(args: &Args) -> usize {
    let per_step = (args.layers.saturating_add(2))
        .saturating_mul(args.threads().saturating_add(1))
        .saturating_mul(32);
    args.steps
        .saturating_mul(per_step)
        .saturating_add(4096)
        .min(PoolConfig::MAX_TRACE_EVENTS)
}

/// What the training loop tells its caller as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// Step `step` (from 0) ended with `loss`.
    Step {
        /// The step, from 0.
        step: usize,
        /// Its mean loss.
        loss: f32,
    },
    /// After `step` steps, the validation loss.
    Validation {
        /// Steps done.
        step: usize,
        /// The mean loss over the held-out batches.
        loss: f32,
    },
    /// The text the model generated at the end.
    Sample(&'a str),
}

/// Runs the training; `on_event` sees each step's loss, the validation losses (every
/// `--eval-every` steps and after the last, without `--json`; none with `--eval-every 0`) and
/// the sample. A loss that is not finite ends the run with an error. `pool` is the
/// backend's pool, if it has one: its statistics give the calls made to the system, the peaks
/// and the evictions. Steady state is the second half of the steps, each measured alone:
/// the evaluations between them are not counted.
pub fn train<B: Backend>(
    backend: &B,
    args: &Args,
    pool: Option<&BufferPool>,
    mut on_event: impl FnMut(Event<'_>) + Send,
) -> anyhow::Result<Summary> {
    let config = args.config()?;
    let workers = crate::model::workers(args.threads())?;
    // The whole run is driven from one worker: each step's tensors are then taken and given
    // back on the same thread, so where the pool places them (which a budget's evictions
    // read) is the same in every run and in the least's search, at any thread count.
    workers.install(|| {
        let gauges = Gauges::new(pool);
        let mut model = crate::model::build(backend, &workers, &config, false)?;
        // A weights file read or written whole came from outside the training's pool: the
        // process-wide pool gives that memory back rather than keep it for the run.
        allocator::give_back_cached();
        let baseline_rss = peak_rss();
        let warmup = (args.steps / 2).min(args.steps.saturating_sub(1));
        let mut summary = Summary {
            allocator: allocator::choice().name().into(),
            baseline_rss: Some(baseline_rss),
            ..Summary::default()
        };
        let evaluate = !args.json && args.eval_every > 0;
        let mut window = Counters::default();
        for step in 0..args.steps {
            let before = gauges.now();
            let loss = model.step()?;
            if !loss.is_finite() {
                return Err(anyhow::anyhow!(
                    "the loss of step {} is {loss}: the training diverged (lower --lr)",
                    step + 1
                ));
            }
            if step >= warmup {
                window += gauges.now() - before;
            }
            summary.first_loss = summary.losses.first().copied().unwrap_or(loss);
            summary.last_loss = loss;
            if summary.losses.len() < KEPT_LOSSES {
                summary.losses.push(loss);
            }
            on_event(Event::Step { step, loss });
            if evaluate && (step + 1) % args.eval_every == 0 && step + 1 < args.steps {
                if let Some(loss) = model.validate()? {
                    on_event(Event::Validation {
                        step: step + 1,
                        loss,
                    });
                }
            }
        }
        gauges.finish(&mut summary, &window, (args.steps - warmup).max(1) as f64);
        summary.params_digest = Some(model.digest());
        summary.val_loss = match args.eval_every {
            0 => None,
            _ => model.validate()?,
        };
        if let Some(loss) = summary.val_loss.filter(|_| evaluate) {
            on_event(Event::Validation {
                step: args.steps,
                loss,
            });
        }
        if !args.json && args.sample > 0 {
            if let Some(text) = model.sample(args.sample)? {
                on_event(Event::Sample(&text));
            }
        }
        Ok(summary)
    })
}
