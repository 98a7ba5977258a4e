//! The optimisers: AdamW for the GPT (PyTorch's `torch.optim.AdamW`, its formula and its
//! order of operations) and Adam for the MLP, each an element-wise pass over a parameter,
//! its gradient and its two moments, split over the current rayon pool's threads.

use rayon::prelude::*;

use super::simd::vectorized;

/// Elements per task.
const SPLIT: usize = 1 << 14;

/// One Adam step (`t` counts from 1), split over the current rayon pool's threads.
pub fn adam(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, t: i32) {
    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
    let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    let (step, root) = (lr / c1, 1.0 / c2.sqrt());
    param
        .par_chunks_mut(SPLIT)
        .zip(grad.par_chunks(SPLIT))
        .zip(m.par_chunks_mut(SPLIT))
        .zip(v.par_chunks_mut(SPLIT))
        .for_each(|(((param, grad), m), v)| {
            for (((p, g), m), v) in param.iter_mut().zip(grad).zip(m).zip(v) {
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                // = lr * (m / c1) / (sqrt(v / c2) + eps)
                *p -= step * *m / (v.sqrt() * root + eps);
            }
        });
}

/// AdamW's hyper-parameters (PyTorch's names and formula, `torch.optim.AdamW`), in `f64`
/// as PyTorch's Python floats are: `0.9` is that number's `f64`, not an `f32` widened (which
/// moved the bias corrections by about 2e-7 relative).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f64,
    /// First moment's decay.
    pub beta1: f64,
    /// Second moment's decay.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay (0 for the parameters it does not apply to).
    pub weight_decay: f64,
}

/// The per-step constants of an AdamW step, computed in `f64` as PyTorch's Python-side
/// scalars are, then rounded once to the tensors' `f32`, as PyTorch's kernels take them.
#[derive(Clone, Copy, Debug)]
struct AdamWStep {
    decay: f32,
    beta2: f32,
    /// `1 - beta1` and `1 - beta2`.
    rest1: f32,
    rest2: f32,
    step_size: f32,
    root_correction: f32,
    eps: f32,
}

impl AdamW {
    fn at(&self, t: i32) -> AdamWStep {
        let (lr, b1, b2) = (self.lr, self.beta1, self.beta2);
        AdamWStep {
            decay: (1.0 - lr * self.weight_decay) as f32,
            beta2: b2 as f32,
            rest1: (1.0 - b1) as f32,
            rest2: (1.0 - b2) as f32,
            step_size: (lr / (1.0 - b1.powi(t))) as f32,
            root_correction: (1.0 - b2.powi(t)).sqrt() as f32,
            eps: self.eps as f32,
        }
    }

    /// Step `t` (from 1) of `param` with `grad` and its moments `m` and `v`, split over the
    /// current rayon pool's threads, in the order of operations of PyTorch's single-tensor
    /// AdamW: decay, then the moments, then the update.
    ///
    /// # Panics
    ///
    /// If the slices differ in length.
    pub fn step(&self, param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], t: i32) {
        assert!(
            grad.len() == param.len() && m.len() == param.len() && v.len() == param.len(),
            "a parameter, its gradient and its moments differ in length"
        );
        let at = self.at(t);
        param
            .par_chunks_mut(SPLIT)
            .zip(grad.par_chunks(SPLIT))
            .zip(m.par_chunks_mut(SPLIT))
            .zip(v.par_chunks_mut(SPLIT))
            .for_each(|(((param, grad), m), v)| adamw_chunk(at, param, grad, m, v));
    }
}

vectorized! {
    /// One chunk of [`AdamW::step`].
    fn adamw_chunk(at: AdamWStep, param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]) {
        for (((p, &g), m), v) in param.iter_mut().zip(grad).zip(m).zip(v) {
            *p *= at.decay;
            *m += (g - *m) * at.rest1;
            *v = *v * at.beta2 + at.rest2 * g * g;
            let denom = v.sqrt() / at.root_correction + at.eps;
            *p += -at.step_size * (*m / denom);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nanoGPT's AdamW, at a learning rate of 0.01.
    const NANOGPT: AdamW = AdamW {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };

    #[test]
    fn adamw_follows_pytorchs_formula() {
        let opt = NANOGPT;
        let (mut p, mut m, mut v) = (vec![1.0f32, -2.0], vec![0.0f32; 2], vec![0.0f32; 2]);
        let g = [0.5f32, -0.25];
        opt.step(&mut p, &g, &mut m, &mut v, 1);
        // Step 1: the moments' corrections cancel, so the update is lr * sign(g) (eps aside).
        for (i, want) in [1.0f64 * (1.0 - 0.001) - 0.01, -2.0 * (1.0 - 0.001) + 0.01]
            .iter()
            .enumerate()
        {
            assert!((p[i] as f64 - want).abs() < 1e-6, "{} {}", p[i], want);
        }
        assert!((m[0] - 0.05).abs() < 1e-7 && (v[1] - 0.05 * 0.0625).abs() < 1e-9);
    }

    /// Ten steps of gradients that change sign and size, against PyTorch's formula in `f64`:
    /// the bias corrections, which cancel at the first step, count from the second on.
    #[test]
    fn adamw_follows_pytorch_over_several_steps() {
        let opt = NANOGPT;
        let n = 37; // past a vector of 16, with a tail
        let mut p: Vec<f32> = (0..n).map(|i| (i as f32 - 18.0) / 9.0).collect();
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        let mut reference: Vec<(f64, f64, f64)> = p.iter().map(|&x| (x as f64, 0.0, 0.0)).collect();
        for t in 1..=10 {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 7 + t * 3) % 11) as f32 / 5.0 - 1.0)
                .collect();
            opt.step(&mut p, &g, &mut m, &mut v, t as i32);
            let (b1, b2) = (opt.beta1, opt.beta2);
            for ((p, m, v), &g) in reference.iter_mut().zip(&g) {
                let g = g as f64;
                *p *= 1.0 - opt.lr * opt.weight_decay;
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                let denom = v.sqrt() / (1.0 - b2.powi(t as i32)).sqrt() + opt.eps;
                *p -= opt.lr / (1.0 - b1.powi(t as i32)) * *m / denom;
            }
        }
        for (i, (&ours, &(want, _, _))) in p.iter().zip(&reference).enumerate() {
            let error = (ours as f64 - want).abs() / want.abs().max(1e-3);
            assert!(
                error < 1e-5,
                "parameter {i}: {ours} against {want} ({error:.1e})"
            );
        }
    }
}
