//! The element-wise kernels: the MLP's ReLU mask and Adam, the GPT's GELU and AdamW. Each
//! element is computed alone, so the results do not depend on how the work is split; the
//! loops are vectorised (see [`simd`](super::simd)).

use rayon::prelude::*;

use super::simd::{exp, vectorized};

/// `acc += values`.
pub fn add_into(acc: &mut [f32], values: &[f32]) {
    for (a, v) in acc.iter_mut().zip(values) {
        *a += v;
    }
}

/// Zeroes `grad` where the ReLU output was clipped (a select, not a branch: it vectorises),
/// split over the current rayon pool's threads.
pub fn relu_mask(grad: &mut [f32], output: &[f32]) {
    grad.par_chunks_mut(SPLIT)
        .zip(output.par_chunks(SPLIT))
        .for_each(|(grad, output)| {
            for (g, o) in grad.iter_mut().zip(output) {
                *g = if *o > 0.0 { *g } else { 0.0 };
            }
        });
}

/// Elements per task of the element-wise kernels split over threads.
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

/// `sqrt(2 / pi)`, the GELU's inner scale.
const GELU_SCALE: f32 = 0.797_884_6;
/// The GELU's cubic coefficient.
const GELU_CUBIC: f32 = 0.044_715;

/// The GELU, tanh form: `x/2 (1 + tanh(y))` with `y = sqrt(2/pi) (x + 0.044715 x^3)`, computed
/// as `x * sigmoid(2y)` (the same function, without the cancellation of `1 + tanh` for
/// negative `y`).
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let y = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    x / (1.0 + exp(-2.0 * y))
}

/// The GELU's derivative at `x`.
#[inline(always)]
pub fn gelu_slope(x: f32) -> f32 {
    let y = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    let s = 1.0 / (1.0 + exp(-2.0 * y));
    s + x * s * (1.0 - s) * 2.0 * GELU_SCALE * (1.0 + 3.0 * GELU_CUBIC * x * x)
}

vectorized! {
    /// `out = gelu(input)`, element by element (as long as the shorter).
    pub fn gelu_into(input: &[f32], out: &mut [f32]) {
        for (o, &x) in out.iter_mut().zip(input) {
            *o = gelu(x);
        }
    }
}

vectorized! {
    /// `grad *= gelu'(input)`: the gradient of the GELU's input from its output's.
    fn gelu_backward_chunk(grad: &mut [f32], input: &[f32]) {
        for (g, &x) in grad.iter_mut().zip(input) {
            *g *= gelu_slope(x);
        }
    }
}

/// `grad *= gelu'(input)`, split over the current rayon pool's threads.
pub fn gelu_backward(grad: &mut [f32], input: &[f32]) {
    grad.par_chunks_mut(SPLIT)
        .zip(input.par_chunks(SPLIT))
        .for_each(|(grad, input)| gelu_backward_chunk(grad, input));
}

vectorized! {
    /// `out = gelu(input)` into an output to be initialised.
    fn gelu_uninit_chunk(input: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) {
        for (o, &x) in out.iter_mut().zip(input) {
            o.write(gelu(x));
        }
    }
}

/// `out = gelu(input)`, every element of `out` (as long as `input`) written, split over the
/// current rayon pool's threads.
pub fn gelu_uninit(input: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) {
    assert!(out.len() >= input.len(), "output too short");
    out[..input.len()]
        .par_chunks_mut(SPLIT)
        .zip(input.par_chunks(SPLIT))
        .for_each(|(out, input)| gelu_uninit_chunk(input, out));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gelu_exact(x: f64) -> f64 {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
    }

    #[test]
    fn gelu_matches_the_tanh_form_and_its_slope_the_difference_quotient() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.005;
            let want = gelu_exact(x as f64);
            assert!(
                (gelu(x) as f64 - want).abs() <= 2e-7 * (1.0 + want.abs()),
                "gelu({x})"
            );
            let h = 1e-4;
            let slope = (gelu_exact(x as f64 + h) - gelu_exact(x as f64 - h)) / (2.0 * h);
            assert!((gelu_slope(x) as f64 - slope).abs() < 1e-5, "gelu'({x})");
        }
        assert!(gelu(-100.0).abs() < 1e-30);
        assert_eq!(gelu(100.0), 100.0);
    }

    #[test]
    fn adamw_follows_pytorchs_formula() {
        let opt = AdamW {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
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
        let opt = AdamW {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
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
