//! The command line refuses bad values before training: exit code 2 (clap's, for a command
//! line it refused) and a message that names the flag and says what it accepts. (A batch or
//! a hidden width of 0 panicked, 0 steps printed a meaningless rate, 0 threads and a
//! checkpoint every 0 layers silently became 1, a budget took whole binary units only, and
//! `--plot x.png` wrote SVG into a `.png`.)

mod common;

use common::train_replay;

/// `flag=value` is refused with exit code 2 and a message naming `flag` and holding each of
/// `allowed`. (The rest of the command line is a tiny run, so that a value taken by mistake
/// ends soon.)
fn refused(flag: &str, value: &str, allowed: &[&str]) {
    let tiny = [
        ("--model", "mlp"),
        ("--steps", "1"),
        ("--batch", "8"),
        ("--hidden", "8"),
        ("--layers", "1"),
    ];
    let mut args = vec![format!("{flag}={value}")];
    for (name, count) in tiny.into_iter().filter(|(name, _)| *name != flag) {
        args.extend([name.to_owned(), count.to_owned()]);
    }
    let out = train_replay(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{flag}={value} should be refused with exit code 2, got {:?}:\n{stderr}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains(flag),
        "{flag}={value}: no {flag:?} in {stderr}"
    );
    for text in allowed {
        assert!(
            stderr.contains(text),
            "{flag}={value}: no {text:?} in {stderr}"
        );
    }
}

#[test]
fn counts_of_zero_are_refused() {
    for flag in ["--steps", "--batch", "--hidden", "--layers", "--threads"] {
        refused(flag, "0", &["at least 1"]);
        refused(flag, "many", &["at least 1"]);
    }
    // 0 keeps every tensor the backward pass reads.
    refused("--checkpoint-every", "many", &["whole number"]);
}

#[test]
fn a_learning_rate_must_be_finite_and_above_zero() {
    for value in ["0", "-1e-3", "nan", "inf"] {
        refused("--lr", value, &["above 0"]);
    }
}

#[test]
fn a_budget_that_is_not_a_byte_count_is_refused_with_the_units() {
    for value in ["lots", "10XB", "1.2.3MiB", "-5MiB", "0", "0MiB", "20EiB"] {
        refused(
            "--budget",
            value,
            &["KiB", "MiB", "GiB", "kB", "MB", "GB", "powers of 1000"],
        );
    }
}

#[test]
fn a_plot_that_is_not_svg_is_refused() {
    let dir = std::env::temp_dir();
    for name in ["timeline.png", "timeline", "svg"] {
        refused("--plot", dir.join(name).to_str().unwrap(), &[".svg"]);
    }
}

#[test]
fn a_budget_takes_decimals_and_si_units() {
    // The header names the budget in binary units: 10 MB is 9.54 MiB, 1.5 GiB is 1.50 GiB.
    for (value, shown) in [
        ("10MB", "budget 9.54 MiB"),
        ("1.5GiB", "budget 1.50 GiB"),
        ("64MiB", "budget 64.00 MiB"),
    ] {
        let out = train_replay(&[
            "--model", "mlp", "--budget", value, "--steps", "1", "--batch", "8", "--hidden", "8",
            "--layers", "1",
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "--budget {value}: {:?}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(shown),
            "--budget {value}: no {shown:?} in\n{stdout}"
        );
    }
}

/// More threads than a thread pool may have is refused (rayon caps the pool silently, and
/// the job sized its per-thread state by the request: a capacity overflow).
#[test]
fn more_threads_than_a_pool_may_have_are_refused() {
    refused("--threads", "18446744073709551615", &["at most"]);
    refused("--threads", "65536", &["at most"]);
}

/// A one-step run of the smallest model on one thread.
const TINY: [&str; 12] = [
    "--model",
    "mlp",
    "--steps",
    "1",
    "--batch",
    "8",
    "--hidden",
    "8",
    "--layers",
    "1",
    "--threads",
    "1",
];

/// A checkpoint interval past the layer count keeps the first layer's input alone, as the
/// layer count itself does (the replay sized a scratch vector by it: a capacity overflow).
#[test]
fn a_checkpoint_interval_past_the_layers_trains() {
    let mut args = TINY.to_vec();
    args.extend(["--checkpoint-every", "18446744073709551615"]);
    let out = train_replay(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The baselines have no pool: a trace or plot asked of them is an error (it was silently
/// not written), and an allocator name the job does not know is refused (it ran the
/// default).
#[test]
fn pool_only_outputs_and_unknown_allocators_are_refused() {
    let trace =
        std::env::temp_dir().join(format!("train-replay-glibc-{}.json", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_train-replay"))
        .env("TRAIN_REPLAY_ALLOCATOR", "glibc")
        .args(TINY)
        .args(["--trace", trace.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--trace"), "{stderr}");
    assert!(!trace.exists());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_train-replay"))
        .env("TRAIN_REPLAY_ALLOCATOR", "jemalloc")
        .args(TINY)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("names no allocator"), "{stderr}");
}

/// `compare --torch` checks each PyTorch run's first losses against the job's and exits with
/// code 1 past `--agree`: here a stand-in for PyTorch that reports losses of its own (a
/// planted difference), and one that reports a NaN. (The stand-in is any program: `compare`
/// runs it with the script's path and the training's flags and reads its JSON line.)
#[test]
fn compare_fails_when_the_peer_disagrees() {
    let dir = std::env::temp_dir().join(format!("compare-agree-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, loss) in [("off.sh", "1.0"), ("nan.sh", "NaN")] {
        let fake = dir.join(name);
        // `NaN` is no JSON number: serde reads `null` as NaN for f32.
        let loss = if loss == "NaN" { "null" } else { loss };
        let line = format!(
            "{{\"allocator\":\"pytorch\",\"first_loss\":1.0,\"last_loss\":1.0,\
             \"steps_per_s\":1.0,\"faults_per_step\":0.0,\"peak_rss\":1,\
             \"losses\":[{loss},{loss}]}}"
        );
        std::fs::write(&fake, format!("#!/bin/sh\necho '{line}'\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = train_replay(&[
            "compare",
            "--context",
            "8",
            "--width",
            "8",
            "--heads",
            "2",
            "--layers",
            "1",
            "--batch",
            "2",
            "--steps",
            "2",
            "--torch",
            fake.to_str().unwrap(),
        ]);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(1), "{name}: {stdout}{stderr}");
        assert!(
            stderr.contains("disagree past --agree 1e-4") && stdout.contains("differ by at most"),
            "{name}: {stdout}{stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
