//! Runs each binary of this package, one process per global allocator, and fails with what
//! ended it: a failed check (its message) or a signal (an illegal instruction is the
//! optimiser's verdict that every path of the program is undefined behaviour).
//! `scripts/release_alloc.sh` runs these tests on release builds.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// Runs `binary` with `environment` and checks that it completed every pattern.
fn completes(binary: &str, environment: &[(&str, &str)], name: &str) {
    let output = Command::new(binary)
        .envs(environment.iter().copied())
        .output()
        .unwrap_or_else(|error| panic!("{binary} did not start: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if let Some(signal) = output.status.signal() {
        let what = match signal {
            4 => " (SIGILL: the optimiser found undefined behaviour on every path)",
            6 => " (SIGABRT)",
            11 => " (SIGSEGV)",
            _ => "",
        };
        panic!("{name}: killed by signal {signal}{what}\n{stdout}{stderr}");
    }
    assert!(
        output.status.success(),
        "{name}: {}\n{stdout}{stderr}",
        output.status
    );
    assert!(
        stdout.contains(&format!("release-check {name}: ok")),
        "{name} did not finish its patterns:\n{stdout}{stderr}"
    );
}

#[test]
fn the_pool_over_the_system_allocator() {
    completes(env!("CARGO_BIN_EXE_pool"), &[], "pool");
}

#[test]
fn the_pool_over_mimalloc_from_4_kib() {
    completes(
        env!("CARGO_BIN_EXE_pool_mimalloc"),
        &[],
        "pool over mimalloc",
    );
}

/// What the main job and `runtime-bench` install, under each choice it offers.
#[test]
fn the_chosen_allocator_under_every_choice() {
    for name in ["pool", "pool-mimalloc", "glibc", "mimalloc"] {
        completes(
            env!("CARGO_BIN_EXE_chosen"),
            &[("RELEASE_CHECK_ALLOCATOR", name)],
            name,
        );
    }
}
