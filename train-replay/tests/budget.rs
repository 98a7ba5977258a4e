//! A budget that cannot hold the run ends it with exit code 1 and one message that names the
//! budget and what the run needed, never a signal (it ended in SIGABRT from inside the GEMM,
//! then in exit code 2 with the pool's own advice to raise `PoolConfig::budget`). Without
//! `--checkpoint-every` the run fits itself to the budget: it completes at or above the least
//! it needs, with the losses of the run without a budget, and below it names that least.

mod common;

use common::{succeeded, train_replay, train_small, SMALL_MODEL};
use train_replay::measure::Summary;

/// The share of `--budget` a run of `args` (training flags) sets aside outside the training's
/// pool, in MiB: it follows the machine's caches, so the budgets below are given above it.
fn share_mib(args: &[&str]) -> u64 {
    use clap::Parser;
    let line = [&["train-replay"], args].concat();
    let cli = train_replay::args::Cli::parse_from(line);
    train_replay::outside::reserve(&cli.train) >> 20
}

/// The run fails with exit code 1 and one budget message.
fn over_budget(args: &[&str], budget: &str) {
    let out = train_replay(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            None,
            "{args:?} ended by a signal:\n{stderr}"
        );
    }
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?}: {:?}\n{stderr}",
        out.status
    );
    for text in [
        format!("--budget {budget} (").as_str(),
        "cannot hold this run",
        "tensor",
        "was refused with",
        "in use",
        "the run needed at least",
        "Raise --budget",
    ] {
        assert!(stderr.contains(text), "{args:?}: no {text:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one message: {stderr}"
    );
}

#[test]
fn a_budget_too_small_for_the_first_tensors_is_an_error() {
    // The default model: its parameters alone (15 MiB) are more than the budget.
    over_budget(
        &[
            "--budget",
            "10MiB",
            "--steps",
            "2",
            "--checkpoint-every",
            "2",
        ],
        "10.00 MiB",
    );
}

#[test]
fn a_budget_that_runs_out_inside_a_step_is_an_error() {
    // Peak reserved under a budget it never reaches: 4.6 MiB, 2.4 MiB of it the parameters
    // and Adam's moments; 4 MiB for the training's pool runs out inside the first step.
    let given = share_mib(SMALL_MODEL) + 4;
    let budget = format!("{given}MiB");
    let args = [
        &[
            "--budget",
            &budget,
            "--steps",
            "2",
            "--checkpoint-every",
            "2",
        ],
        SMALL_MODEL,
    ]
    .concat();
    over_budget(&args, &format!("{given}.00 MiB"));
}

#[test]
fn a_budget_that_holds_the_run_trains() {
    let stdout = succeeded(&train_small("2", &["--budget", "16MiB"]), "--budget 16MiB");
    assert!(stdout.contains("budget 16.00 MiB"), "{stdout}");
    assert!(
        stdout.contains("set aside for what stays outside the training's pool"),
        "{stdout}"
    );
}

#[test]
fn the_comparison_reports_the_pool_run_over_budget() {
    let out = train_replay(&["compare", "--budget", "10MiB", "--steps", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("the pool run failed: --budget 10.00 MiB (")
            && stderr.contains("set aside for what stays outside it"),
        "{stderr}"
    );
}

/// A model whose layer inputs (1 MiB each) are most of what a step holds: a budget under its
/// peak makes the pool evict some and recompute them.
const EVICTING_MODEL: &[&str] = &[
    "--batch",
    "1024",
    "--model",
    "mlp",
    "--hidden",
    "256",
    "--layers",
    "12",
    "--threads",
    "2",
    "--steps",
    "3",
    "--json",
];

/// A run of [`EVICTING_MODEL`] with `extra`, which completes; its summary.
fn fitted_run(extra: &[&str]) -> Summary {
    let stdout = succeeded(&train_replay(&[EVICTING_MODEL, extra].concat()), extra);
    Summary::parse(&stdout).unwrap_or_else(|| panic!("no summary in {stdout}"))
}

#[test]
fn a_fitted_run_evicts_recomputes_and_keeps_the_losses() {
    // Without a budget, every layer input kept: peak live 33-35 MiB; the least: about 24
    // MiB. The budget is set 1 MiB under what a fitted run holds at its peak with nothing
    // evicted, measured first under a budget it never reaches.
    let free = fitted_run(&["--checkpoint-every", "1"]);
    let roomy = fitted_run(&["--budget", "1GiB"]);
    assert_eq!(roomy.evictions_per_step, Some(0.0), "{roomy:?}");
    let budget_mib = (roomy.peak_live_bytes.unwrap() >> 20) - 1;
    let budget = budget_mib << 20;
    let fitted = fitted_run(&["--budget", &format!("{budget_mib}MiB")]);
    assert!(fitted.evictions_per_step.unwrap() > 0.0, "{fitted:?}");
    assert!(
        fitted.recomputed_bytes_per_step.unwrap() > 0.0,
        "{fitted:?}"
    );
    assert!(fitted.recompute_share.unwrap() > 0.0, "{fitted:?}");
    let layers = &fitted.recomputed_by_kind;
    assert_eq!(layers.len(), 1, "{fitted:?}");
    assert_eq!(layers[0].kind, "layer");
    assert_eq!(
        Some(layers[0].bytes_per_step),
        fitted.recomputed_bytes_per_step
    );
    let (live, reserved) = (
        fitted.peak_live_bytes.unwrap(),
        fitted.peak_reserved_bytes.unwrap(),
    );
    assert!(reserved <= budget, "{fitted:?}");
    assert!(live <= reserved, "{fitted:?}");
    assert_eq!(
        (fitted.first_loss.to_bits(), fitted.last_loss.to_bits()),
        (free.first_loss.to_bits(), free.last_loss.to_bits()),
        "{fitted:?}\n{free:?}"
    );
    assert_eq!(free.evictions_per_step, Some(0.0), "{free:?}");
}

#[test]
fn a_budget_below_the_least_a_fitted_run_needs_names_that_least() {
    // 1 MiB above the share set aside outside the training's pool (it follows the
    // machine's caches), so the training's pool gets 1 MiB.
    let roomy = fitted_run(&["--budget", "1GiB"]);
    let share = roomy
        .outside_reserve_bytes
        .expect("a fitted run reports its share")
        >> 20;
    let given = format!("{}MiB", share + 1);
    let out = train_replay(&[EVICTING_MODEL, &["--budget", &given]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}\n{stderr}", out.status);
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one message: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let prefix = "is below the least this run needs, ";
    assert!(
        stderr.contains(&format!("--budget {}.00 MiB (", share + 1)),
        "{stderr}"
    );
    let least = stderr
        .split_once(prefix)
        .and_then(|(_, rest)| rest.split_once(" MiB ("))
        .and_then(|(least, _)| least.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no least budget in whole MiB in {stderr}"));
    assert!(
        stderr.contains(&format!("Raise --budget to at least {least}MiB")),
        "{stderr}"
    );
    let least = least as f64;
    // What it names is enough, not more than the run without a budget holds, and exact: a
    // MiB less does not complete.
    assert!(
        least > (share + 1) as f64 && least <= 40.0 + share as f64,
        "{stderr}"
    );
    let budget = format!("{least}MiB");
    let fitted = fitted_run(&["--budget", &budget]);
    assert!(
        fitted.peak_reserved_bytes.unwrap() as f64 <= least * 1048576.0,
        "{fitted:?}"
    );
    let below = format!("{}MiB", least - 1.0);
    let out = train_replay(&[EVICTING_MODEL, &["--budget", &below]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{below}: {:?}\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains(&format!("below the least this run needs, {least} MiB (")),
        "{below}: {stderr}"
    );
}

/// A budget below the share set aside for what stays outside the training's pool is the
/// user's to mend: exit code 2, naming the share, not a search for a least it cannot reach.
#[test]
fn a_budget_below_the_share_set_aside_is_refused_naming_it() {
    let out = train_replay(&[EVICTING_MODEL, &["--budget", "1MiB"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("--budget 1.00 MiB is below the") && stderr.contains("set aside"),
        "{stderr}"
    );
}

#[test]
fn the_sweep_prints_every_point_and_draws_the_frontier() {
    let dir = std::env::temp_dir().join(format!("sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("frontier.svg");
    let svg_arg = svg.to_str().unwrap();
    // One budget that holds the run, one above the share set aside but below the least.
    let low = share_mib(EVICTING_MODEL) + 1;
    let budgets = format!("28MiB,{low}MiB");
    let out = train_replay(
        &[
            &[
                "sweep",
                "--runs",
                "1",
                "--every",
                "2",
                "--budgets",
                &budgets,
            ],
            &EVICTING_MODEL[..EVICTING_MODEL.len() - 1], // without --json
            &["--plot", svg_arg],
        ]
        .concat(),
    );
    let stdout = succeeded(&out, "sweep");
    let low_row = format!("| ferropool, fitted             | {low}.0 MiB");
    for row in [
        "| ferropool, checkpoint every 1 |", // the reference, though not asked for
        "| ferropool, checkpoint every 2 |",
        "| ferropool, fitted             | 28.0 MiB",
        low_row.as_str(),
        "failed (1)",
        "is below the least this run needs",
        "bit-identical to the run that keeps everything: yes",
    ] {
        assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    }
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(
        drawn.contains("<svg") && drawn.contains("fitted to the budget"),
        "{drawn}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
