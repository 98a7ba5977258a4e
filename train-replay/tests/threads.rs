//! The thread count changes neither the numbers nor the memory: the same losses to the bit at
//! 1, 2, 3 and 8 threads, and no copy of the weight gradients per thread (each thread used to
//! keep one for its rows, summed after the backward pass: the losses moved with the thread
//! count and a step's memory grew with it).

mod common;

use common::{succeeded, train_replay};
use train_replay::measure::Summary;

/// A run of `model` at `threads` threads, with `extra`; its summary.
fn run(model: &[&str], threads: usize, extra: &[&str]) -> Summary {
    let threads = threads.to_string();
    let args = [model, &["--threads", &threads, "--json"], extra].concat();
    let stdout = succeeded(&train_replay(&args), &args);
    Summary::parse(&stdout).unwrap_or_else(|| panic!("no summary in {stdout}"))
}

/// Rows that fill two of the kernels' 128-row blocks and part of a third; three steps, so
/// the first two updates feed the losses.
const MODEL: &[&str] = &[
    "--batch", "300", "--model", "mlp", "--hidden", "96", "--layers", "4", "--steps", "3",
];

#[test]
fn the_losses_are_the_same_bits_at_every_thread_count() {
    for keep in [
        &["--checkpoint-every", "2"][..],
        &["--checkpoint-every", "1"],
        &["--budget", "1GiB"], // fitted to the budget: every input kept as a value
    ] {
        let one = run(MODEL, 1, keep);
        for threads in [2, 3, 8] {
            let other = run(MODEL, threads, keep);
            assert_eq!(
                (
                    one.first_loss.to_bits(),
                    one.last_loss.to_bits(),
                    one.params_digest
                ),
                (
                    other.first_loss.to_bits(),
                    other.last_loss.to_bits(),
                    other.params_digest
                ),
                "{keep:?} at 1 and {threads} threads:\n{one:?}\n{other:?}"
            );
        }
    }
}

/// Wide layers, so that a copy of the weight gradients (4.9 MiB) outweighs what each thread
/// keeps whatever the model (the GEMM's packing buffer, the size of a core's L2 cache).
const WIDE: &[&str] = &[
    "--batch", "64", "--model", "mlp", "--hidden", "768", "--layers", "3", "--steps", "2",
];

#[test]
fn a_step_holds_one_copy_of_the_gradients_at_any_thread_count() {
    let gradients = (128 * 768 + 2 * 768 * 768 + 768 * 10) * 4;
    let one = run(WIDE, 1, &["--checkpoint-every", "1"]);
    let eight = run(WIDE, 8, &["--checkpoint-every", "1"]);
    let (one_live, eight_live) = (
        one.peak_live_bytes.expect("the pool's figures"),
        eight.peak_live_bytes.expect("the pool's figures"),
    );
    // A copy per thread would add 7 copies; a packing buffer of up to 2 MiB per thread, 14
    // MiB: the growth stays under 3 copies.
    assert!(
        eight_live < one_live + 3 * gradients,
        "peak live {one_live} at 1 thread, {eight_live} at 8: a copy of the gradients is \
         {gradients}"
    );
}

/// The GPT across more than one block of every kernel: 320 rows (two of the fused layers'
/// 256-row blocks, ten of the cross-entropy's 32-row tasks), a context of 80 (two of the
/// attention's 64-row query blocks in each sequence), the head in chunks of 64 rows; the
/// same losses to the bit at 1, 2 and 32 threads, keeping everything or every block's input.
#[test]
fn the_gpts_losses_are_the_same_bits_at_32_threads_over_several_blocks() {
    let gpt = [
        "--model",
        "gpt",
        "--context",
        "80",
        "--batch",
        "4",
        "--width",
        "32",
        "--heads",
        "4",
        "--layers",
        "2",
        "--steps",
        "3",
        "--head-rows",
        "64",
        "--sample",
        "0",
    ];
    for keep in [
        &["--checkpoint-every", "0"][..],
        &["--checkpoint-every", "1"],
    ] {
        let one = run(&gpt, 1, keep);
        assert_eq!(one.losses.len(), 3);
        for threads in [2, 32] {
            let other = run(&gpt, threads, keep);
            // The losses' bits and the parameters' (three steps' losses alone hide an ulp).
            let bits = |s: &Summary| {
                let losses: Vec<u32> = s.losses.iter().map(|l| l.to_bits()).collect();
                (losses, s.params_digest)
            };
            assert!(one.params_digest.is_some());
            assert_eq!(
                bits(&one),
                bits(&other),
                "{keep:?} at 1 and {threads} threads"
            );
        }
    }
}
