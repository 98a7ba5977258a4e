//! What a run keeps outside the training's pool, and the share of `--budget` set aside for
//! it: the matrix products' packed panel (one, shared by all the threads: see
//! [`tile`](crate::kernels::tile)), each thread's tile of the products on its stack, the
//! attention's scratch of each task that runs at once, the bias gradients' partial sums, and the small allocations of the
//! process. Those come and go as the threads run, so they stay out of the training's pool
//! (whose requests come in the model's order at any thread count, which makes its least
//! budget exact); but a budget a user sets to the container's memory must bound them too. So
//! the job bounds them from the shapes and the thread count, gives the training's pool what
//! is left of the budget, and names a least budget that includes them.

use crate::args::{Args, ModelKind};
use crate::kernels::attention::Heads;
use crate::kernels::gemm::ROW_BLOCK;
use crate::kernels::tile::{panel_bytes, KC, MR, NR};

const MIB: u64 = 1 << 20;

/// For the process whatever the threads: the small allocations (retained values, chain
/// nodes, groups), the front end's own records, the text and the batches' tokens.
const PROCESS: u64 = 4 * MIB;

/// A thread's part of a product, on its stack: a sliver of the left operand and the same
/// rows after their prologue (each `MR x KC`), and an edge tile (`MR x NR`).
const TILE: u64 = ((2 * MR * KC + MR * NR) * 4) as u64;

/// The bytes a run of `args` sets aside for what stays outside the training's pool, in whole
/// MiB. Per thread: the products' tile on its stack (49.5 KiB). For the GPT, per attention
/// task that runs at once (as many as the threads, at most [`Heads::tasks`]: a small
/// attention runs on fewer), a task's scratch (a block of each operand, a function of the
/// head's size alone). For the process, once: the products' packed panel (at most `KP x
/// NC` of the right operand, 2 MiB, whatever the threads: one product runs at a time and
/// its threads share its panel), the bias gradients' partial sums (a row of the widest
/// layer per block of [`ROW_BLOCK`] rows), and 4 MiB.
pub fn reserve(args: &Args) -> u64 {
    let threads = args.threads() as u64;
    let f32s = |elements: usize| (elements as u64).saturating_mul(4);
    // The largest panel a product packs (its depth and output width), the attention's
    // scratch, and the bias gradients' partial sums.
    let (panel, scratch, sums) = match args.model {
        ModelKind::Gpt => {
            let (c, rows) = (args.width, args.batch.saturating_mul(args.context));
            let c4 = c.saturating_mul(4);
            let heads = Heads {
                batch: args.batch,
                seq: args.context,
                heads: args.heads,
                size: args.width / args.heads.max(1),
            };
            // The deepest product is a weight gradient (`rows` deep); the widest, the
            // logits against the tied embedding (`vocab` wide) or the `c x 4c` layer.
            let panel = panel_bytes(rows.max(c4), args.vocab().max(c4));
            let sums = rows.div_ceil(ROW_BLOCK).saturating_mul(c4);
            let tasks = threads.min(heads.tasks() as u64);
            let scratch = f32s(heads.scratch_len()).saturating_mul(tasks);
            (panel, scratch, f32s(sums))
        }
        ModelKind::Mlp => {
            let hidden = args.hidden.max(crate::model::mlp::INPUT);
            let panel = panel_bytes(args.batch.max(hidden), hidden);
            let sums = args.batch.div_ceil(ROW_BLOCK).saturating_mul(hidden);
            (panel, 0, f32s(sums))
        }
    };
    threads
        .saturating_mul(TILE)
        .saturating_add(scratch)
        .saturating_add(panel)
        .saturating_add(sums)
        .saturating_add(PROCESS)
        .div_ceil(MIB)
        .saturating_mul(MIB)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(line: &str) -> Args {
        crate::args::Cli::parse_from(format!("train-replay {line}").split_whitespace()).train
    }

    #[test]
    fn the_reserve_grows_with_the_threads_by_a_tile_and_the_scratch_in_whole_mib() {
        let two = reserve(&args("--threads 2"));
        let eight = reserve(&args("--threads 8"));
        assert_eq!(two % MIB, 0);
        assert!(eight >= two, "{two} {eight}");
        assert!(reserve(&args("--threads 2 --width 512")) > two);
        // Pairs of context 256 and head 32 are a task each (128 of them): every thread
        // holds a tile and an attention task's scratch (104.5 KiB).
        let gpt = "--context 256 --width 256 --heads 8 --batch 16";
        let (one, many) = (
            reserve(&args(&format!("--threads 1 {gpt}"))),
            reserve(&args(&format!("--threads 32 {gpt}"))),
        );
        let task = 4 * Heads {
            batch: 16,
            seq: 256,
            heads: 8,
            size: 32,
        }
        .scratch_len() as u64;
        assert!(
            many - one >= (31 * (TILE + task)) / MIB * MIB,
            "{one} {many}"
        );
        // Pairs of context 64 are small: 16 to a task, two tasks for 16 x 2 of them, so 32
        // threads add their tiles and one more task's scratch.
        let narrow = "--layers 16 --width 64 --heads 2";
        let (one, many) = (
            reserve(&args(&format!("--threads 1 {narrow}"))),
            reserve(&args(&format!("--threads 32 {narrow}"))),
        );
        assert!(many - one <= 2 * MIB, "{one} {many}");
        assert!(reserve(&args("--model mlp --threads 2")) >= PROCESS + 2 * TILE);
        // The MLP keeps no scratch besides its tile: 32 threads cost 2 MiB at most more.
        let (one, many) = (
            reserve(&args("--model mlp --threads 1")),
            reserve(&args("--model mlp --threads 32")),
        );
        assert!(many - one <= 2 * MIB, "{one} {many}");
        // GPT-2's head (147 MiB) is packed a panel at a time, shared by the threads: at GPT-2
        // small's shape one thread sets aside the panel, its tile and an attention task's scratch
        // (a block of each operand at a head of 64, 176.5 KiB), the sums and the process's
        // 4 MiB; 32 threads, 31 more tiles and scratches (6.8 MiB).
        let small = "--vocab 50257 --width 768 --heads 12 --context 1024 --batch 4";
        let one = reserve(&args(&format!("--threads 1 {small}")));
        assert!(one <= 8 * MIB, "{one}");
        let many = reserve(&args(&format!("--threads 32 {small}")));
        assert!(many <= 14 * MIB, "{many}");
        // The attention's scratch is the same at any context and batch.
        let (short, long) = (
            reserve(&args("--threads 32 --context 64 --batch 1")),
            reserve(&args("--threads 32 --context 1024 --batch 1")),
        );
        assert!(long - short <= MIB, "{short} {long}");
    }
}
