//! What a run keeps outside the training's pool, and the share of `--budget` set aside for
//! it: the `gemm` crate's packing state (a slab the size of the core's L2 cache on each thread
//! that runs a GEMM, and a packed operand per call in flight), the fused kernels' per-thread
//! scratch, and the small allocations of the process. Those come and go as the threads run,
//! so they stay out of the training's pool (whose requests come in the model's order at any
//! thread count, which makes its least budget exact); but a budget a user sets to the
//! container's memory must bound them too. So the job bounds them from the shapes and the
//! thread count, gives the training's pool what is left of the budget, and names a least
//! budget that includes them.

use crate::args::{Args, ModelKind};
use crate::kernels::attention::Heads;
use crate::kernels::gemm::ROW_BLOCK;

const MIB: u64 = 1 << 20;

/// For the process whatever the threads: the small allocations (retained values, chain
/// nodes, groups), the front end's own records, the text and the batches' tokens.
const PROCESS: u64 = 4 * MIB;

/// The bytes of the level-`level` cache of the first processor, as the kernel reports it.
fn cache_bytes(level: u32) -> Option<u64> {
    (0..8).find_map(|index| {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let found = std::fs::read_to_string(format!("{dir}/level")).ok()?;
        (found.trim() == level.to_string()).then_some(())?;
        let size = std::fs::read_to_string(format!("{dir}/size")).ok()?;
        let size = size.trim();
        let (number, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
        let number: u64 = number.parse().ok()?;
        match unit {
            "K" => Some(number << 10),
            "M" => Some(number << 20),
            _ => None,
        }
    })
}

/// The bytes of the L2 cache of the first processor (the size of the `gemm` crate's packing
/// slab on each thread); 2 MiB where the kernel does not say.
pub fn l2_bytes() -> u64 {
    cache_bytes(2).unwrap_or(2 * MIB)
}

/// The bytes of the last-level (L3) cache of the first processor: the most of a weight the
/// `gemm` crate packs at once (it packs the right operand a block of `kc x nc` at a time,
/// sized to fit the L3 cache); 32 MiB where the kernel does not say.
pub fn l3_bytes() -> u64 {
    cache_bytes(3).unwrap_or(32 * MIB)
}

/// The depth the `gemm` crate packs an operand to at most, here and on the machines it
/// chooses for (its `kc`: at least 512 where the depth allows, from the L1 cache's sets).
const PACKED_DEPTH: usize = 512;

/// The bytes the `gemm` crate packs of a right operand `depth x n` at once: a block of at most
/// [`PACKED_DEPTH`] of its depth and as many of its columns as the L3 cache holds.
fn packed(depth: usize, n: usize) -> u64 {
    (depth.min(PACKED_DEPTH) as u64)
        .saturating_mul(n as u64)
        .saturating_mul(4)
        .min(l3_bytes())
}

/// The bytes a run of `args` sets aside for what stays outside the training's pool, in whole
/// MiB. Per thread: the `gemm` crate's packing slab (an L2 cache's worth, each thread that
/// runs a GEMM keeps one) and the fused kernels' scratch (one buffer, grown to the largest
/// the thread used: a block of input rows, an attention pair's scores, partial sums). Per
/// fused call in flight (one per thread, at most one per block of rows): the packed weight
/// of a fused linear layer (each block of rows is a GEMM call that packs the weight for
/// itself). For the process, once: what a GEMM call the threads share packs (the head's
/// products, the input and weight gradients: one call at a time, so GPT-2's tied head is
/// packed once, not per thread), and 4 MiB. The `gemm` crate packs
/// at most `PACKED_DEPTH` (512) of an operand's depth at once, and at most an L3 cache's worth.
pub fn reserve(args: &Args) -> u64 {
    let threads = args.threads() as u64;
    let f32s = |elements: usize| (elements as u64).saturating_mul(4);
    // A fused layer's packed weight (per call in flight), a shared call's packed operand
    // (once), the largest scratch a thread keeps (per thread), and the rows a step's fused
    // layers cut into blocks.
    let (weight, shared, scratch, rows) = match args.model {
        ModelKind::Gpt => {
            let (c, rows) = (args.width, args.batch.saturating_mul(args.context));
            let c4 = c.saturating_mul(4);
            let heads = Heads {
                batch: args.batch,
                seq: args.context,
                heads: args.heads,
                size: args.width / args.heads.max(1),
            };
            // The fused layers: `c x 3c`, `c x c`, `c x 4c`, `4c x c`.
            let weight = packed(c, c4).max(packed(c4, c));
            // The shared calls: the logits against the tied embedding (`c x vocab`), the
            // input gradients `g W^T` (`4c x c` at most), the weight gradients `X^T g`
            // (`rows x 4c` at most).
            let shared = packed(c, args.vocab())
                .max(packed(c4, c))
                .max(packed(rows, c4));
            // One buffer a thread grows to the largest it used: a fused layer's block of
            // input rows, an attention pair's scratch, the bias gradients' partial sums.
            let scratch = ROW_BLOCK
                .saturating_mul(c4)
                .max(heads.scratch_len())
                .max(rows.div_ceil(ROW_BLOCK).saturating_mul(c4));
            (weight, shared, f32s(scratch), rows)
        }
        ModelKind::Mlp => {
            let hidden = args.hidden.max(crate::model::mlp::INPUT);
            let weight = packed(hidden, hidden);
            let shared = weight.max(packed(args.batch, hidden));
            let scratch = ROW_BLOCK
                .saturating_mul(hidden)
                .max(args.batch.div_ceil(ROW_BLOCK).saturating_mul(hidden));
            (weight, shared, f32s(scratch), args.batch)
        }
    };
    // At most one fused call per block of rows is in flight.
    let in_flight = threads.min(rows.div_ceil(ROW_BLOCK).max(1) as u64);
    threads
        .saturating_mul(l2_bytes().saturating_add(scratch))
        .saturating_add(in_flight.saturating_mul(weight))
        .saturating_add(shared)
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
    fn the_reserve_grows_with_the_threads_and_the_shapes_in_whole_mib() {
        let two = reserve(&args("--threads 2"));
        let eight = reserve(&args("--threads 8"));
        assert_eq!(two % MIB, 0);
        assert!(eight > two && eight - two >= 6 * l2_bytes());
        assert!(reserve(&args("--threads 2 --width 512")) > two);
        assert!(reserve(&args("--model mlp --threads 2")) >= PROCESS + 2 * l2_bytes());
        assert!(l2_bytes() >= 64 << 10);
        // GPT-2's head is packed by one call at a time, for at most what the GEMM packs at
        // once: counted once, whatever the threads.
        let small = "--vocab 50257 --width 768 --heads 12 --context 1024 --batch 4";
        let (two, eight) = (
            reserve(&args(&format!("--threads 2 {small}"))),
            reserve(&args(&format!("--threads 8 {small}"))),
        );
        let per_thread = (eight - two) / 6;
        assert!(per_thread < l2_bytes() + (16 << 20), "{per_thread}");
        assert!(two <= 2 * per_thread + l3_bytes() + PROCESS + MIB, "{two}");
    }
}
