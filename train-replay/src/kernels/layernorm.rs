//! Layer norm over the last dimension (PyTorch's `nn.LayerNorm`, epsilon 1e-5): each row is
//! normalised alone, in a fixed order, and the weight and bias gradients are column sums taken
//! row by row, so the results do not depend on how the work is split.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::simd::{vectorized, Lanes};

/// Added to the variance.
pub const EPS: f32 = 1e-5;

/// Rows per task of the row-parallel passes.
const ROWS_PER_TASK: usize = 64;

vectorized! {
    /// Normalises each row of `c` elements of `x` into `out`: `(x - mean) / sqrt(var + eps) *
    /// weight + bias`; with `stats`, writes each row's mean and `1 / sqrt(var + eps)` there,
    /// two per row.
    pub fn normalize_rows(
        c: usize,
        x: &[f32],
        weight: &[f32],
        bias: &[f32],
        out: &mut [MaybeUninit<f32>],
        stats: Option<&mut [f32]>,
    ) {
        let rows = x.len() / c.max(1);
        let mut stats = stats;
        for r in 0..rows {
            let row = &x[r * c..][..c];
            let (mean, rstd) = moments(row);
            for (((o, &v), &w), &b) in out[r * c..][..c].iter_mut().zip(row).zip(weight).zip(bias) {
                o.write((v - mean) * rstd * w + b);
            }
            if let Some(stats) = stats.as_deref_mut() {
                stats[2 * r] = mean;
                stats[2 * r + 1] = rstd;
            }
        }
    }
}

vectorized! {
    /// Part of a row normalised as [`normalize_rows`] does it, given the row's `mean` and
    /// `rstd` ([`moments`]) and the part's weight and bias: the same bits, element by element.
    pub fn normalize_part(x: &[f32], weight: &[f32], bias: &[f32], mean: f32, rstd: f32, out: &mut [f32]) {
        for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(weight).zip(bias) {
            *o = (v - mean) * rstd * w + b;
        }
    }
}

/// A row's mean and `1 / sqrt(var + eps)` (two passes: the mean, then the squared
/// deviations from it).
#[inline(always)]
pub fn moments(row: &[f32]) -> (f32, f32) {
    let c = row.len().max(1) as f32;
    let mean = Lanes::sum_of(row, |v| v) / c;
    let var = Lanes::sum_of(row, |v| (v - mean) * (v - mean)) / c;
    (mean, 1.0 / (var + EPS).sqrt())
}

/// Layer norm of the `rows` rows of `c` elements of `x` into `out` (every element written),
/// and with `stats` each row's mean and reciprocal deviation (two per row), split over the
/// current rayon pool's threads.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn forward(
    rows: usize,
    c: usize,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    out: &mut [MaybeUninit<f32>],
    stats: &mut [f32],
) {
    let len = rows.checked_mul(c).expect("rows * c overflows");
    assert!(
        x.len() >= len && out.len() >= len && stats.len() >= 2 * rows,
        "operands too short for their shapes"
    );
    assert!(
        weight.len() == c && bias.len() == c,
        "weight and bias of another width"
    );
    if len == 0 {
        return;
    }
    out[..len]
        .par_chunks_mut(ROWS_PER_TASK * c)
        .zip(x[..len].par_chunks(ROWS_PER_TASK * c))
        .zip(stats[..2 * rows].par_chunks_mut(2 * ROWS_PER_TASK))
        .for_each(|((out, x), stats)| normalize_rows(c, x, weight, bias, out, Some(stats)));
}

vectorized! {
    /// The input gradient of rows of a layer norm, added to `dx`: with `n = (x - mean) *
    /// rstd` and `d = dout * weight`, `dx += rstd * (d - mean(d) - n * mean(d * n))`.
    fn input_grad_rows(c: usize, dout: &[f32], x: &[f32], weight: &[f32], stats: &[f32], dx: &mut [f32]) {
        let rows = dx.len() / c.max(1);
        for r in 0..rows {
            let (mean, rstd) = (stats[2 * r], stats[2 * r + 1]);
            let (g, v) = (&dout[r * c..][..c], &x[r * c..][..c]);
            let d_mean = Lanes::sum_of_pairs(g, weight, |g, w| g * w) / c as f32;
            let dn_mean =
                Lanes::sum_of_triples(g, weight, v, |g, w, v| g * w * ((v - mean) * rstd)) / c as f32;
            for (((o, &g), &w), &v) in dx[r * c..][..c].iter_mut().zip(g).zip(weight).zip(v) {
                let n = (v - mean) * rstd;
                *o += rstd * (g * w - d_mean - n * dn_mean);
            }
        }
    }
}

vectorized! {
    /// Adds to `dw` and `db` (a range of columns starting at `first`) the sums over the rows
    /// of `dout * n` and `dout`, row by row in order.
    fn param_grad_columns(c: usize, first: usize, dout: &[f32], x: &[f32], stats: &[f32], dw: &mut [f32], db: &mut [f32]) {
        let rows = stats.len() / 2;
        let width = dw.len();
        for r in 0..rows {
            let (mean, rstd) = (stats[2 * r], stats[2 * r + 1]);
            let g = &dout[r * c + first..][..width];
            let v = &x[r * c + first..][..width];
            for (((w, b), &g), &v) in dw.iter_mut().zip(db.iter_mut()).zip(g).zip(v) {
                *w += g * ((v - mean) * rstd);
                *b += g;
            }
        }
    }
}

/// The gradients of a layer norm of `rows` rows of `c`, from its input `x`, its `stats`
/// (from [`forward`]) and its output's gradient `dout`: the input's added to `dx`, the
/// weight's and the bias's written to `dw` and `db`. On the current rayon pool's threads:
/// rows at once for `dx`, columns at once for `dw` and `db` (each summed over the rows in
/// order), so the same bits at any thread count.
///
/// # Panics
///
/// If an operand is too short for its shape.
#[allow(clippy::too_many_arguments)] // the layer's operands and its three gradients
pub fn backward(
    rows: usize,
    c: usize,
    dout: &[f32],
    x: &[f32],
    weight: &[f32],
    stats: &[f32],
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
) {
    let len = rows.checked_mul(c).expect("rows * c overflows");
    assert!(
        dout.len() >= len && x.len() >= len && dx.len() >= len && stats.len() >= 2 * rows,
        "operands too short for their shapes"
    );
    assert!(
        weight.len() == c && dw.len() == c && db.len() == c,
        "parameters of another width"
    );
    if len == 0 {
        dw.fill(0.0);
        db.fill(0.0);
        return;
    }
    dx[..len]
        .par_chunks_mut(ROWS_PER_TASK * c)
        .enumerate()
        .for_each(|(i, dx)| {
            let first = i * ROWS_PER_TASK;
            let count = dx.len() / c;
            input_grad_rows(
                c,
                &dout[first * c..(first + count) * c],
                &x[first * c..(first + count) * c],
                weight,
                &stats[2 * first..2 * (first + count)],
                dx,
            );
        });
    // Whole cache lines of columns per task.
    let width = 64;
    dw.fill(0.0);
    db.fill(0.0);
    dw.par_chunks_mut(width)
        .zip(db.par_chunks_mut(width))
        .enumerate()
        .for_each(|(i, (dw, db))| {
            param_grad_columns(
                c,
                i * width,
                &dout[..len],
                &x[..len],
                &stats[..2 * rows],
                dw,
                db,
            );
        });
}
