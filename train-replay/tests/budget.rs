//! A budget that cannot hold the run ends it with exit code 1 and one message that names the
//! budget and what the run needed, never a signal (it ended in SIGABRT from inside the GEMM,
//! then in exit code 2 with the pool's own advice to raise `PoolConfig::budget`).

mod common;

use common::{train_replay, train_small, SMALL_MODEL};

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
        &format!("the pool's budget of {budget} cannot hold this run"),
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
    over_budget(&["--budget", "10MiB", "--steps", "2"], "10.00 MiB");
}

#[test]
fn a_budget_that_runs_out_inside_a_step_is_an_error() {
    // Peak reserved without a budget: 8.4 MiB; 6 MiB runs out inside the first step, on the
    // worker threads, with GEMMs (whose packing buffers share the pool) running.
    let args = [&["--budget", "6MiB", "--steps", "2"], SMALL_MODEL].concat();
    over_budget(&args, "6.00 MiB");
}

#[test]
fn a_budget_that_holds_the_run_trains() {
    let out = train_small("2", &["--budget", "16MiB"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("budget 16.00 MiB"), "{stdout}");
    assert!(stdout.contains("allocations past the budget"), "{stdout}");
}

#[test]
fn the_comparison_reports_the_pool_run_over_budget() {
    let out = train_replay(&["compare", "--budget", "10MiB", "--steps", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("the pool run failed: the pool's budget of 10.00 MiB"),
        "{stderr}"
    );
}
