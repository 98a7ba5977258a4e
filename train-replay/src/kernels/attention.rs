//! Causal multi-head self-attention, fused as a CPU flash attention is. Each (sequence, head)
//! pair is one task: its queries, keys and values are gathered into this thread's scratch
//! (zero-padded to whole vectors), then the queries are taken a block of [`QUERY_BLOCK`] rows
//! at a time. A block's scores are computed only up to each group of rows' own position (the
//! masked half is never computed), turned into softmax weights in place and multiplied by the
//! values at once. No score matrix is kept: the backward pass computes each block's weights
//! again with the same operations in the same order, so they are the same bits (or, with
//! [`forward`]'s `probs`, reads them back).
//!
//! The products are register-tiled loops of fused multiply-adds over the padded scratch
//! (compiled for AVX-512, AVX2 and the baseline by [`vectorized!`](super::simd)): at a head
//! size of 32 the pair's operands are a few KiB, and a general GEMM call per block spent more
//! time packing and starting than multiplying.
//!
//! The input is the `q | k | v` projection of a GPT block, `batch x seq` rows of `3 x width`
//! columns, head `h` at columns `h x size ..` of each third; the output is `batch x seq` rows
//! of `width`. Every pair's work is fixed by the shapes, so the results are the same at any
//! thread count.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::scratch::with_scratch;
use super::simd::{exp, prefetch, vectorized, Lanes};

/// Query rows per block.
pub const QUERY_BLOCK: usize = 64;

/// Rows of a tile of the output products (queries) and of the key and value gradients (keys).
const ROWS: usize = 8;
/// Query rows of a tile of the score products.
const SCORE_ROWS: usize = 4;
/// Elements of a vector (AVX-512's `f32` lanes): the padding of the head and the keys.
const LANES: usize = 16;
/// Vectors of keys per tile of the score products.
const KEY_VECTORS: usize = 4;

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

    /// Elements of scratch a thread takes for a pair, at most (the backward pass's).
    pub fn scratch_len(&self) -> usize {
        let d = self.dims();
        7 * d.by_rows() + 2 * d.by_keys() + 2 * d.block() + d.rows
    }

    /// The scores' scale, `1 / sqrt(size)`.
    fn scale(&self) -> f32 {
        1.0 / (self.size as f32).sqrt()
    }

    /// The padded sizes of one pair's scratch.
    fn dims(&self) -> Dims {
        Dims {
            seq: self.seq,
            size: self.size,
            head: self.size.next_multiple_of(LANES),
            rows: self.seq.next_multiple_of(ROWS),
            keys: self.seq.next_multiple_of(LANES * KEY_VECTORS),
            scale: self.scale(),
        }
    }
}

/// One pair's sizes in its scratch: the head padded to whole vectors, the queries to whole
/// tiles, the keys to whole tiles of the score products. Padding is zeros, which adds
/// nothing to a sum, and padded rows and columns are never written out.
#[derive(Clone, Copy, Debug)]
struct Dims {
    seq: usize,
    size: usize,
    /// The head, padded.
    head: usize,
    /// Query rows, padded.
    rows: usize,
    /// Keys, padded.
    keys: usize,
    scale: f32,
}

impl Dims {
    /// Elements of a row-major `rows x head` operand (queries, gradients).
    fn by_rows(&self) -> usize {
        self.rows.max(self.keys) * self.head
    }

    /// Elements of a transposed `head x keys` operand (keys, values).
    fn by_keys(&self) -> usize {
        self.head * self.keys
    }

    /// Elements of a block's scores.
    fn block(&self) -> usize {
        QUERY_BLOCK * self.keys
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

/// Where one (sequence, head) pair's operands start in `qkv` (and its output in `out`).
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

    /// Gathers part `part` (0: queries, 1: keys, 2: values) of the pair from `qkv` into
    /// `to`, row by row (`head` elements a row) or, if `transposed`, column by column (`keys`
    /// elements a row). The head's padding is zeros; the rows past the sequence are left as
    /// they are (no sum reads them).
    fn gather(
        &self,
        shape: &Heads,
        d: &Dims,
        qkv: &[f32],
        part: usize,
        transposed: bool,
        to: &mut [f32],
    ) {
        let rs = 3 * shape.width();
        let from = &qkv[self.base * rs + part * shape.width() + self.column..];
        if transposed {
            to[d.size * d.keys..d.head * d.keys].fill(0.0);
            for t in 0..d.seq {
                prefetch_row(from, (t + PREFETCH) * rs, d.size);
                for (i, &v) in from[t * rs..][..d.size].iter().enumerate() {
                    to[i * d.keys + t] = v;
                }
            }
        } else {
            copy_rows(d, from, rs, to);
        }
    }

    /// Gathers the pair's columns of a `batch x seq` by `width` matrix (an output or its
    /// gradient), row by row, into `to` (the head's padding zeros).
    fn gather_out(&self, shape: &Heads, d: &Dims, from: &[f32], to: &mut [f32]) {
        let c = shape.width();
        copy_rows(d, &from[self.base * c + self.column..], c, to);
    }

    /// Writes the pair's rows `from` (`head` elements a row) to its columns of part `part` of
    /// a matrix of `parts x width` columns at `to`.
    ///
    /// # Safety
    ///
    /// `to` reaches the whole matrix and no other reference reaches this pair's elements.
    unsafe fn scatter(
        &self,
        shape: &Heads,
        d: &Dims,
        from: &[f32],
        to: Shared,
        parts: usize,
        part: usize,
    ) {
        let (c, rs) = (shape.width(), parts * shape.width());
        for t in 0..d.seq {
            let row = &from[t * d.head..][..d.size];
            // SAFETY: row `base + t`, columns `part x c + column .. + size`, are this pair's
            // (the caller's contract) and lie inside the matrix.
            let at = unsafe { to.0.add((self.base + t) * rs + part * c + self.column) };
            for (i, &v) in row.iter().enumerate() {
                // SAFETY: as above, element `i < size` of that row.
                unsafe { at.add(i).write(v) };
            }
        }
    }
}

/// Copies `seq` rows of `size` elements, `stride` apart in `from`, into `to`'s rows of `head`
/// (the padding zeros), element by element (a call to `memcpy` a row cost more than the row).
fn copy_rows(d: &Dims, from: &[f32], stride: usize, to: &mut [f32]) {
    for t in 0..d.seq {
        prefetch_row(from, (t + PREFETCH) * stride, d.size);
        let (row, to) = (
            &from[t * stride..][..d.size],
            &mut to[t * d.head..][..d.head],
        );
        let (data, padding) = to.split_at_mut(d.size);
        let (mut to, mut from) = (data.chunks_exact_mut(LANES), row.chunks_exact(LANES));
        for (to, from) in (&mut to).zip(&mut from) {
            let (to, from): (&mut [f32; LANES], &[f32; LANES]) = (
                to.try_into().expect("a vector"),
                from.try_into().expect("a vector"),
            );
            *to = *from;
        }
        for (to, &v) in to.into_remainder().iter_mut().zip(from.remainder()) {
            *to = v;
        }
        padding.fill(0.0);
    }
}

/// Rows ahead that a gather asks for (about the rows whose lines are on their way at once).
const PREFETCH: usize = 8;

/// Prefetches the `len` elements at `from[at..]`, a row a gather reads soon (past the end of
/// `from` is harmless: a prefetch never faults).
#[inline(always)]
fn prefetch_row(from: &[f32], at: usize, len: usize) {
    let row = from.as_ptr().wrapping_add(at);
    for line in (0..len).step_by(16) {
        prefetch(row.wrapping_add(line));
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
    let run = |index: usize, probs: Option<&mut [MaybeUninit<f32>]>| {
        let (pair, d) = (Pair::of(&shape, index), shape.dims());
        let len = 2 * d.by_rows() + 2 * d.by_keys() + d.block();
        with_scratch(len, 0, |scratch, _| {
            let (q, rest) = scratch.split_at_mut(d.by_rows());
            let (kt, rest) = rest.split_at_mut(d.by_keys());
            let (v, rest) = rest.split_at_mut(d.by_keys());
            let (o, scores) = rest.split_at_mut(d.by_rows());
            pair.gather(&shape, &d, qkv, 0, false, q);
            pair.gather(&shape, &d, qkv, 1, true, kt);
            pair.gather(&shape, &d, qkv, 2, false, v);
            attend(d, q, kt, v, scores, o, probs);
            // SAFETY: each pair writes only its own head's columns of its own sequence's
            // rows (`Shared`'s contract), inside `out` (checked by `shape.check`).
            unsafe { pair.scatter(&shape, &d, o, out, 1, 0) };
        });
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

vectorized! {
    /// One pair's forward pass on its gathered operands: `q` (rows), `kt` (keys transposed),
    /// `v` (rows) into `o` (rows); `scores` is a block's scratch.
    fn attend(
        d: Dims,
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        scores: &mut [f32],
        o: &mut [f32],
        probs: Option<&mut [MaybeUninit<f32>]>,
    ) {
        let mut probs = probs;
        for q0 in (0..d.seq).step_by(QUERY_BLOCK) {
            let rows = QUERY_BLOCK.min(d.seq - q0);
            let weights = &mut scores[..QUERY_BLOCK * d.keys];
            // Kept weights are read whole; the products read up to the block's last row.
            let zeros_to = if probs.is_some() { d.seq } else { (q0 + QUERY_BLOCK).min(d.keys) };
            block_weights(d, (q, kt), q0, rows, weights, zeros_to);
            if let Some(probs) = probs.as_deref_mut() {
                for r in 0..rows {
                    let to = &mut probs[(q0 + r) * d.seq..][..d.seq];
                    for (to, &w) in to.iter_mut().zip(&weights[r * d.keys..]) {
                        to.write(w);
                    }
                }
            }
            for r0 in (0..rows).step_by(ROWS) {
                // The tile's last row reaches key q0 + r0 + ROWS - 1; the weights after it
                // are zeros.
                let reach = (q0 + r0 + ROWS).min(d.seq);
                let tile = &mut o[(q0 + r0) * d.head..][..ROWS * d.head];
                weighted_rows(d, &weights[r0 * d.keys..], v, reach, tile, false);
            }
        }
    }
}

/// The softmax weights of query rows `q0..q0 + rows` into `weights` (`QUERY_BLOCK` rows of
/// `keys`): their scores against the keys up to each tile's last row, by tiles of fused
/// multiply-adds, then each row's softmax over the keys up to its own position, zeros after
/// up to key `zeros_to` (as far as the block's readers read: the whole sequence for kept
/// weights, else the block's last position rounded up to a slab of keys, at most `keys`).
#[inline(always)]
fn block_weights(
    d: Dims,
    (q, kt): (&[f32], &[f32]),
    q0: usize,
    rows: usize,
    weights: &mut [f32],
    zeros_to: usize,
) {
    scores(d, q, kt, q0, rows, weights);
    for (r, row) in weights.chunks_exact_mut(d.keys).take(rows).enumerate() {
        let (valid, masked) = row[..zeros_to].split_at_mut((q0 + r + 1).min(d.seq));
        softmax(valid, d.scale);
        masked.fill(0.0);
    }
}

/// `values` becomes its softmax of `scale x` itself: `e^(scale (v - max))` over their sum,
/// the sum in [`Lanes`]' order, taken as the powers are written.
#[inline(always)]
fn softmax(values: &mut [f32], scale: f32) {
    let max = Lanes::max_of(values);
    let mut lanes = Lanes::zero();
    let mut chunks = values.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (lane, w) in lanes.0.iter_mut().zip(chunk) {
            *w = exp((*w - max) * scale);
            *lane += *w;
        }
    }
    for (lane, w) in lanes.0.iter_mut().zip(chunks.into_remainder()) {
        *w = exp((*w - max) * scale);
        *lane += *w;
    }
    let inverse = 1.0 / lanes.total();
    values.iter_mut().for_each(|w| *w *= inverse);
}

/// The scores of query rows `q0..q0 + rows` of `a` (rows of `head`) against the keys `kt`
/// (transposed), into `out` (rows of `keys`): each tile of rows against the keys up to its
/// last row only, rounded up to a vector of keys; what lies after is left as it was. The
/// keys are taken a slab of `LANES x KEY_VECTORS` at a time, every tile of rows against one
/// slab before the next, so the slab stays in the core's first cache while the rows sweep it
/// (rows against every slab in turn read all the keys from the second cache once per tile).
#[inline(always)]
fn scores(d: Dims, a: &[f32], kt: &[f32], q0: usize, rows: usize, out: &mut [f32]) {
    const WIDE: usize = LANES * KEY_VECTORS;
    let seen = (q0 + rows).min(d.keys); // keys the block's last row can see, at most
                                        // A block's rows all see its first key, and a slab starts at most there, so every tile
                                        // meets every slab up to the block's.
    const _: () = assert!(WIDE == QUERY_BLOCK && QUERY_BLOCK.is_multiple_of(SCORE_ROWS));
    for j0 in (0..seen).step_by(WIDE) {
        for r0 in (0..rows).step_by(SCORE_ROWS) {
            let a = &a[(q0 + r0) * d.head..][..SCORE_ROWS * d.head];
            let out = &mut out[r0 * d.keys..];
            // Keys of the slab the tile's rows can see, in whole vectors.
            let reach = (q0 + r0 + SCORE_ROWS).min(d.keys) - j0;
            match reach.div_ceil(LANES) {
                1 => score_tile::<1>(d, a, kt, j0, out),
                2 => score_tile::<2>(d, a, kt, j0, out),
                3 => score_tile::<3>(d, a, kt, j0, out),
                _ => score_tile::<KEY_VECTORS>(d, a, kt, j0, out),
            }
        }
    }
}

/// `SCORE_ROWS` rows of scores against keys `j0..j0 + LANES x V`: `out[r][j] = sum over the
/// head of a[r] x kt[.][j]` (row `r` of `out` at `r x keys`), each sum in the head's order.
#[inline(always)]
fn score_tile<const V: usize>(d: Dims, a: &[f32], kt: &[f32], j0: usize, out: &mut [f32]) {
    let mut acc = [[[0.0f32; LANES]; V]; SCORE_ROWS];
    for i in 0..d.head {
        let keys = &kt[i * d.keys + j0..][..V * LANES];
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = a[r * d.head + i];
            for (acc, keys) in acc.iter_mut().zip(keys.chunks_exact(LANES)) {
                for (acc, &k) in acc.iter_mut().zip(keys) {
                    *acc = x.mul_add(k, *acc);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let to = &mut out[r * d.keys + j0..][..V * LANES];
        for (to, acc) in to.chunks_exact_mut(LANES).zip(acc) {
            to.copy_from_slice(acc);
        }
    }
}

/// `ROWS` rows of `p x b` (or `+=` if `accumulate`): `out[r] = sum over keys j < reach of
/// p[r][j] x b[j]`, `p` rows of `keys`, `b` and `out` rows of `head`.
#[inline(always)]
fn weighted_rows(d: Dims, p: &[f32], b: &[f32], reach: usize, out: &mut [f32], accumulate: bool) {
    for h0 in (0..d.head).step_by(2 * LANES) {
        if d.head - h0 >= 2 * LANES {
            weighted_tile::<{ 2 * LANES }>(d, p, b, reach, h0, out, accumulate);
        } else {
            weighted_tile::<LANES>(d, p, b, reach, h0, out, accumulate);
        }
    }
}

/// [`weighted_rows`] for the head's columns `h0..h0 + W`.
#[inline(always)]
fn weighted_tile<const W: usize>(
    d: Dims,
    p: &[f32],
    b: &[f32],
    reach: usize,
    h0: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    let mut acc = [[0.0f32; W]; ROWS];
    for j in 0..reach {
        let row: &[f32; W] = b[j * d.head + h0..][..W].try_into().expect("a tile");
        for (r, acc) in acc.iter_mut().enumerate() {
            let w = p[r * d.keys + j];
            for (acc, &x) in acc.iter_mut().zip(row) {
                *acc = w.mul_add(x, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let to = &mut out[r * d.head + h0..][..W];
        if accumulate {
            to.iter_mut().zip(acc).for_each(|(t, a)| *t += a);
        } else {
            to.copy_from_slice(acc);
        }
    }
}

/// Adds to keys `j0..j0 + ROWS` of `out` (rows of `head`) `sum over query rows r in
/// from..rows of p[r][j] x x[r]`, `p` rows of `keys`, `x` rows of `head`.
#[inline(always)]
fn key_rows(d: Dims, p: &[f32], x: &[f32], j0: usize, from: usize, rows: usize, out: &mut [f32]) {
    for h0 in (0..d.head).step_by(2 * LANES) {
        if d.head - h0 >= 2 * LANES {
            key_tile::<{ 2 * LANES }>(d, p, x, j0, from, rows, h0, out);
        } else {
            key_tile::<LANES>(d, p, x, j0, from, rows, h0, out);
        }
    }
}

/// [`key_rows`] for the head's columns `h0..h0 + W`.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // a tile's operands and bounds
fn key_tile<const W: usize>(
    d: Dims,
    p: &[f32],
    x: &[f32],
    j0: usize,
    from: usize,
    rows: usize,
    h0: usize,
    out: &mut [f32],
) {
    let mut acc = [[0.0f32; W]; ROWS];
    for r in from..rows {
        let row: &[f32; W] = x[r * d.head + h0..][..W].try_into().expect("a tile");
        for (j, acc) in acc.iter_mut().enumerate() {
            let w = p[r * d.keys + j0 + j];
            for (acc, &x) in acc.iter_mut().zip(row) {
                *acc = w.mul_add(x, *acc);
            }
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        let to = &mut out[(j0 + j) * d.head + h0..][..W];
        to.iter_mut().zip(acc).for_each(|(t, a)| *t += a);
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
        let (pair, d) = (Pair::of(&shape, index), shape.dims());
        let probs = probs.map(|p| &p[index * shape.seq * shape.seq..][..shape.seq * shape.seq]);
        with_scratch(shape.scratch_len(), 0, |scratch, _| {
            let (q, rest) = scratch.split_at_mut(d.by_rows());
            let (kt, rest) = rest.split_at_mut(d.by_keys());
            let (k, rest) = rest.split_at_mut(d.by_rows());
            let (vt, rest) = rest.split_at_mut(d.by_keys());
            let (o, rest) = rest.split_at_mut(d.by_rows());
            let (g, rest) = rest.split_at_mut(d.by_rows());
            let (dq, rest) = rest.split_at_mut(d.by_rows());
            let (dk, rest) = rest.split_at_mut(d.by_rows());
            let (dv, rest) = rest.split_at_mut(d.by_rows());
            let (p, rest) = rest.split_at_mut(d.block());
            let (dp, dots) = rest.split_at_mut(d.block());
            pair.gather(&shape, &d, qkv, 0, false, q);
            pair.gather(&shape, &d, qkv, 1, true, kt);
            pair.gather(&shape, &d, qkv, 1, false, k);
            pair.gather(&shape, &d, qkv, 2, true, vt);
            pair.gather_out(&shape, &d, out, o);
            pair.gather_out(&shape, &d, dout, g);
            let operands = Operands { q, kt, k, vt, o, g };
            dk.fill(0.0);
            dv.fill(0.0);
            attend_backward(d, &operands, probs, p, dp, dots, dq, dk, dv);
            for (part, from) in [(0, &*dq), (1, &*dk), (2, &*dv)] {
                // SAFETY: each pair writes only its own head's columns of its sequence's
                // rows of `dqkv` (`Shared`'s contract), inside it (checked above).
                unsafe { pair.scatter(&shape, &d, from, dqkv, 3, part) };
            }
        });
    });
}

/// One pair's gathered operands for its backward pass (each padded: see [`Dims`]).
struct Operands<'a> {
    /// Queries, rows.
    q: &'a [f32],
    /// Keys, transposed.
    kt: &'a [f32],
    /// Keys, rows.
    k: &'a [f32],
    /// Values, transposed.
    vt: &'a [f32],
    /// The output, rows.
    o: &'a [f32],
    /// The output's gradient, rows.
    g: &'a [f32],
}

vectorized! {
    /// One pair's backward pass: the gradients of its queries, keys and values (rows; the
    /// keys' and values' summed into `dk` and `dv`, zeroed by the caller), block by block of
    /// queries. `p`, `dp` and `dots` are scratch.
    #[allow(clippy::too_many_arguments)] // the pair's operands, scratch and gradients
    fn attend_backward(
        d: Dims,
        x: &Operands<'_>,
        probs: Option<&[f32]>,
        p: &mut [f32],
        dp: &mut [f32],
        dots: &mut [f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        // dots[i] = dout[i] . out[i]: the softmax's correction.
        for (i, dot) in dots.iter_mut().enumerate().take(d.seq) {
            let at = i * d.head;
            *dot = Lanes::sum_of_pairs(&x.g[at..][..d.head], &x.o[at..][..d.head], |g, o| g * o);
        }
        for q0 in (0..d.seq).step_by(QUERY_BLOCK) {
            let rows = QUERY_BLOCK.min(d.seq - q0);
            match probs {
                Some(kept) => {
                    p.fill(0.0);
                    for r in 0..rows {
                        p[r * d.keys..][..d.seq].copy_from_slice(&kept[(q0 + r) * d.seq..][..d.seq]);
                    }
                }
                None => block_weights(d, (x.q, x.kt), q0, rows, p, (q0 + QUERY_BLOCK).min(d.keys)),
            }
            // dp = dout vt over the keys each tile can see; then ds = p (dp - dot) scale over
            // the keys each row sees, and zeros after (where p is 0) as far as the readers
            // below read: the block's last position, rounded up to a tile of rows.
            scores(d, x.g, x.vt, q0, rows, dp);
            let seen = (q0 + QUERY_BLOCK).min(d.keys);
            for r in 0..rows {
                let dot = dots[q0 + r];
                let (valid, after) = dp[r * d.keys..][..seen].split_at_mut(q0 + r + 1);
                for (g, &w) in valid.iter_mut().zip(&p[r * d.keys..]) {
                    *g = w * (*g - dot) * d.scale;
                }
                after.fill(0.0);
            }
            let ds = &*dp;
            for r0 in (0..rows).step_by(ROWS) {
                let reach = (q0 + r0 + ROWS).min(d.seq);
                let tile = &mut dq[(q0 + r0) * d.head..][..ROWS * d.head];
                weighted_rows(d, &ds[r0 * d.keys..], x.k, reach, tile, false);
            }
            // The keys' and values' gradients: key j gets the rows of the block that see it.
            let block_q = &x.q[q0 * d.head..];
            let block_g = &x.g[q0 * d.head..];
            for j0 in (0..(q0 + rows).next_multiple_of(ROWS)).step_by(ROWS) {
                let from = j0.saturating_sub(q0);
                key_rows(d, ds, block_q, j0, from, rows, dk);
                key_rows(d, p, block_g, j0, from, rows, dv);
            }
        }
    }
}
