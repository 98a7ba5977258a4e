//! Causal multi-head self-attention, fused: for each sequence and head, the queries are taken
//! a block of [`QUERY_BLOCK`] rows at a time against the keys up to the block's last row only
//! (the masked half is never computed), the block's scores are turned into softmax weights in
//! this thread's scratch and multiplied by the values at once. No score matrix is kept: the
//! backward pass computes each block's weights again, with the same operations in the same
//! order, so they are the same bits (or, with [`forward`]'s `probs`, reads them back).
//!
//! The input is the `q | k | v` projection of a GPT block, `batch x seq` rows of `3 x width`
//! columns, head `h` at columns `h x size ..` of each third; the output is `batch x seq` rows
//! of `width`. Each (sequence, head) pair is one task on the current rayon pool, its products
//! single-threaded calls of the `gemm` crate cut by the shapes alone, so the results are the
//! same at any thread count.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::gemm::{gemm, gemm_into, Mat};
use super::scratch::with_scratch;
use super::simd::{exp, vectorized, Lanes};

/// Query rows per block.
pub const QUERY_BLOCK: usize = 64;

/// An attention's shape: `batch` sequences of `seq` positions, `heads` heads of `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Sequences.
    pub batch: usize,
    /// Positions per sequence.
    pub seq: usize,
    /// Heads.
    pub heads: usize,
    /// Elements per head.
    pub size: usize,
}

impl Heads {
    /// `heads x size`, the model's width.
    pub fn width(&self) -> usize {
        self.heads * self.size
    }

    /// Rows of the input and the output: `batch x seq`.
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }

    /// Elements of the kept weights ([`forward`]'s `probs`): `batch x heads x seq x seq`.
    pub fn probs_len(&self) -> Option<usize> {
        self.batch
            .checked_mul(self.heads)?
            .checked_mul(self.seq)?
            .checked_mul(self.seq)
    }

    /// Panics unless `qkv` and an output of `out` elements fit the shape.
    fn check(&self, qkv: usize, out: usize) {
        let rows = self
            .batch
            .checked_mul(self.seq)
            .zip(self.heads.checked_mul(self.size))
            .and_then(|(rows, width)| rows.checked_mul(width));
        let ok = rows.is_some_and(|len| len.checked_mul(3).is_some_and(|l| qkv >= l) && out >= len);
        assert!(ok, "operands too short for their shapes");
    }

    /// The scores' scale, `1 / sqrt(size)`.
    fn scale(&self) -> f32 {
        1.0 / (self.size as f32).sqrt()
    }
}

/// A pointer to an output that the tasks share, each writing its own elements.
#[derive(Clone, Copy)]
struct Shared(*mut f32);

// SAFETY: the tasks that share it write disjoint elements (each its own head's columns), and
// the borrow it came from outlives them (`for_each` returns after every task).
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

/// Where one (sequence, head) pair's operands start.
#[derive(Clone, Copy)]
struct Pair {
    /// First row of the sequence.
    base: usize,
    /// First column of the head.
    column: usize,
}

impl Pair {
    fn of(shape: &Heads, index: usize) -> Self {
        Self {
            base: index / shape.heads * shape.seq,
            column: index % shape.heads * shape.size,
        }
    }
}

/// The attention's output into `out` (`batch x seq` rows of `width`, every element written);
/// with `probs` (`batch x heads x seq x seq`), each pair's softmax weights too (row `i` of a
/// pair: the weights of keys `0..=i`, zeros after).
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn forward(
    shape: Heads,
    qkv: &[f32],
    out: &mut [MaybeUninit<f32>],
    probs: Option<&mut [MaybeUninit<f32>]>,
) {
    shape.check(qkv.len(), out.len());
    let (t, pairs) = (shape.seq, shape.batch * shape.heads);
    if t == 0 || pairs == 0 || shape.size == 0 {
        return;
    }
    let out = Shared(out.as_mut_ptr().cast());
    let run = |pair: usize, probs: Option<&mut [MaybeUninit<f32>]>| {
        // SAFETY: each pair writes only its own head's columns of its own sequence's rows
        // (`Shared`'s contract), inside `out` (checked by `shape.check`).
        unsafe { forward_pair(&shape, Pair::of(&shape, pair), qkv, out, probs) }
    };
    match probs {
        Some(probs) => {
            let len = shape.probs_len().expect("checked above");
            assert!(probs.len() >= len, "the kept weights' buffer is too short");
            probs[..len]
                .par_chunks_mut(t * t)
                .enumerate()
                .for_each(|(pair, probs)| run(pair, Some(probs)));
        }
        None => (0..pairs).into_par_iter().for_each(|pair| run(pair, None)),
    }
}

/// One pair of [`forward`].
///
/// # Safety
///
/// `out` reaches the whole output, and no other reference reaches this pair's elements.
unsafe fn forward_pair(
    shape: &Heads,
    pair: Pair,
    qkv: &[f32],
    out: Shared,
    mut probs: Option<&mut [MaybeUninit<f32>]>,
) {
    let (t, size, c) = (shape.seq, shape.size, shape.width());
    let (q, kt, v) = operands(shape, pair, qkv);
    with_scratch(QUERY_BLOCK * t, 0, |scores, _| {
        for q0 in (0..t).step_by(QUERY_BLOCK) {
            let rows = QUERY_BLOCK.min(t - q0);
            let keys = q0 + rows;
            let weights = &mut scores[..rows * keys];
            block_weights(shape, q.below(q0), kt, q0, rows, weights);
            if let Some(probs) = probs.as_deref_mut() {
                for (r, row) in weights.chunks_exact(keys).enumerate() {
                    let to = &mut probs[(q0 + r) * t..][..t];
                    for (to, &w) in to.iter_mut().zip(row) {
                        to.write(w);
                    }
                    to[keys..].iter_mut().for_each(|to| {
                        to.write(0.0);
                    });
                }
            }
            // SAFETY: the rows `q0..keys` of this head's columns (row stride `c`) lie in
            // `out` and are this pair's alone (the caller's contract).
            unsafe {
                let to = out.0.add((pair.base + q0) * c + pair.column);
                gemm_into(
                    rows,
                    keys,
                    size,
                    Mat::rows(weights, keys),
                    v,
                    to,
                    c,
                    false,
                    1,
                );
            }
        }
    });
}

/// A pair's queries, keys (transposed) and values, as strided views of `qkv`.
fn operands<'a>(shape: &Heads, pair: Pair, qkv: &'a [f32]) -> (Mat<'a>, Mat<'a>, Mat<'a>) {
    let (c, rs) = (shape.width(), 3 * shape.width());
    let at = |part: usize| &qkv[pair.base * rs + part * c + pair.column..];
    let q = Mat::strided(at(0), rs, 1);
    let kt = Mat::strided(at(1), 1, rs);
    let v = Mat::strided(at(2), rs, 1);
    (q, kt, v)
}

/// The softmax weights of query rows `q0..q0 + rows` (`q` starts at row `q0`) against keys
/// `0..q0 + rows` into `weights` (row-major, `q0 + rows` columns): the scores by one GEMM,
/// then each row's softmax over the keys up to its own position, zeros after.
fn block_weights(
    shape: &Heads,
    q: Mat<'_>,
    kt: Mat<'_>,
    q0: usize,
    rows: usize,
    weights: &mut [f32],
) {
    let keys = q0 + rows;
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the GEMM writes every element without
    // reading it, and the slice is initialised already (scratch).
    let raw = unsafe { &mut *(weights as *mut [f32] as *mut [MaybeUninit<f32>]) };
    gemm(rows, shape.size, keys, q, kt, raw, false, 1);
    softmax_rows(weights, keys, q0, shape.scale());
}

vectorized! {
    /// Row `r` of `weights` (rows of `keys`) becomes the softmax of `scale x` its first `q0 +
    /// r + 1` scores, and zeros after: `e^(scale (s - max))` over their sum.
    fn softmax_rows(weights: &mut [f32], keys: usize, q0: usize, scale: f32) {
        for (r, row) in weights.chunks_exact_mut(keys).enumerate() {
            let (valid, masked) = row.split_at_mut(q0 + r + 1);
            let max = Lanes::max_of(valid);
            for w in valid.iter_mut() {
                *w = exp((*w - max) * scale);
            }
            let inverse = 1.0 / Lanes::sum_of(valid, |w| w);
            valid.iter_mut().for_each(|w| *w *= inverse);
            masked.fill(0.0);
        }
    }
}

vectorized! {
    /// `ds = p (dp - d) scale`, row `r` with `d[r]`: the scores' gradient from the weights'.
    fn score_grad_rows(p: &[f32], dp: &mut [f32], keys: usize, d: &[f32], scale: f32) {
        for ((p, dp), &d) in p.chunks_exact(keys).zip(dp.chunks_exact_mut(keys)).zip(d) {
            for (g, &p) in dp.iter_mut().zip(p) {
                *g = p * (*g - d) * scale;
            }
        }
    }
}

vectorized! {
    /// `d[i] = sum over the head's columns of dout * out`, row `i` of the pair.
    fn output_dots(dout: &[f32], out: &[f32], row_stride: usize, size: usize, d: &mut [f32]) {
        for (i, d) in d.iter_mut().enumerate() {
            let at = i * row_stride;
            *d = Lanes::sum_of_pairs(&dout[at..][..size], &out[at..][..size], |g, o| g * o);
        }
    }
}

/// The gradient of the attention's input `qkv` into `dqkv` (same shape, every element
/// written), from the input, the output `out` and the output's gradient `dout`; with `probs`
/// (from [`forward`]) the weights are read back instead of computed again.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn backward(
    shape: Heads,
    qkv: &[f32],
    out: &[f32],
    dout: &[f32],
    probs: Option<&[f32]>,
    dqkv: &mut [MaybeUninit<f32>],
) {
    shape.check(qkv.len(), out.len().min(dout.len()));
    shape.check(dqkv.len(), out.len());
    if let Some(probs) = probs {
        assert!(
            probs.len() >= shape.probs_len().expect("checked"),
            "kept weights too short"
        );
    }
    let pairs = shape.batch * shape.heads;
    if shape.seq == 0 || pairs == 0 || shape.size == 0 {
        return;
    }
    let dqkv = Shared(dqkv.as_mut_ptr().cast());
    (0..pairs).into_par_iter().for_each(|index| {
        let pair = Pair::of(&shape, index);
        let probs = probs.map(|p| &p[index * shape.seq * shape.seq..][..shape.seq * shape.seq]);
        // SAFETY: each pair writes only its own head's columns of its sequence's rows of
        // `dqkv` (`Shared`'s contract), inside it (checked above).
        unsafe { backward_pair(&shape, pair, qkv, out, dout, probs, dqkv) };
    });
}

/// One pair of [`backward`].
///
/// # Safety
///
/// `dqkv` reaches the whole gradient, and no other reference reaches this pair's elements.
unsafe fn backward_pair(
    shape: &Heads,
    pair: Pair,
    qkv: &[f32],
    out: &[f32],
    dout: &[f32],
    probs: Option<&[f32]>,
    dqkv: Shared,
) {
    let (t, size, c, rs) = (shape.seq, shape.size, shape.width(), 3 * shape.width());
    let (q, kt, v) = operands(shape, pair, qkv);
    let k = Mat::strided(&qkv[pair.base * rs + c + pair.column..], rs, 1);
    let vt = Mat::strided(v.data, 1, rs);
    let head = pair.base * c + pair.column;
    let (out, dout) = (&out[head..], &dout[head..]);
    // SAFETY: every pointer below stays in this pair's rows and head columns of `dqkv` (the
    // caller's contract): rows `base..base + t`, columns `part x c + column ..+ size`.
    let at = |row: usize, part: usize| unsafe {
        dqkv.0.add((pair.base + row) * rs + part * c + pair.column)
    };
    for row in 0..t {
        for part in [1, 2] {
            // SAFETY: as above; the keys' and values' gradients are sums, zeroed first.
            unsafe { std::ptr::write_bytes(at(row, part), 0, size) };
        }
    }
    with_scratch(2 * QUERY_BLOCK * t, t, |blocks, d| {
        output_dots(dout, out, c, size, d);
        let (p, dp) = blocks.split_at_mut(QUERY_BLOCK * t);
        for q0 in (0..t).step_by(QUERY_BLOCK) {
            let rows = QUERY_BLOCK.min(t - q0);
            let keys = q0 + rows;
            let (p, dp) = (&mut p[..rows * keys], &mut dp[..rows * keys]);
            match probs {
                Some(kept) => {
                    for (r, row) in p.chunks_exact_mut(keys).enumerate() {
                        row.copy_from_slice(&kept[(q0 + r) * t..][..keys]);
                    }
                }
                None => block_weights(shape, q.below(q0), kt, q0, rows, p),
            }
            let dout_block = Mat::strided(&dout[q0 * c..], c, 1);
            // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the GEMM writes every element.
            let raw = unsafe { &mut *(&mut *dp as *mut [f32] as *mut [MaybeUninit<f32>]) };
            gemm(rows, size, keys, dout_block, vt, raw, false, 1);
            score_grad_rows(p, dp, keys, &d[q0..q0 + rows], shape.scale());
            let (p, ds) = (&*p, &*dp);
            // SAFETY: the three outputs are this pair's rows of the query, key and value
            // gradients (the caller's contract); the keys' and values' were zeroed above.
            unsafe {
                gemm_into(
                    rows,
                    keys,
                    size,
                    Mat::rows(ds, keys),
                    k,
                    at(q0, 0),
                    rs,
                    false,
                    1,
                );
                let ds_t = Mat::strided(ds, 1, keys);
                gemm_into(keys, rows, size, ds_t, q.below(q0), at(0, 1), rs, true, 1);
                let p_t = Mat::strided(p, 1, keys);
                gemm_into(keys, rows, size, p_t, dout_block, at(0, 2), rs, true, 1);
            }
        }
    });
}
