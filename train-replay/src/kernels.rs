//! The numeric kernels: GEMM from `matrixmultiply` (its packing buffers come from the
//! global allocator, so from the pool when ferropool's front end is installed), and the
//! element-wise pieces of the model.

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
}

/// `c[m x n] = a[m x k] * b[k x n]`, `c` row-major.
pub fn gemm(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>, c: &mut [f32]) {
    assert!(c.len() >= m * n);
    let reach = |x: Mat<'_>, rows: usize, cols: usize| {
        rows == 0 || cols == 0 || x.data.len() > (rows - 1) * x.rs + (cols - 1) * x.cs
    };
    assert!(
        reach(a, m, k) && reach(b, k, n),
        "operands too short for their shapes"
    );
    // SAFETY: the asserts above keep every index matrixmultiply computes inside the slices.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// As [`gemm`] with a row-major `a`, its rows split over the current rayon pool's threads.
pub fn par_gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: Mat<'_>,
    c: &mut [f32],
    threads: usize,
) {
    let rows = m.div_ceil(threads.max(1)).max(1);
    c[..m * n]
        .par_chunks_mut(rows * n)
        .zip(a[..m * k].par_chunks(rows * k))
        .for_each(|(c, a)| gemm(c.len() / n, k, n, Mat::rows(a, k), b, c));
}

/// `acc += values`.
pub fn add_into(acc: &mut [f32], values: &[f32]) {
    for (a, v) in acc.iter_mut().zip(values) {
        *a += v;
    }
}

/// Adds `bias` to every row, and clips at zero if `relu`.
pub fn bias_relu(out: &mut [f32], bias: &[f32], relu: bool) {
    for row in out.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
            if relu && *v < 0.0 {
                *v = 0.0;
            }
        }
    }
}

/// Zeroes `grad` where the ReLU output was clipped.
pub fn relu_mask(grad: &mut [f32], output: &[f32]) {
    for (g, o) in grad.iter_mut().zip(output) {
        if *o <= 0.0 {
            *g = 0.0;
        }
    }
}

/// One Adam step (`t` counts from 1).
pub fn adam(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, t: i32) {
    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
    let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    for (((p, g), m), v) in param.iter_mut().zip(grad).zip(m).zip(v) {
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        *p -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
    }
}
