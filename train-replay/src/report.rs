//! A run on the pool, as a user sees it: a progress bar, the falling loss, the pool's
//! statistics, and on request the trace and the memory timeline.

use anyhow::anyhow;
use std::io::IsTerminal;
use std::time::Instant;

use ferropool::{BufferPool, PoolAllocator, PoolConfig, PoolEvent};

use crate::allocator::{self, Choice};
use crate::args::Args;
use crate::backend::{PoolBackend, VecBackend};
use crate::measure::train;
use crate::model::{CLASSES, INPUT};
use crate::plot::plot;
use crate::show::{bytes, table};

/// Runs the training on this process's allocator (see [`allocator`]); prints the summary
/// line only if `--json`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if allocator::choice() != Choice::Pool {
        // The baselines: plain vectors from glibc or mimalloc.
        let summary = train(&VecBackend, args, || 0, |_, _| {})?;
        println!("{}", summary.line());
        return Ok(());
    }
    // The process-wide pool: the front end serves every crate's allocations of 4 KiB and
    // more from it (GEMM packing buffers included) since the process started, and the
    // training's tensors come from it too. So the budget is this pool's: a tensor it refuses
    // ends the run with an error; the front end serves the other allocations past it from
    // the system (`PoolAllocator::fallback_allocations`).
    let pool = BufferPool::global();
    pool.set_budget(args.budget);
    // The ring comes from the system allocator, all of it now: it is resident for the whole
    // run, so it is taken out of the peak RSS below.
    let ring_bytes = if args.trace.is_some() || args.plot.is_some() {
        let events = trace_capacity(args);
        pool.enable_trace(events);
        (events * size_of::<PoolEvent>()).next_multiple_of(4096) as u64
    } else {
        0
    };
    let backend = PoolBackend { pool };
    let quiet = args.json;
    if !quiet {
        let budget = args
            .budget
            .map_or(String::new(), |b| format!(", budget {:.2}", bytes(b)));
        println!(
            "ferropool train-replay: MLP {INPUT} -> {} x {} -> {CLASSES}, batch {}, checkpoint every {} layer(s), {} thread(s), {} steps{budget}",
            args.layers,
            args.hidden,
            args.batch,
            args.checkpoint_every,
            args.threads(),
            args.steps
        );
    }
    let bar = (std::io::stderr().is_terminal() && !quiet).then(|| {
        let bar = indicatif::ProgressBar::new(args.steps as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} steps  {per_sec}  loss {msg}",
            )
            .expect("valid template"),
        );
        bar
    });
    let mut boundaries = Vec::with_capacity(args.steps);
    let started = Instant::now();
    // The pool's calls to the system, and the requests past its budget that went there.
    let system_calls = || pool.stats().system_allocations + PoolAllocator::fallback_allocations();
    let summary = train(&backend, args, system_calls, |step, loss| {
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
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
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
    if args.budget.is_some() {
        rows.push((
            "allocations past the budget (glibc)",
            PoolAllocator::fallback_allocations().to_string(),
        ));
    }
    let mut memory = table(["memory (pool)", "value"]);
    for (name, value) in rows {
        memory.add_row([name.to_owned(), value]);
    }
    println!("{memory}");
    println!();
    println!("(steady state after warm-up; small calls: below the front end's 4 KiB threshold, served by mimalloc under the pool; the pool's calls to the system: its reservations from glibc, and the requests past its budget, which its fallback, mimalloc, serves)");
    // The exports come after every figure above was read (and from outside the pool).
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
        plot(pool, &boundaries, path)?;
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
