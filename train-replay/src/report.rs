//! A run on the pool, as a user sees it: a progress bar, the falling loss, the pool's
//! statistics, and on request the trace and the memory timeline.

use anyhow::anyhow;
use std::io::IsTerminal;
use std::time::Instant;

use ferropool::{BufferPool, PoolConfig, PoolEvent};

use crate::allocator;
use crate::args::{Args, Keep};
use crate::backend::{OverBudget, PoolBackend, VecBackend};
use crate::measure::train;
use crate::model::Trainer;
use crate::model::{CLASSES, INPUT};
use crate::plot::plot;
use crate::show::{bytes, table};

/// Runs the training on this process's allocator (see [`allocator`]); prints the summary
/// line only if `--json`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if !allocator::choice().is_pool() {
        // The baselines: plain vectors from glibc or mimalloc. They have no pool to trace or
        // to budget: a trace or plot asked for would silently not be written.
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
        let summary = train(&VecBackend, args, None, |_, _| {})?;
        println!("{}", summary.line());
        return Ok(());
    }
    // The training's tensors, parameters and optimiser state come from a pool of their own,
    // with the budget if there is one. The process-wide pool, which the front end serves
    // every crate's allocations of 4 KiB and more from (the GEMM's packing buffers, the
    // scratch arena's chunks), stays outside it: those bytes come and go as the threads run
    // (a thread's packing buffer appears at its first GEMM), and inside the budget they
    // would move the least a run needs with the threads' timing. The table reports that
    // pool's peak apart. A tensor the budget refuses ends the run with an error.
    let pool = BufferPool::with_config(PoolConfig {
        budget: args.budget,
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
    let quiet = args.json;
    if !quiet {
        announce(args);
    }
    let bar = (std::io::stderr().is_terminal() && !quiet).then(|| progress_bar(args.steps));
    // Grown as steps end: `--steps` may be any count, and a run may be stopped early.
    let mut boundaries = Vec::new();
    let started = Instant::now();
    let trained = train(&backend, args, Some(pool), |step, loss| {
        boundaries.extend(pool.trace_now_ns());
        pool.trace_mark(step as u64);
        let rate = (step + 1) as f64 / started.elapsed().as_secs_f64();
        match &bar {
            Some(bar) => {
                bar.set_message(format!("{loss:.4}"));
                bar.inc(1);
            }
            None if !quiet && (step % 5 == 0 || step + 1 == args.steps) => {
                println!("step {:>4}  loss {loss:.4}  {rate:.2} steps/s", step + 1);
            }
            None => {}
        }
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let summary = match trained {
        Err(error) if args.keep() == Keep::Fitted && error.is::<OverBudget>() => {
            return Err(below_least(&backend, args, &error));
        }
        trained => trained?,
    };
    if quiet {
        println!("{}", summary.line());
        return Ok(());
    }
    let stats = pool.stats();
    println!(
        "loss {:.4} -> {:.4} ({}), {:.2} steps/s",
        summary.first_loss,
        summary.last_loss,
        if summary.last_loss < summary.first_loss {
            "falling"
        } else {
            "NOT falling"
        },
        summary.steps_per_s
    );
    println!();
    println!("{}", memory_table(args, &summary, &stats, ring_bytes));
    println!();
    println!("(steady state after warm-up; small calls: below the front end's 4 KiB threshold, served by mimalloc under the pool; the pools' calls to the system: the maps, unmaps and purges of their own pages, the training's pool's and the front end's; the front end's pool also serves the training's pool its blocks under 32 KiB, which count in both)");
    // The exports come after every figure above was read (and from outside the pool).
    export(pool, args, ring_bytes, &boundaries)
}

/// Prints what the run trains and how (the first line of a run that is not `--json`).
fn announce(args: &Args) {
    let budget = args
        .budget
        .map_or(String::new(), |b| format!(", budget {:.2}", bytes(b)));
    println!(
        "ferropool train-replay: MLP {INPUT} -> {} x {} -> {CLASSES}, batch {}, {}, {} thread(s), {} steps{budget}",
        args.layers,
        args.hidden,
        args.batch,
        match args.keep() {
            Keep::Every(every) => format!("checkpoint every {every} layer(s)"),
            Keep::Fitted => "inputs kept as the budget allows".to_owned(),
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
    summary: &crate::measure::Summary,
    stats: &ferropool::PoolStats,
    ring_bytes: u64,
) -> comfy_table::Table {
    let peak_rss = if ring_bytes == 0 {
        bytes(summary.peak_rss).to_string()
    } else {
        format!(
            "{} (without the trace ring's {})",
            bytes(summary.peak_rss.saturating_sub(ring_bytes)),
            bytes(ring_bytes)
        )
    };
    let mut rows: Vec<(&str, String)> = vec![
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
            format!(
                "{:.2}x",
                stats.peak_reserved_bytes as f64 / stats.peak_in_use_bytes.max(1) as f64
            ),
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
            format!("{:.1}", summary.glibc_calls_per_step.unwrap_or(0.0)),
        ),
        (
            "small calls to mimalloc per step",
            format!("{:.1}", summary.mimalloc_calls_per_step.unwrap_or(0.0)),
        ),
        (
            "pool's calls to the system per step",
            format!("{:.1}", summary.pool_system_calls_per_step.unwrap_or(0.0)),
        ),
        (
            "minor page faults per step",
            format!("{:.1}", summary.faults_per_step),
        ),
        ("peak RSS", peak_rss),
    ];
    if args.keep() == Keep::Fitted {
        rows.push((
            "inputs evicted per step",
            format!("{:.1}", summary.evictions_per_step.unwrap_or(0.0)),
        ));
        rows.push((
            "recomputed per step",
            bytes(summary.recomputed_bytes_per_step.unwrap_or(0.0) as u64).to_string(),
        ));
        rows.push((
            "time recomputing",
            format!("{:.1}%", summary.recompute_share.unwrap_or(0.0) * 100.0),
        ));
    }
    if let Some(outside) = summary.outside_peak_bytes {
        rows.push((
            "the front end's pool, peak live (GEMM packing, scratch; outside the budget)",
            bytes(outside).to_string(),
        ));
    }
    let mut memory = table(["memory (pool)", "value"]);
    for (name, value) in rows {
        memory.add_row([name.to_owned(), value]);
    }
    memory
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

/// The error of a run fitted to a budget that could not hold it even with every evictable
/// input evicted: one message that names the least budget the run needs, found by trying
/// steps of the same run at budgets between the one refused and what the run holds without
/// evicting anything.
fn below_least(backend: &PoolBackend, args: &Args, refused: &anyhow::Error) -> anyhow::Error {
    let pool = &backend.pool;
    let budget = args.budget.unwrap_or(u64::MAX);
    match least_budget(backend, args, budget) {
        Ok(least) => anyhow!(
            "the pool's budget of {:.2} is below the least this run needs, {:.2}: even with \
             every layer input that may be recomputed evicted, the tensors a step reads at once \
             do not fit. Raise --budget to at least {:.2}, or lower --batch or --hidden.",
            bytes(budget),
            bytes(least),
            bytes(least),
        ),
        // The search itself failed (a refusal that is not the budget's): the first error.
        Err(error) => {
            pool.set_budget(args.budget);
            anyhow!("{refused:#} (and finding the least budget failed: {error:#})")
        }
    }
}

/// Steps each try runs: the first step and one in steady state (every later step repeats it).
const TRY_STEPS: usize = 2;
/// The search's resolution.
const LEAST_STEP: u64 = 1 << 20;

/// The least budget (a whole number of MiB) at which [`TRY_STEPS`] dry steps of this run
/// complete (see [`Trainer::dry`]), by bisection between `refused` (which failed) and the
/// peak a run without eviction reserves. What a budget holds depends only on the order of
/// the step's requests, which a dry step keeps, so the run completes at the MiB named and
/// fails a MiB below. Leaves the pool trimmed and without a budget.
fn least_budget(backend: &PoolBackend, args: &Args, refused: u64) -> anyhow::Result<u64> {
    let pool = &backend.pool;
    // Whether `TRY_STEPS` steps of a fresh run complete under `budget`.
    let fits = |budget: Option<u64>| -> anyhow::Result<bool> {
        pool.trim();
        pool.set_budget(budget);
        let mut trial = args.clone();
        trial.budget = Some(budget.unwrap_or(u64::MAX));
        // The parameters and the optimiser's state come from the budget too.
        let outcome = Trainer::dry(backend, &trial).and_then(|mut trainer| {
            (0..TRY_STEPS).try_for_each(|_| trainer.step(args.batch).map(drop))
        });
        pool.trim();
        pool.set_budget(None);
        match outcome {
            Ok(()) => Ok(true),
            Err(error) if error.is::<OverBudget>() => Ok(false),
            Err(error) => Err(error),
        }
    };
    // Without a budget nothing is evicted, and that run's peak always fits: the pool's peak
    // over the process is at least that.
    fits(None)?;
    let unbounded = pool.stats().peak_reserved_bytes;
    // MiB that do not fit: at most `refused`, which failed (a budget need not be whole MiB).
    let mut low = refused / LEAST_STEP;
    let mut high = unbounded.div_ceil(LEAST_STEP).max(low + 1); // MiB that fit
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        // Saturating: a budget within a MiB of `u64::MAX` has no whole MiB above it.
        if fits(Some(middle.saturating_mul(LEAST_STEP)))? {
            high = middle;
        } else {
            low = middle;
        }
    }
    Ok(high.saturating_mul(LEAST_STEP))
}
