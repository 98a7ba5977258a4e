//! The numeric kernels: GEMM from the `gemm` crate (AVX-512 or AVX2 kernels chosen at run
//! time; its packing buffers are per-thread and made once), and the element-wise pieces of
//! the model. A layer's bias and ReLU are fused with its GEMM: the bias is the accumulator's
//! starting value and the ReLU runs on each thread's rows as soon as they are computed, while
//! they are still in cache.

use std::mem::MaybeUninit;

use rayon::prelude::*;

/// A matrix operand: its elements and its row and column strides.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major `rows x cols` matrix.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns (no copy).
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }

    /// Whether every element of a `rows x cols` operand lies inside `data`, with strides the
    /// kernel can take as `isize`.
    fn reaches(&self, rows: usize, cols: usize) -> bool {
        let strides_fit = isize::try_from(self.rs).is_ok() && isize::try_from(self.cs).is_ok();
        strides_fit
            && (rows == 0
                || cols == 0
                || (rows - 1)
                    .checked_mul(self.rs)
                    .zip((cols - 1).checked_mul(self.cs))
                    .and_then(|(r, c)| r.checked_add(c))
                    .is_some_and(|last| last < self.data.len()))
    }
}

/// `c[m x n] = a[m x k] * b[k x n]` (or `c += a * b` if `accumulate`), `c` row-major. `c`
/// is written whole either way; when `accumulate` is false its old contents are not read, so
/// it may be uninitialised.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [MaybeUninit<f32>],
    accumulate: bool,
) {
    let elements = m.checked_mul(n).expect("m * n overflows");
    assert!(c.len() >= elements, "output too short for its shape");
    assert!(
        a.reaches(m, k) && b.reaches(k, n),
        "operands too short for their shapes"
    );
    if elements == 0 {
        return;
    }
    // SAFETY: the asserts above keep every index the kernel computes inside the slices (row
    // and column strides as given, `c` row-major with `n` columns); `c` is exclusively ours
    // and does not overlap `a` or `b` (a `&mut` next to shared slices); with `read_dst` false
    // the kernel writes every element of `c` without reading it, so it may be uninitialised.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr().cast::<f32>(),
            1,
            n as isize,
            accumulate,
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
            gemm::Parallelism::None,
        );
    }
}

/// One linear layer on `rows` rows, fused: `out = relu?(input * weight + bias)`, `input`
/// row-major with `k` columns, `weight` `k x n` row-major; the rows split over `threads`
/// threads of the current rayon pool (1: this thread). Every element of `out` is written.
#[allow(clippy::too_many_arguments)] // a GEMM's shape and operands
pub fn linear(
    rows: usize,
    k: usize,
    n: usize,
    input: &[f32],
    weight: &[f32],
    bias: &[f32],
    relu: bool,
    out: &mut [MaybeUninit<f32>],
    threads: usize,
) {
    let fits = |len: usize, cols: usize| rows.checked_mul(cols).is_some_and(|need| len >= need);
    assert!(
        bias.len() == n && fits(input.len(), k) && fits(out.len(), n),
        "operands too short for their shapes"
    );
    if rows == 0 || n == 0 {
        return; // nothing to write
    }
    let chunk_rows = rows.div_ceil(threads.max(1)).max(1);
    let run = |out: &mut [MaybeUninit<f32>], input: &[f32]| {
        let chunk = out.len() / n;
        for row in out.chunks_exact_mut(n) {
            for (to, &b) in row.iter_mut().zip(bias) {
                to.write(b);
            }
        }
        gemm(
            chunk,
            k,
            n,
            Mat::rows(input, k),
            Mat::rows(weight, n),
            out,
            true,
        );
        if relu {
            // SAFETY: the loop above initialised every element and the GEMM kept them so.
            let out = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
            out.iter_mut().for_each(|v| *v = v.max(0.0));
        }
    };
    let (out, input) = (&mut out[..rows * n], &input[..rows * k]);
    if threads > 1 && rows > chunk_rows {
        out.par_chunks_mut(chunk_rows * n)
            .zip(input.par_chunks(chunk_rows * k))
            .for_each(|(out, input)| run(out, input));
    } else {
        run(out, input);
    }
}

/// `acc += values`.
pub fn add_into(acc: &mut [f32], values: &[f32]) {
    for (a, v) in acc.iter_mut().zip(values) {
        *a += v;
    }
}

/// `acc += values`, split over the current rayon pool's threads.
pub fn par_add_into(acc: &mut [f32], values: &[f32]) {
    acc.par_chunks_mut(SPLIT)
        .zip(values.par_chunks(SPLIT))
        .for_each(|(acc, values)| add_into(acc, values));
}

/// Zeroes `grad` where the ReLU output was clipped (a select, not a branch: it vectorises).
pub fn relu_mask(grad: &mut [f32], output: &[f32]) {
    for (g, o) in grad.iter_mut().zip(output) {
        *g = if *o > 0.0 { *g } else { 0.0 };
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a.data[i * a.rs + p * a.cs] * b.data[p * b.rs + j * b.cs])
                    .sum();
            }
        }
        c
    }

    #[test]
    fn gemm_matches_the_definition_with_transposed_operands() {
        let (m, k, n) = (7, 5, 3);
        let mut empty: [MaybeUninit<f32>; 0] = [];
        linear(0, k, n, &[], &[0.0; 15], &[0.0; 3], true, &mut empty, 2); // no rows
        linear(2, 1, 0, &[1.0, 2.0], &[], &[], true, &mut empty, 2); // no columns
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
        for (a, b) in [
            (Mat::rows(&a, k), Mat::rows(&b, n)),
            (Mat::transposed(&a, m), Mat::transposed(&b, k)),
        ] {
            let mut c = vec![MaybeUninit::new(f32::NAN); m * n];
            gemm(m, k, n, a, b, &mut c, false);
            // SAFETY: the elements started initialised, and the GEMM writes only floats.
            let c: Vec<f32> = c.iter().map(|v| unsafe { v.assume_init() }).collect();
            assert_eq!(c, naive(m, k, n, a, b));
        }
    }

    #[test]
    fn the_fused_layer_adds_the_bias_and_clips_on_every_thread_count() {
        let (rows, k, n) = (9, 4, 6);
        let input: Vec<f32> = (0..rows * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let weight: Vec<f32> = (0..k * n).map(|i| (i % 3) as f32 - 1.0).collect();
        let bias: Vec<f32> = (0..n).map(|i| i as f32 - 2.5).collect();
        let mut expected = naive(rows, k, n, Mat::rows(&input, k), Mat::rows(&weight, n));
        for (i, v) in expected.iter_mut().enumerate() {
            *v = (*v + bias[i % n]).max(0.0);
        }
        assert!(expected.contains(&0.0) && expected.iter().any(|&v| v > 0.0));
        for threads in [1, 2, 4, 16] {
            let mut out = vec![MaybeUninit::new(f32::NAN); rows * n];
            linear(rows, k, n, &input, &weight, &bias, true, &mut out, threads);
            // SAFETY: `linear` wrote every element (and they started initialised anyway).
            let out: Vec<f32> = out.iter().map(|v| unsafe { v.assume_init() }).collect();
            assert_eq!(out, expected, "{threads} threads");
        }
    }
}
