//! Times the attention kernels at the main job's shape (batch 16, context 256, 8 heads of 32)
//! on one thread, best of 12: `cargo bench -p train-replay --bench attention`. The checksums
//! are the outputs' sums: a change that keeps them keeps the bits.
use std::mem::MaybeUninit;
use std::time::Instant;

use train_replay::kernels::attention::{backward, forward, Heads};

fn main() {
    let shape = Heads {
        batch: 16,
        seq: 256,
        heads: 8,
        size: 32,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let n = shape.rows() * shape.width();
    let qkv: Vec<f32> = (0..3 * n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let dout: Vec<f32> = (0..n)
        .map(|i| ((i * 104_729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut out = vec![MaybeUninit::<f32>::uninit(); n];
    let mut stats = vec![MaybeUninit::<f32>::uninit(); shape.stats_len().unwrap()];
    let mut dqkv = vec![MaybeUninit::<f32>::uninit(); 3 * n];
    pool.install(|| {
        let (mut fwd, mut bwd) = (f64::MAX, f64::MAX);
        for _ in 0..12 {
            let t = Instant::now();
            forward(shape, &qkv, &mut out, Some(&mut stats), None);
            fwd = fwd.min(t.elapsed().as_secs_f64());
            // SAFETY: `forward` wrote every element.
            let (out, stats): (&[f32], &[f32]) = unsafe {
                (
                    &*(std::ptr::from_ref(&out[..]) as *const [f32]),
                    &*(std::ptr::from_ref(&stats[..]) as *const [f32]),
                )
            };
            let t = Instant::now();
            backward(shape, &qkv, (out, stats), &dout, None, &mut dqkv);
            bwd = bwd.min(t.elapsed().as_secs_f64());
        }
        // SAFETY: written by the kernels.
        let (o, d): (&[f32], &[f32]) = unsafe {
            (
                &*(std::ptr::from_ref(&out[..]) as *const [f32]),
                &*(std::ptr::from_ref(&dqkv[..]) as *const [f32]),
            )
        };
        let sum = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>();
        println!(
            "forward {:.2} ms, backward {:.2} ms (checksums {:.6} {:.6})",
            fwd * 1e3,
            bwd * 1e3,
            sum(o),
            sum(d)
        );
    });
}
