//! Times the job's matrix products ([`train_replay::kernels::tile`]) against the `gemm` crate
//! on the shapes of a training step of the GPT at width 256, batch 16 x 256 (the forward
//! layers, the input gradients against a transposed weight, the weight gradients from a
//! transposed input), on 1 and 2 threads: each shape alternated between the two, the best of
//! 15 runs each. `cargo bench -p train-replay --bench products` (`-- 1` or `-- 2` for one
//! thread count).
use std::time::Instant;

use train_replay::kernels::tile::{Mat, Product, Prologue, Start};

const RUNS: usize = 15;

/// Elements whose low bits vary.
fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 9) as f32 / 8_388_608.0 - 0.5)
        .collect()
}

fn main() {
    let only: Option<usize> = std::env::args().skip(1).find_map(|a| a.parse().ok());
    // (m, k, n, a transposed, b transposed): a step's products, one layer's worth.
    let shapes = [
        (4096, 256, 768, false, false),
        (4096, 256, 1024, false, false),
        (4096, 1024, 256, false, false),
        (4096, 256, 256, false, false),
        (4096, 1024, 256, false, true),
        (4096, 256, 1024, false, true),
        (256, 4096, 1024, true, false),
        (1024, 4096, 256, true, false),
        (256, 4096, 768, true, false),
    ];
    for threads in [1, 2].into_iter().filter(|t| only.is_none_or(|o| o == *t)) {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        println!("{threads} thread(s): best of {RUNS}, alternated");
        let (mut ours_total, mut theirs_total) = (0.0, 0.0);
        for (m, k, n, at, bt) in shapes {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let mut c = vec![0.0f32; m * n];
            let a = if at {
                Mat::transposed(&a, m)
            } else {
                Mat::rows(&a, k)
            };
            let b = if bt {
                Mat::transposed(&b, k)
            } else {
                Mat::rows(&b, n)
            };
            let ours = |c: &mut [f32]| {
                let product = Product {
                    m,
                    k,
                    n,
                    a,
                    prologue: Prologue::Identity,
                    b,
                    start: Start::Zero,
                    relu: false,
                };
                // SAFETY: `c` is the `m x n` output, ours alone.
                unsafe { product.run(c.as_mut_ptr(), n, threads) }
            };
            let parallelism = if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            };
            let theirs = |c: &mut [f32]| {
                // SAFETY: the operands hold their shapes at these strides; `c` is ours alone.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        c.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.data.as_ptr(),
                        a.cs as isize,
                        a.rs as isize,
                        b.data.as_ptr(),
                        b.cs as isize,
                        b.rs as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        parallelism,
                    )
                }
            };
            let mut best = [f64::MAX; 2];
            pool.install(|| {
                for _ in 0..RUNS {
                    for (which, run) in [&ours as &dyn Fn(&mut [f32]), &theirs].iter().enumerate() {
                        let start = Instant::now();
                        run(&mut c);
                        best[which] = best[which].min(start.elapsed().as_secs_f64());
                    }
                }
            });
            ours_total += best[0];
            theirs_total += best[1];
            let flops = 2.0 * (m * k * n) as f64;
            println!(
                "  {m:>4} x {k:>4} x {n:>4}{}{}: ours {:6.2} ms ({:5.1} GFLOP/s), gemm {:6.2} ms: {:.3}x its speed",
                if at { " (a^T)" } else { "" },
                if bt { " (b^T)" } else { "" },
                best[0] * 1e3,
                flops / best[0] / 1e9,
                best[1] * 1e3,
                best[1] / best[0],
            );
        }
        println!(
            "  a step's layer: ours {:.1} ms, gemm {:.1} ms: {:.3}x its speed",
            ours_total * 1e3,
            theirs_total * 1e3,
            theirs_total / ours_total
        );
    }
}
