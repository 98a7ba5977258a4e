//! Times the GPT's head (the final layer norm, the projection tied to the token embedding,
//! the cross-entropy and their gradients) at GPT-2's vocabulary on 2 threads, three ways,
//! alternated, medians of 5: the logits whole; in chunks of rows whose logits become their
//! gradients at once (the job's head, `chunk_rows` rows); and the other way to chunk them,
//! a forward pass that keeps only each chunk's loss and a backward pass that computes each
//! chunk's logits again for its gradients (timed as the loss-only head plus the fused one,
//! which is what it runs). Each prints its peak bytes in use in the pool and a checksum of
//! the gradients (the sum of their magnitudes). `cargo bench -p train-replay --bench head` (`-- mini` or `-- small` for
//! one shape).
use std::time::Instant;

use ferropool::BufferPool;
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use train_replay::backend::{Backend, PoolBackend};
use train_replay::kernels::attention::Heads;
use train_replay::model::gpt::head::{chunk_rows, head, HeadGrads};
use train_replay::model::gpt::params::Params;
use train_replay::model::gpt::Shape;
use train_replay::model::ops::Ops;

const THREADS: usize = 2;
const ROUNDS: usize = 5;

fn main() {
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let shapes = [
        ("gpt2-mini, batch 16 x 256", 384, 6, 16, 256),
        ("gpt2-small, batch 4 x 1024", 768, 12, 4, 1024),
    ];
    let workers = rayon::ThreadPoolBuilder::new()
        .num_threads(THREADS)
        .build()
        .expect("threads");
    for (name, width, heads, batch, context) in shapes {
        if only
            .as_deref()
            .is_some_and(|o| !name.starts_with(&format!("gpt2-{o}")))
        {
            continue;
        }
        workers.install(|| time_shape(name, width, heads, batch, context));
    }
}

/// The three heads at one shape.
fn time_shape(name: &str, width: usize, heads: usize, batch: usize, context: usize) {
    let shape = Shape {
        vocab: 50_257,
        context,
        width,
        heads,
        layers: 1,
        batch,
    };
    let backend = PoolBackend {
        pool: BufferPool::new(),
    };
    let ops = Ops {
        backend: &backend,
        threads: THREADS,
        dry: false,
    };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let params = Params::new(&backend, &shape, Some(&mut rng)).expect("parameters");
    let grid = Heads {
        batch,
        seq: context,
        heads,
        size: width / heads,
    };
    let n = grid.rows();
    let x: Vec<f32> = (0..n * width)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut x_buf = backend.zeros(n, width).expect("x");
    PoolBackend::slice_mut(&mut x_buf).copy_from_slice(&x);
    let x = backend.save(x_buf).expect("kept");
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % 50_257).collect();
    let rows = chunk_rows(shape.vocab);
    println!(
        "{name}: {n} rows, width {width}, vocabulary {}; chunks of {rows} rows",
        shape.vocab
    );
    let checksum = |grads: &HeadGrads<ferropool::Tensor>| {
        let sum = |t: &ferropool::Tensor| {
            PoolBackend::slice(t)
                .iter()
                .map(|&v| f64::from(v.abs()))
                .sum::<f64>()
        };
        sum(&grads.dx) + sum(&grads.dwte)
    };
    let variants: [(&str, &dyn Fn() -> f64); 3] = [
        ("logits whole", &|| {
            let (_, grads) = head(&ops, &params, &x, grid, &targets, true, 0).expect("head");
            checksum(&grads.expect("gradients"))
        }),
        ("chunks, fused (the job's)", &|| {
            let (_, grads) = head(&ops, &params, &x, grid, &targets, true, rows).expect("head");
            checksum(&grads.expect("gradients"))
        }),
        ("chunks, logits again in backward", &|| {
            head(&ops, &params, &x, grid, &targets, false, rows).expect("loss");
            let (_, grads) = head(&ops, &params, &x, grid, &targets, true, rows).expect("head");
            checksum(&grads.expect("gradients"))
        }),
    ];
    let mut times = vec![Vec::new(); variants.len()];
    let mut peaks = vec![0u64; variants.len()];
    let mut sums = vec![0f64; variants.len()];
    for _ in 0..ROUNDS {
        for (i, (_, run)) in variants.iter().enumerate() {
            backend.pool.reset_peak_stats();
            let before = backend.pool.stats().in_use_bytes;
            let started = Instant::now();
            sums[i] = run();
            times[i].push(started.elapsed().as_secs_f64());
            peaks[i] = backend.pool.stats().peak_in_use_bytes - before;
        }
    }
    let whole = median(&times[0]);
    for (i, (label, _)) in variants.iter().enumerate() {
        let t = median(&times[i]);
        println!(
            "  {label:34} {t:6.3} s ({:.2}x the whole logits' time), peak {:7.1} MiB above \
             its input, checksum {:.6e}",
            t / whole,
            peaks[i] as f64 / f64::from(1 << 20),
            sums[i]
        );
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
