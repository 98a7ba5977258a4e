//! The element-wise kernels: the MLP's ReLU mask, the GPT's GELU, a vector added in place. Each
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
}
