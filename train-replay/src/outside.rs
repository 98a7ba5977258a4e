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

/// The bytes a run of `args` sets aside for what stays outside the training's pool, in whole
/// MiB. Per thread: the packing slab, the packed weight of a fused linear layer (each thread
/// runs blocks of rows at once, each block a GEMM call that packs the weight for itself) and
/// the largest kernel scratch. For the process, once: what a GEMM call the threads share
/// packs (the head's products and the gradients' are such calls, one at a time: GPT-2's
/// tied head is packed once, not per thread), and 4 MiB. A packed operand counts for at most
/// what the `gemm` crate packs at once, an L3 cache's worth (147 MiB of GPT-2 small's head:
/// 32 MiB here).
pub fn reserve(args: &Args) -> u64 {
    let threads = args.threads() as u64;
    let packed = |elements: usize| (elements as u64).saturating_mul(4).min(l3_bytes());
    let f32s = |elements: usize| (elements as u64).saturating_mul(4);
    // The largest weight of a fused layer, the largest right operand of a shared call, and
    // the largest scratch.
    let (weight, shared, scratch) = match args.model {
        ModelKind::Gpt => {
            let (c, rows) = (args.width, args.batch.saturating_mul(args.context));
            let heads = Heads {
                batch: args.batch,
                seq: args.context,
                heads: args.heads,
                size: args.width / args.heads.max(1),
            };
            let weight = (4 * c).saturating_mul(c);
            // The logits' `h W^T` packs the tied embedding; a weight gradient `X^T g` packs
            // the gradient, at most `rows x 4 width`.
            let shared = args
                .vocab()
                .saturating_mul(c)
                .max(rows.saturating_mul(4 * c));
            let bias_sums = rows.div_ceil(ROW_BLOCK).saturating_mul(4 * c);
            let scratch = ROW_BLOCK
                .saturating_mul(4 * c)
                .max(heads.scratch_len())
                .max(bias_sums);
            (weight, shared, scratch)
        }
        ModelKind::Mlp => {
            let hidden = args.hidden.max(crate::model::mlp::INPUT);
            let weight = hidden.saturating_mul(hidden);
            let shared = weight.max(args.batch.saturating_mul(hidden));
            let scratch = args.batch.div_ceil(ROW_BLOCK).saturating_mul(hidden);
            (weight, shared, scratch)
        }
    };
    let per_thread = l2_bytes()
        .saturating_add(packed(weight))
        .saturating_add(f32s(scratch));
    threads
        .saturating_mul(per_thread)
        .saturating_add(packed(shared))
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
