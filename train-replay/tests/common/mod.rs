//! What the main job's tests share: starting the built binary, and the small model most of
//! them train.
#![allow(dead_code)] // each test target uses a part

use std::process::{Command, Output};

/// A model small enough for a debug build to train in about a second: `--batch 256
/// --hidden 256 --layers 4 --threads 2`.
pub const SMALL_MODEL: &[&str] = &[
    "--batch",
    "256",
    "--model",
    "mlp",
    "--hidden",
    "256",
    "--layers",
    "4",
    "--threads",
    "2",
];

/// Runs the main job with `args`.
pub fn train_replay<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train-replay"))
        .args(args)
        .output()
        .expect("the main job starts")
}

/// Runs the main job on [`SMALL_MODEL`] for `steps` steps, with `extra` arguments.
pub fn train_small(steps: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--steps", steps];
    args.extend_from_slice(SMALL_MODEL);
    args.extend_from_slice(extra);
    train_replay(&args)
}

/// The standard output of a run that must have succeeded; else fails with `context`, the
/// exit status and both outputs.
pub fn succeeded(out: &Output, context: impl std::fmt::Debug) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{context:?}: {:?}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
