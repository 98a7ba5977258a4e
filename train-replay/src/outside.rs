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

/// The bytes of the L2 cache of the first processor (the size of the `gemm` crate's packing
/// slab on each thread), as the kernel reports it; 2 MiB where it does not.
pub fn l2_bytes() -> u64 {
    (0..8)
        .find_map(|index| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
            let level = std::fs::read_to_string(format!("{dir}/level")).ok()?;
            (level.trim() == "2").then_some(())?;
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
        .unwrap_or(2 * MIB)
}

/// The bytes a run of `args` sets aside for what stays outside the training's pool, in whole
/// MiB: per thread, the packing slab, the largest packed weight and the largest kernel
/// scratch; for the process, 4 MiB.
pub fn reserve(args: &Args) -> u64 {
    let threads = args.threads() as u64;
    let f32s = |elements: usize| (elements as u64).saturating_mul(4);
    let (weight, scratch) = match args.model {
        ModelKind::Gpt => {
            let (c, rows) = (args.width, args.batch.saturating_mul(args.context));
            let heads = Heads {
                batch: args.batch,
                seq: args.context,
                heads: args.heads,
                size: args.width / args.heads.max(1),
            };
            let weight = (4 * c).saturating_mul(c).max(args.vocab.saturating_mul(c));
            let bias_sums = rows.div_ceil(ROW_BLOCK).saturating_mul(4 * c);
            let scratch = ROW_BLOCK
                .saturating_mul(4 * c)
                .max(heads.scratch_len())
                .max(bias_sums);
            (weight, scratch)
        }
        ModelKind::Mlp => {
            let hidden = args.hidden.max(crate::model::mlp::INPUT);
            let weight = hidden.saturating_mul(hidden);
            (
                weight,
                args.batch.div_ceil(ROW_BLOCK).saturating_mul(hidden),
            )
        }
    };
    let per_thread = l2_bytes()
        .saturating_add(f32s(weight))
        .saturating_add(f32s(scratch));
    threads
        .saturating_mul(per_thread)
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
    }
}
