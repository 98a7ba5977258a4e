//! Causal multi-head self-attention, fused as a CPU flash attention is, in a fixed tile of
//! scratch per task. A task takes one (sequence, head) pair, or several when a pair is small
//! (at least [`TASK_WORK`] multiply-adds a task). A pair's queries are taken a block
//! of [`BLOCK`] rows at a time, and for each such block its keys and values a block of
//! [`BLOCK`] at a time, up to the block's own positions (the masked half is never computed):
//! only those blocks are gathered into the task's scratch (zero-padded to whole vectors, from
//! a [`Stash`] the threads share), so what a task holds depends on the head's size alone,
//! not on the context, and a pass keeps at most [`Heads::tasks`] of them.
//!
//! The scores are laid out key by key (`s[key][row]`): a block of queries is transposed once,
//! each block of keys and values is gathered as plain rows, and the softmax runs down
//! sixteen query rows side by side (no sum across a vector), masking only the keys that some
//! of the sixteen do not see.
//!
//! The softmax runs online: for each row a running maximum and sum, the earlier blocks'
//! output rescaled when the maximum grows, and the row divided by its sum once its last block
//! is in. No score matrix is kept: the forward pass keeps each row's log-sum-exp (one number
//! a row), from which the backward pass computes each block's weights again; with
//! [`forward`]'s `probs` the weights are written out and read back instead (the same bits).
//! The key and value gradients are summed block by block into the output itself.
//!
//! The products are register-tiled loops of fused multiply-adds over the padded blocks
//! (compiled for AVX-512, AVX2 and the baseline by [`vectorized!`](super::simd)): at a head
//! size of 32 a block's operands are a few KiB, and a general GEMM call per block spent more
//! time packing and starting than multiplying.
//!
//! The input is the `q | k | v` projection of a GPT block, `batch x seq` rows of `3 x width`
//! columns, head `h` at columns `h x size ..` of each third; the output is `batch x seq` rows
//! of `width`. Every pair's work is fixed by the shapes, so the results are the same at any
//! thread count.

use std::mem::MaybeUninit;

use rayon::iter::Either;
use rayon::prelude::*;

use super::scratch::Stash;
use super::simd::{exp, prefetch, vectorized, Lanes};

/// Query rows, and keys, per block.
pub const BLOCK: usize = 64;

/// Multiply-adds a task's forward pass does at least (`2^21`, about a tenth of a millisecond
/// here): a pass gives each task enough (sequence, head) pairs for it, so that a small
/// attention runs on a few tasks, not on every thread, and keeps as few blocks of scratch.
pub const TASK_WORK: usize = 1 << 21;

/// The tasks' scratch: as many buffers as tasks ran at once.
static SCRATCH: Stash = Stash::new();

/// Rows of a tile of the output products (queries) and of the key and value gradients (keys).
const ROWS: usize = 8;
/// Keys of a tile of the score products.
const SCORE_KEYS: usize = 4;
/// Elements of a vector (AVX-512's `f32` lanes): the padding of the head and of the rows.
const LANES: usize = 16;
/// Vectors of query rows in a block: a tile of the score products spans up to all of them.
const QUERY_VECTORS: usize = BLOCK / LANES;
const _: () = assert!(
    BLOCK.is_multiple_of(LANES)
        && LANES.is_multiple_of(ROWS)
        && BLOCK.is_multiple_of(SCORE_KEYS)
        && QUERY_VECTORS >= 1
        && QUERY_VECTORS <= 4
);

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

    /// Elements of the rows' statistics ([`forward`]'s `stats`): `batch x heads x seq`.
    pub fn stats_len(&self) -> Option<usize> {
        self.batch.checked_mul(self.heads)?.checked_mul(self.seq)
    }

    /// Pairs a task of a pass takes at least: enough for [`TASK_WORK`] multiply-adds (a
    /// pair's forward pass does about `seq x seq x size`).
    pub fn pairs_per_task(&self) -> usize {
        let pair = self.seq.saturating_mul(self.seq).saturating_mul(self.size);
        TASK_WORK.div_ceil(pair.max(1))
    }

    /// The most tasks of a pass that run at once, whatever the threads: so the most buffers
    /// of scratch ([`Heads::scratch_len`] each) the passes keep.
    pub fn tasks(&self) -> usize {
        (self.batch.saturating_mul(self.heads) / self.pairs_per_task()).max(1)
    }

    /// Panics unless `qkv` and an output of `out` elements fit the shape, the statistics'
    /// and the pairs' counts fit a `usize` and the heads have elements.
    fn check(&self, qkv: usize, out: usize) {
        assert!(self.size > 0, "heads of no elements");
        let pairs = self.batch.checked_mul(self.heads);
        assert!(
            pairs.is_some() && self.stats_len().is_some(),
            "more pairs than a usize counts"
        );
        let rows = self
            .batch
            .checked_mul(self.seq)
            .zip(self.heads.checked_mul(self.size))
            .and_then(|(rows, width)| rows.checked_mul(width));
        let ok = rows.is_some_and(|len| len.checked_mul(3).is_some_and(|l| qkv >= l) && out >= len);
        assert!(ok, "operands too short for their shapes");
    }

    /// Elements of scratch a task takes, at most (the backward pass's): nine
    /// blocks of the head (queries and the output's gradient, each transposed and as rows,
    /// keys, values, and the three gradients), two blocks of weights and two numbers a query
    /// row. A function of the head's size alone: `9 x 64 x 32 + 2 x 64 x 64 + 2 x 64` floats
    /// (104.5 KiB) at a head of 32, whatever the context.
    pub fn scratch_len(&self) -> usize {
        let d = self.dims();
        Backward::len(&d).max(Forward::len(&d))
    }

    /// The scores' scale, `1 / sqrt(size)`.
    fn scale(&self) -> f32 {
        1.0 / (self.size as f32).sqrt()
    }

    /// The padded sizes of one pair's blocks.
    fn dims(&self) -> Dims {
        Dims {
            seq: self.seq,
            size: self.size,
            // Saturating: a head too large for memory (which `check` refuses before any
            // kernel runs) gives sizes no buffer meets, not a wrapped small one.
            head: self.size.saturating_add(LANES - 1) / LANES * LANES,
            keys: BLOCK,
            scale: self.scale(),
        }
    }
}

/// One pair's sizes: the head padded to whole vectors in its blocks. Padding is zeros, which
/// adds nothing to a sum, and padded rows and columns are never written out.
#[derive(Clone, Copy, Debug)]
struct Dims {
    seq: usize,
    size: usize,
    /// The head, padded.
    head: usize,
    /// `BLOCK`: the row length of a block of weights and of a transposed block (a field, not
    /// the constant, in the products: the compiler vectorises a constant stride across the
    /// wrong loop).
    keys: usize,
    scale: f32,
}

impl Dims {
    /// Elements of a block of the head: `BLOCK` rows of `head` (queries, keys, values,
    /// gradients) or its transpose (queries, the output's gradient).
    fn tile(&self) -> usize {
        BLOCK.saturating_mul(self.head)
    }
}

/// Where a block lies: its queries `q0 .. q0 + rows` against its keys `j0 .. j0 + keys`.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// First query row.
    q0: usize,
    /// Query rows (at most `BLOCK`).
    rows: usize,
    /// First key.
    j0: usize,
    /// Keys (at most `BLOCK`).
    keys: usize,
}

impl Span {
    /// The block of query block `qb` against key block `kb` (`kb <= qb`) of a pair.
    fn of(d: &Dims, qb: usize, kb: usize) -> Self {
        let (q0, j0) = (qb * BLOCK, kb * BLOCK);
        Self {
            q0,
            rows: BLOCK.min(d.seq - q0),
            j0,
            keys: BLOCK.min(d.seq - j0),
        }
    }

    /// Keys of the block that query row `r` (of the block) sees: those up to its position
    /// (none for a row past the block's).
    #[inline(always)]
    fn seen(&self, r: usize) -> usize {
        match r < self.rows {
            true => self.keys.min(self.q0 - self.j0 + r + 1),
            false => 0,
        }
    }

    /// Keys that the query rows `r0 .. r0 + tile` reach: their last row's (within the block).
    #[inline(always)]
    fn reach(&self, r0: usize, tile: usize) -> usize {
        self.seen((r0 + tile).min(self.rows) - 1)
    }

    /// The first query row of the block that sees key `j` (of the block).
    #[inline(always)]
    fn first_seeing(&self, j: usize) -> usize {
        (self.j0 + j).saturating_sub(self.q0)
    }

    /// The block's keys rounded up to a tile of [`ROWS`]: as far as the key gradients' tiles
    /// read a block of weights.
    #[inline(always)]
    fn key_tiles(&self) -> usize {
        self.keys.next_multiple_of(ROWS)
    }
}

/// Query blocks (and key blocks) of a sequence of `seq`.
fn blocks(seq: usize) -> usize {
    seq.div_ceil(BLOCK)
}

/// A pointer to an output that the tasks share, each writing its own elements.
#[derive(Clone, Copy)]
struct Shared(*mut f32);

// SAFETY: the tasks that share it write disjoint elements (each its own head's columns of its
// own sequence's rows), and the borrow it came from outlives them (`for_each` returns after
// every task).
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

/// A matrix of rows `stride` apart, seen from one pair's first row and first column.
#[derive(Clone, Copy)]
struct Source<'a> {
    data: &'a [f32],
    stride: usize,
}

impl Source<'_> {
    /// Copies rows `t0 .. t0 + n` (`size` elements each) into `to`'s `BLOCK` rows of `head`:
    /// the head's padding and the rows from `n` on are zeros.
    #[inline(always)]
    fn rows(&self, d: &Dims, t0: usize, n: usize, to: &mut [f32]) {
        let from = &self.data[t0 * self.stride..];
        for t in 0..n {
            prefetch_row(from, (t + PREFETCH) * self.stride, d.size);
            let (row, to) = (
                &from[t * self.stride..][..d.size],
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
        to[n * d.head..d.tile()].fill(0.0);
    }

    /// Copies rows `t0 .. t0 + n` transposed into `to`'s `head` rows of `BLOCK`: element `i`
    /// of row `t0 + j` to `to[i x BLOCK + j]`; the head's padding and the columns from `n` on
    /// are zeros. A square of `LANES` rows by `LANES` elements at a time: whole vectors in,
    /// whole vectors out.
    #[inline(always)]
    fn transposed(&self, d: &Dims, t0: usize, n: usize, to: &mut [f32]) {
        let from = &self.data[t0 * self.stride..];
        to[d.size * BLOCK..d.tile()].fill(0.0);
        for j0 in (0..n).step_by(LANES) {
            let rows = (n - j0).min(LANES);
            for i0 in (0..d.size).step_by(LANES) {
                let columns = (d.size - i0).min(LANES);
                let mut square = [[0.0f32; LANES]; LANES];
                for (j, square) in square.iter_mut().enumerate().take(rows) {
                    if i0 == 0 {
                        prefetch_row(from, (j0 + j + PREFETCH) * self.stride, d.size);
                    }
                    let row = &from[(j0 + j) * self.stride + i0..][..columns];
                    if let Ok(row) = <&[f32; LANES]>::try_from(row) {
                        *square = *row;
                    } else {
                        square[..columns].copy_from_slice(row);
                    }
                }
                for i in 0..columns {
                    let to: &mut [f32; LANES] = (&mut to[(i0 + i) * BLOCK + j0..][..LANES])
                        .try_into()
                        .expect("a vector");
                    for (to, square) in to.iter_mut().zip(&square) {
                        *to = square[i];
                    }
                }
            }
        }
        let end = n.next_multiple_of(LANES);
        if end < BLOCK {
            for row in to[..d.size * BLOCK].chunks_exact_mut(BLOCK) {
                row[end..].fill(0.0);
            }
        }
    }

    /// Row `t`'s `size` elements.
    #[inline(always)]
    fn row(&self, d: &Dims, t: usize) -> &[f32] {
        &self.data[t * self.stride..][..d.size]
    }
}

/// One (sequence, head) pair: where its operands start in `qkv` and its output in `out`.
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

    /// The pair's part `part` (0: queries, 1: keys, 2: values) of the input `qkv`.
    fn part<'a>(&self, shape: &Heads, qkv: &'a [f32], part: usize) -> Source<'a> {
        let stride = 3 * shape.width();
        Source {
            data: &qkv[self.base * stride + part * shape.width() + self.column..],
            stride,
        }
    }

    /// The pair's columns of a `batch x seq` by `width` matrix (an output or its gradient).
    fn columns<'a>(&self, shape: &Heads, from: &'a [f32]) -> Source<'a> {
        let stride = shape.width();
        Source {
            data: &from[self.base * stride + self.column..],
            stride,
        }
    }

    /// Writes (or, if `add`, adds) rows `0..n` of the block `from` (rows of `head`) to the
    /// pair's rows `t0 .. t0 + n`, columns of part `part`, of a matrix of `parts x width`
    /// columns at `to`.
    ///
    /// # Safety
    ///
    /// `to` reaches the whole matrix, no other reference reaches this pair's elements, and
    /// with `add` the elements were written before.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // a block, its rows, and where they go
    unsafe fn scatter(
        &self,
        shape: &Heads,
        d: &Dims,
        from: &[f32],
        (t0, n): (usize, usize),
        to: Shared,
        (parts, part): (usize, usize),
        add: bool,
    ) {
        let (c, rs) = (shape.width(), parts * shape.width());
        for t in 0..n {
            let row = &from[t * d.head..][..d.size];
            // SAFETY: row `base + t0 + t`, columns `part x c + column .. + size`, are this
            // pair's (the caller's contract) and lie inside the matrix (`t0 + t < seq`).
            let at = unsafe { to.0.add((self.base + t0 + t) * rs + part * c + self.column) };
            for (i, &v) in row.iter().enumerate() {
                // SAFETY: as above, element `i < size` of that row; with `add` it was
                // written before (the caller's contract), so it is initialised.
                unsafe {
                    let at = at.add(i);
                    at.write(if add { at.read() + v } else { v });
                }
            }
        }
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

/// One pair's inputs: its queries, keys and values.
struct Inputs<'a> {
    q: Source<'a>,
    k: Source<'a>,
    v: Source<'a>,
}

impl<'a> Inputs<'a> {
    fn of(shape: &Heads, pair: Pair, qkv: &'a [f32]) -> Self {
        Self {
            q: pair.part(shape, qkv, 0),
            k: pair.part(shape, qkv, 1),
            v: pair.part(shape, qkv, 2),
        }
    }
}

/// Splits `scratch` into `N` blocks of `tile` elements, `M` of `BLOCK x BLOCK` and the
/// rest.
#[allow(clippy::type_complexity)] // the three kinds of parts
fn split<'a, const N: usize, const M: usize>(
    d: &Dims,
    scratch: &'a mut [f32],
) -> ([&'a mut [f32]; N], [&'a mut [f32]; M], &'a mut [f32]) {
    let (tiles, rest) = scratch.split_at_mut(N * d.tile());
    let (squares, rest) = rest.split_at_mut(M * BLOCK * BLOCK);
    let mut tiles = tiles.chunks_exact_mut(d.tile());
    let mut squares = squares.chunks_exact_mut(BLOCK * BLOCK);
    (
        std::array::from_fn(|_| tiles.next().expect("N tiles")),
        std::array::from_fn(|_| squares.next().expect("M squares")),
        rest,
    )
}

/// A task's scratch for a pair's forward pass (the first [`Forward::len`] elements of a
/// buffer of [`Heads::scratch_len`], so that the stash's buffers are alike): a block of
/// queries (transposed), keys, values and output rows, a block of scores (key by key), and
/// each query row's running maximum, sum and correction.
struct Forward<'a> {
    qt: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    o: &'a mut [f32],
    s: &'a mut [f32],
    m: &'a mut [f32],
    l: &'a mut [f32],
    corr: &'a mut [f32],
}

impl<'a> Forward<'a> {
    fn len(d: &Dims) -> usize {
        d.tile()
            .saturating_mul(4)
            .saturating_add(BLOCK * BLOCK + 3 * BLOCK)
    }

    fn split(d: &Dims, scratch: &'a mut [f32]) -> Self {
        let ([qt, k, v, o], [s], rest) = split::<4, 1>(d, scratch);
        let (m, rest) = rest.split_at_mut(BLOCK);
        let (l, corr) = rest.split_at_mut(BLOCK);
        Self {
            qt,
            k,
            v,
            o,
            s,
            m,
            l,
            corr: &mut corr[..BLOCK],
        }
    }
}

/// The attention's output into `out` (`batch x seq` rows of `width`, every element written);
/// with `stats` (`batch x heads x seq`, pair by pair), each query row's log-sum-exp of its
/// scaled scores (what [`backward`] computes the weights from); with `probs` (`batch x heads x
/// seq x seq`), each pair's softmax weights (row `i` of a pair: the weights of keys `0..=i`,
/// zeros after).
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn forward(
    shape: Heads,
    qkv: &[f32],
    out: &mut [MaybeUninit<f32>],
    stats: Option<&mut [MaybeUninit<f32>]>,
    probs: Option<&mut [MaybeUninit<f32>]>,
) {
    shape.check(qkv.len(), out.len());
    let (t, pairs) = (shape.seq, shape.batch * shape.heads);
    if t == 0 || pairs == 0 {
        return;
    }
    // Each pair's rows of the statistics and of the kept weights, if asked for.
    let stats = match stats {
        Some(stats) => {
            let len = shape.stats_len().expect("checked above");
            assert!(stats.len() >= len, "the statistics' buffer is too short");
            Either::Left(stats[..len].par_chunks_mut(t).map(Some))
        }
        None => Either::Right((0..pairs).into_par_iter().map(|_| None)),
    };
    let probs = match probs {
        Some(probs) => {
            let len = shape
                .probs_len()
                .expect("the kept weights' count overflows");
            assert!(probs.len() >= len, "the kept weights' buffer is too short");
            Either::Left(probs[..len].par_chunks_mut(t * t).map(Some))
        }
        None => Either::Right((0..pairs).into_par_iter().map(|_| None)),
    };
    let out = Shared(out.as_mut_ptr().cast());
    stats
        .zip(probs)
        .enumerate()
        .with_min_len(shape.pairs_per_task())
        .for_each(|(index, (mut stats, mut probs))| {
            let (pair, d) = (Pair::of(&shape, index), shape.dims());
            SCRATCH.with(shape.scratch_len(), |scratch| {
                let (mut sc, x) = (Forward::split(&d, scratch), Inputs::of(&shape, pair, qkv));
                for qb in 0..blocks(t) {
                    attend(d, &x, qb, &mut sc);
                    let rows = (qb * BLOCK, BLOCK.min(t - qb * BLOCK));
                    // SAFETY: each pair writes only its own head's columns of its own sequence's
                    // rows (`Shared`'s contract), inside `out` (checked by `shape.check`).
                    unsafe { pair.scatter(&shape, &d, sc.o, rows, out, (1, 0), false) };
                    if let Some(stats) = stats.as_deref_mut() {
                        for (to, &lse) in stats[rows.0..][..rows.1].iter_mut().zip(&*sc.l) {
                            to.write(lse);
                        }
                    }
                    if let Some(probs) = probs.as_deref_mut() {
                        kept_weights(d, &x, qb, &mut sc, probs);
                    }
                }
            });
        });
}

vectorized! {
    /// Query block `qb` of a pair's forward pass: its output rows into `sc.o`, each row
    /// divided by its sum, and each row's log-sum-exp in `sc.l`; the block's queries stay in
    /// `sc.qt`.
    fn attend(d: Dims, x: &Inputs<'_>, qb: usize, sc: &mut Forward<'_>) {
        let rows = BLOCK.min(d.seq - qb * BLOCK);
        x.q.transposed(&d, qb * BLOCK, rows, sc.qt);
        for kb in 0..=qb {
            let span = Span::of(&d, qb, kb);
            x.k.rows(&d, span.j0, span.keys, sc.k);
            x.v.rows(&d, span.j0, span.keys, sc.v);
            scores(d, sc.k, sc.qt, span, sc.s);
            let first = kb == 0;
            fold(d, span, first, sc.s, (&mut *sc.m, &mut *sc.l, &mut *sc.corr));
            for r0 in (0..rows).step_by(ROWS) {
                let tile = &mut sc.o[r0 * d.head..][..ROWS * d.head];
                let (p, reach) = ((&*sc.s, r0), span.reach(r0, ROWS));
                if first {
                    weighted_rows::<false>(d, p, sc.v, reach, tile);
                } else {
                    // The earlier blocks' terms, against the rows' new maxima.
                    for (row, &c) in tile.chunks_exact_mut(d.head).zip(&sc.corr[r0..]) {
                        row.iter_mut().for_each(|o| *o *= c);
                    }
                    weighted_rows::<true>(d, p, sc.v, reach, tile);
                }
            }
        }
        for (row, &sum) in sc.o.chunks_exact_mut(d.head).zip(&sc.l[..rows]) {
            let inverse = 1.0 / sum;
            row.iter_mut().for_each(|o| *o *= inverse);
        }
        // Each row's log-sum-exp of its scaled scores: its weights are `e^(scale s - lse)`.
        for (l, &m) in sc.l[..rows].iter_mut().zip(&sc.m[..rows]) {
            *l = m * d.scale + l.ln();
        }
    }
}

vectorized! {
    /// Query block `qb`'s rows of the pair's kept weights `probs` (`seq x seq`), after
    /// [`attend`] left the block's queries and its rows' log-sum-exps in `sc`.
    fn kept_weights(
        d: Dims,
        x: &Inputs<'_>,
        qb: usize,
        sc: &mut Forward<'_>,
        probs: &mut [MaybeUninit<f32>],
    ) {
        for kb in 0..=qb {
            let span = Span::of(&d, qb, kb);
            x.k.rows(&d, span.j0, span.keys, sc.k);
            weights(d, sc.k, sc.qt, span, sc.l, sc.s);
            for r in 0..span.rows {
                let to = &mut probs[(span.q0 + r) * d.seq + span.j0..][..span.keys];
                for (j, to) in to.iter_mut().enumerate() {
                    to.write(sc.s[j * BLOCK + r]);
                }
            }
        }
        // The keys after the block's: no row of it sees them.
        let (q0, end) = (qb * BLOCK, ((qb + 1) * BLOCK).min(d.seq));
        for r in q0..end {
            probs[r * d.seq + end..(r + 1) * d.seq].iter_mut().for_each(|w| {
                w.write(0.0);
            });
        }
    }
}

/// Sixteen query rows from `r0` side by side: the keys each sees (`u32`, so that a mask of
/// sixteen is one vector), the keys every one of them in the block sees (the first's), and
/// the keys any of them sees (the last's in the block).
#[inline(always)]
fn lanes_seen(span: &Span, r0: usize) -> ([u32; LANES], usize, usize) {
    let seen = std::array::from_fn(|i| span.seen(r0 + i) as u32);
    (seen, span.seen(r0), span.reach(r0, LANES))
}

/// Folds a block's scores `s` (key by key: `s[j x BLOCK + r]`) into each query row's running
/// maximum `m` and sum `l` (started afresh if `first`): each score a row sees becomes `e^(scale
/// (s - max))` for the row's new maximum, the others become zeros (as far as
/// [`Span::key_tiles`]), and `corr` holds what the row's earlier terms are multiplied by,
/// `e^(scale (old max - new max))`. Sixteen rows side by side, each row's terms summed in
/// key order; only the keys that some of the sixteen do not see are masked.
#[inline(always)]
fn fold(
    d: Dims,
    span: Span,
    first: bool,
    s: &mut [f32],
    (m, l, corr): (&mut [f32], &mut [f32], &mut [f32]),
) {
    for r0 in (0..span.rows).step_by(LANES) {
        let (seen, all, last) = lanes_seen(&span, r0);
        let mut max = [f32::MIN; LANES];
        for j in 0..last {
            let row: &[f32; LANES] = s[j * d.keys + r0..][..LANES].try_into().expect("lanes");
            if j < all {
                for (max, &v) in max.iter_mut().zip(row) {
                    *max = max.max(v);
                }
            } else {
                for ((max, &v), &seen) in max.iter_mut().zip(row).zip(&seen) {
                    *max = if (j as u32) < seen { max.max(v) } else { *max };
                }
            }
        }
        let (m, l, corr) = (
            &mut m[r0..][..LANES],
            &mut l[r0..][..LANES],
            &mut corr[r0..][..LANES],
        );
        for ((m, corr), &block) in m.iter_mut().zip(corr.iter_mut()).zip(&max) {
            if first {
                (*m, *corr) = (block, 0.0);
            } else {
                let new = m.max(block);
                (*m, *corr) = (new, exp((*m - new) * d.scale));
            }
        }
        let mut sums = [0.0f32; LANES];
        for j in 0..last {
            let row: &mut [f32; LANES] = (&mut s[j * d.keys + r0..][..LANES])
                .try_into()
                .expect("lanes");
            if j < all {
                for ((w, sum), &m) in row.iter_mut().zip(&mut sums).zip(&*m) {
                    *w = exp((*w - m) * d.scale);
                    *sum += *w;
                }
            } else {
                for (((w, sum), &seen), &m) in row.iter_mut().zip(&mut sums).zip(&seen).zip(&*m) {
                    let p = exp((*w - m) * d.scale);
                    *w = if (j as u32) < seen { p } else { 0.0 };
                    *sum += *w;
                }
            }
        }
        for j in last..span.key_tiles() {
            s[j * d.keys + r0..][..LANES].fill(0.0);
        }
        for ((l, &corr), &sum) in l.iter_mut().zip(&*corr).zip(&sums) {
            *l = if first { sum } else { *l * corr + sum };
        }
    }
}

/// A block's softmax weights into `p` (key by key) from its rows' log-sum-exps `lse`:
/// `e^(scale s - lse)` for the keys each row sees, zeros for the others (as far as
/// [`Span::key_tiles`]).
#[inline(always)]
fn weights(d: Dims, k: &[f32], qt: &[f32], span: Span, lse: &[f32], p: &mut [f32]) {
    scores(d, k, qt, span, p);
    for r0 in (0..span.rows).step_by(LANES) {
        let (seen, all, last) = lanes_seen(&span, r0);
        let lse: &[f32; LANES] = lse[r0..][..LANES].try_into().expect("lanes");
        for j in 0..last {
            let row: &mut [f32; LANES] = (&mut p[j * d.keys + r0..][..LANES])
                .try_into()
                .expect("lanes");
            if j < all {
                for (w, &lse) in row.iter_mut().zip(lse) {
                    *w = exp(*w * d.scale - lse);
                }
            } else {
                for ((w, &seen), &lse) in row.iter_mut().zip(&seen).zip(lse) {
                    let p = exp(*w * d.scale - lse);
                    *w = if (j as u32) < seen { p } else { 0.0 };
                }
            }
        }
        for j in last..span.key_tiles() {
            p[j * d.keys + r0..][..LANES].fill(0.0);
        }
    }
}

/// The scores of the block's keys `a` (rows of `head`: keys, or values for the weights'
/// gradients) against its query rows `bt` (transposed: `head` rows of `BLOCK`, queries or the
/// output's gradient), into `out` key by key (`out[j x BLOCK + r]`): each tile of keys against
/// the vectors of rows from the one that holds the first row that sees its first key; what
/// lies before is left as it was.
#[inline(always)]
fn scores(d: Dims, a: &[f32], bt: &[f32], span: Span, out: &mut [f32]) {
    let end = span.rows.div_ceil(LANES);
    for j0 in (0..span.keys).step_by(SCORE_KEYS) {
        let start = span.first_seeing(j0) / LANES;
        let (a, c0) = (&a[j0 * d.head..][..SCORE_KEYS * d.head], start * LANES);
        let out = &mut out[j0 * d.keys..];
        match (end - start).min(QUERY_VECTORS) {
            1 => score_tile::<1>(d, a, bt, c0, out),
            2 => score_tile::<2>(d, a, bt, c0, out),
            3 => score_tile::<3>(d, a, bt, c0, out),
            _ => score_tile::<QUERY_VECTORS>(d, a, bt, c0, out),
        }
    }
}

/// `SCORE_KEYS` keys' scores against the rows `c0 .. c0 + LANES x V`: `out[j][r] = sum over
/// the head of a[j] x bt[.][r]` (key `j`'s at `j x BLOCK`), each sum in the head's order.
#[inline(always)]
fn score_tile<const V: usize>(d: Dims, a: &[f32], bt: &[f32], c0: usize, out: &mut [f32]) {
    let mut acc = [[[0.0f32; LANES]; V]; SCORE_KEYS];
    for i in 0..d.head {
        let rows = &bt[i * d.keys + c0..][..V * LANES];
        for (j, acc) in acc.iter_mut().enumerate() {
            let x = a[j * d.head + i];
            for (acc, rows) in acc.iter_mut().zip(rows.chunks_exact(LANES)) {
                for (acc, &b) in acc.iter_mut().zip(rows) {
                    *acc = x.mul_add(b, *acc);
                }
            }
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        let to = &mut out[j * d.keys + c0..][..V * LANES];
        for (to, acc) in to.chunks_exact_mut(LANES).zip(acc) {
            to.copy_from_slice(acc);
        }
    }
}

/// `ROWS` query rows from row `r0` of `p x b` (or `+=` if `ACCUMULATE`): `out[r] = sum over
/// keys j < reach of p[j][r0 + r] x b[j]`, `p` key by key, `b` and `out` rows of `head`.
#[inline(always)]
fn weighted_rows<const ACCUMULATE: bool>(
    d: Dims,
    p: (&[f32], usize),
    b: &[f32],
    reach: usize,
    out: &mut [f32],
) {
    for h0 in (0..d.head).step_by(2 * LANES) {
        if d.head - h0 >= 2 * LANES {
            weighted_tile::<{ 2 * LANES }, ACCUMULATE>(d, p, b, reach, h0, out);
        } else {
            weighted_tile::<LANES, ACCUMULATE>(d, p, b, reach, h0, out);
        }
    }
}

/// [`weighted_rows`] for the head's columns `h0..h0 + W`.
#[inline(always)]
fn weighted_tile<const W: usize, const ACCUMULATE: bool>(
    d: Dims,
    (p, r0): (&[f32], usize),
    b: &[f32],
    reach: usize,
    h0: usize,
    out: &mut [f32],
) {
    let mut acc = [[0.0f32; W]; ROWS];
    for j in 0..reach {
        let row: &[f32; W] = b[j * d.head + h0..][..W].try_into().expect("a tile");
        let weights = &p[j * d.keys + r0..][..ROWS];
        for (r, acc) in acc.iter_mut().enumerate() {
            let w = weights[r];
            for (acc, &x) in acc.iter_mut().zip(row) {
                *acc = w.mul_add(x, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let to = &mut out[r * d.head + h0..][..W];
        if ACCUMULATE {
            to.iter_mut().zip(acc).for_each(|(t, a)| *t += a);
        } else {
            to.copy_from_slice(acc);
        }
    }
}

/// Adds to keys `j0..j0 + ROWS` of `out` (rows of `head`) `sum over query rows r in
/// from..rows of p[j][r] x x[r]`, `p` key by key, `x` rows of `head`.
#[inline(always)]
fn key_rows(
    d: Dims,
    p: &[f32],
    x: &[f32],
    j0: usize,
    (from, rows): (usize, usize),
    out: &mut [f32],
) {
    for h0 in (0..d.head).step_by(2 * LANES) {
        if d.head - h0 >= 2 * LANES {
            key_tile::<{ 2 * LANES }>(d, p, x, j0, (from, rows), h0, out);
        } else {
            key_tile::<LANES>(d, p, x, j0, (from, rows), h0, out);
        }
    }
}

/// [`key_rows`] for the head's columns `h0..h0 + W`.
#[inline(always)]
fn key_tile<const W: usize>(
    d: Dims,
    p: &[f32],
    x: &[f32],
    j0: usize,
    (from, rows): (usize, usize),
    h0: usize,
    out: &mut [f32],
) {
    let mut acc = [[0.0f32; W]; ROWS];
    // Each key's weights over the rows `..rows`, so that a row's index needs no check.
    let weights: [&[f32]; ROWS] = std::array::from_fn(|j| &p[(j0 + j) * d.keys..][..rows]);
    for r in from..rows {
        let row: &[f32; W] = x[r * d.head + h0..][..W].try_into().expect("a tile");
        for (j, acc) in acc.iter_mut().enumerate() {
            let w = weights[j][r];
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

/// One pair's forward output and its gradient.
struct Given<'a> {
    o: Source<'a>,
    g: Source<'a>,
}

/// A task's scratch for a pair's backward pass: a block of queries and of the output's
/// gradient (each transposed and as rows), of the query gradient, of keys and values and of
/// their gradients; a block of weights and of their gradients (key by key); and each query
/// row's log-sum-exp and `dout . out`.
struct Backward<'a> {
    qt: &'a mut [f32],
    q: &'a mut [f32],
    gt: &'a mut [f32],
    g: &'a mut [f32],
    dq: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
    p: &'a mut [f32],
    dp: &'a mut [f32],
    lse: &'a mut [f32],
    dots: &'a mut [f32],
}

impl<'a> Backward<'a> {
    fn len(d: &Dims) -> usize {
        d.tile()
            .saturating_mul(9)
            .saturating_add(2 * BLOCK * BLOCK + 2 * BLOCK)
    }

    fn split(d: &Dims, scratch: &'a mut [f32]) -> Self {
        let ([qt, q, gt, g, dq, k, v, dk, dv], [p, dp], rest) = split::<9, 2>(d, scratch);
        let (lse, dots) = rest.split_at_mut(BLOCK);
        Self {
            qt,
            q,
            gt,
            g,
            dq,
            k,
            v,
            dk,
            dv,
            p,
            dp,
            lse,
            dots: &mut dots[..BLOCK],
        }
    }
}

/// The gradient of the attention's input `qkv` into `dqkv` (same shape, every element
/// written), from the input, the output `out`, the rows' statistics `stats` (both from
/// [`forward`]) and the output's gradient `dout`; with `probs` (from [`forward`] too) the
/// weights are read back instead of computed again.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn backward(
    shape: Heads,
    qkv: &[f32],
    (out, stats): (&[f32], &[f32]),
    dout: &[f32],
    probs: Option<&[f32]>,
    dqkv: &mut [MaybeUninit<f32>],
) {
    shape.check(qkv.len(), out.len().min(dout.len()));
    shape.check(dqkv.len(), out.len());
    let stats_len = shape.stats_len().expect("checked above");
    assert!(stats.len() >= stats_len, "the statistics are too short");
    if let Some(probs) = probs {
        assert!(
            probs.len()
                >= shape
                    .probs_len()
                    .expect("the kept weights' count overflows"),
            "kept weights too short"
        );
    }
    let (t, pairs) = (shape.seq, shape.batch * shape.heads);
    if t == 0 || pairs == 0 {
        return;
    }
    let dqkv = Shared(dqkv.as_mut_ptr().cast());
    let per_task = shape.pairs_per_task();
    (0..pairs)
        .into_par_iter()
        .with_min_len(per_task)
        .for_each(|index| {
            let (pair, d) = (Pair::of(&shape, index), shape.dims());
            let kept = probs.map(|p| &p[index * t * t..][..t * t]);
            let lse = &stats[index * t..][..t];
            let x = Inputs::of(&shape, pair, qkv);
            let y = Given {
                o: pair.columns(&shape, out),
                g: pair.columns(&shape, dout),
            };
            SCRATCH.with(shape.scratch_len(), |scratch| {
                let mut sc = Backward::split(&d, scratch);
                for qb in 0..blocks(t) {
                    query_block(d, &x, &y, qb, lse, &mut sc);
                    for kb in 0..=qb {
                        let span = Span::of(&d, qb, kb);
                        block_backward(d, &x, span, kept, &mut sc);
                        // Key block `kb` is first met by query block `kb` (the first that sees
                        // it): written there, added to after.
                        let add = qb != kb;
                        for (part, from) in [(1, &*sc.dk), (2, &*sc.dv)] {
                            let keys = (span.j0, span.keys);
                            // SAFETY: each pair writes only its own head's columns of its own
                            // sequence's rows of `dqkv` (`Shared`'s contract), inside it (checked
                            // above); with `add`, query block `kb` wrote these rows before.
                            unsafe { pair.scatter(&shape, &d, from, keys, dqkv, (3, part), add) };
                        }
                    }
                    let rows = (qb * BLOCK, BLOCK.min(t - qb * BLOCK));
                    // SAFETY: as above; the query rows are written once.
                    unsafe { pair.scatter(&shape, &d, sc.dq, rows, dqkv, (3, 0), false) };
                }
            });
        });
}

vectorized! {
    /// Starts query block `qb` of a pair's backward pass: gathers its queries and output
    /// gradient (each transposed and as rows) and its rows' log-sum-exps (of the pair's
    /// `lse`), and each row's `dout . out` (the softmax's correction).
    fn query_block(
        d: Dims,
        x: &Inputs<'_>,
        y: &Given<'_>,
        qb: usize,
        lse: &[f32],
        sc: &mut Backward<'_>,
    ) {
        let (q0, rows) = (qb * BLOCK, BLOCK.min(d.seq - qb * BLOCK));
        x.q.transposed(&d, q0, rows, sc.qt);
        x.q.rows(&d, q0, rows, sc.q);
        y.g.transposed(&d, q0, rows, sc.gt);
        y.g.rows(&d, q0, rows, sc.g);
        sc.lse[..rows].copy_from_slice(&lse[q0..][..rows]);
        // Rows past the block's are computed alongside (never read): give them values.
        sc.lse[rows..].fill(0.0);
        sc.dots[rows..].fill(0.0);
        for (r, dot) in sc.dots[..rows].iter_mut().enumerate() {
            prefetch_row(y.o.data, (q0 + r + PREFETCH) * y.o.stride, d.size);
            *dot = Lanes::sum_of_pairs(y.g.row(&d, q0 + r), y.o.row(&d, q0 + r), |g, o| g * o);
        }
    }
}

vectorized! {
    /// Block `span` of a pair's backward pass, after [`query_block`]: its weights (`kept`, or
    /// from the rows' log-sum-exps) and their gradients, the block's terms of the query
    /// gradient into `sc.dq` (afresh at the first key block) and of the key and value
    /// gradients into `sc.dk` and `sc.dv` (afresh).
    fn block_backward(
        d: Dims,
        x: &Inputs<'_>,
        span: Span,
        kept: Option<&[f32]>,
        sc: &mut Backward<'_>,
    ) {
        x.k.rows(&d, span.j0, span.keys, sc.k);
        x.v.rows(&d, span.j0, span.keys, sc.v);
        match kept {
            Some(kept) => {
                for j in 0..span.key_tiles() {
                    let row = &mut sc.p[j * d.keys..][..BLOCK];
                    for (r, w) in row.iter_mut().enumerate() {
                        *w = match j < span.keys && r < span.rows {
                            true => kept[(span.q0 + r) * d.seq + span.j0 + j],
                            false => 0.0,
                        };
                    }
                }
            }
            None => weights(d, sc.k, sc.qt, span, sc.lse, sc.p),
        }
        // dp = v dout^T, key by key; then ds = p (dp - dot) scale where a row sees the key,
        // zeros elsewhere (as far as the key tiles read).
        scores(d, sc.v, sc.gt, span, sc.dp);
        for r0 in (0..span.rows).step_by(LANES) {
            let (seen, all, last) = lanes_seen(&span, r0);
            let dots: &[f32; LANES] = sc.dots[r0..][..LANES].try_into().expect("lanes");
            for j in 0..last {
                let at = j * d.keys + r0;
                let (ds, p) = (&mut sc.dp[at..][..LANES], &sc.p[at..][..LANES]);
                if j < all {
                    for ((g, &w), &dot) in ds.iter_mut().zip(p).zip(dots) {
                        *g = w * (*g - dot) * d.scale;
                    }
                } else {
                    for (((g, &w), &dot), &seen) in ds.iter_mut().zip(p).zip(dots).zip(&seen) {
                        let value = w * (*g - dot) * d.scale;
                        *g = if (j as u32) < seen { value } else { 0.0 };
                    }
                }
            }
            for j in last..span.key_tiles() {
                sc.dp[j * d.keys + r0..][..LANES].fill(0.0);
            }
        }
        let first = span.j0 == 0;
        for r0 in (0..span.rows).step_by(ROWS) {
            let tile = &mut sc.dq[r0 * d.head..][..ROWS * d.head];
            let (ds, reach) = ((&*sc.dp, r0), span.reach(r0, ROWS));
            if first {
                weighted_rows::<false>(d, ds, sc.k, reach, tile);
            } else {
                weighted_rows::<true>(d, ds, sc.k, reach, tile);
            }
        }
        // Key j gets the block's rows that see it.
        sc.dk.fill(0.0);
        sc.dv.fill(0.0);
        for j in (0..span.keys).step_by(ROWS) {
            let rows = (span.first_seeing(j), span.rows);
            key_rows(d, sc.dp, sc.q, j, rows, sc.dk);
            key_rows(d, sc.p, sc.g, j, rows, sc.dv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward and backward passes of `shape` on a pool of `threads`: the output, the
    /// statistics and the input's gradient, as bits.
    fn passes(shape: Heads, threads: usize) -> Vec<u32> {
        let (n, c) = (shape.rows(), shape.width());
        let value = |i: usize, seed: usize| ((i * 7919 + seed) % 1000) as f32 / 500.0 - 1.0;
        let qkv: Vec<f32> = (0..3 * n * c).map(|i| value(i, 1)).collect();
        let dout: Vec<f32> = (0..n * c).map(|i| value(i, 7)).collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        // NaN where nothing is written: an element the kernels skip shows in the bits.
        let mut out = vec![MaybeUninit::new(f32::NAN); n * c];
        let mut stats = vec![MaybeUninit::new(f32::NAN); shape.stats_len().unwrap()];
        let mut dqkv = vec![MaybeUninit::new(f32::NAN); 3 * n * c];
        pool.install(|| {
            forward(shape, &qkv, &mut out, Some(&mut stats), None);
            // SAFETY: initialised floats (and every element written by `forward`).
            let (out, stats): (&[f32], &[f32]) = unsafe {
                (
                    &*(std::ptr::from_ref(&out[..]) as *const [f32]),
                    &*(std::ptr::from_ref(&stats[..]) as *const [f32]),
                )
            };
            backward(shape, &qkv, (out, stats), &dout, None, &mut dqkv);
        });
        let bits: Vec<u32> = [out, stats, dqkv]
            .iter()
            .flatten()
            // SAFETY: initialised floats.
            .map(|v| unsafe { v.assume_init() }.to_bits())
            .collect();
        assert!(
            bits.iter().all(|&b| !f32::from_bits(b).is_nan()),
            "an element not written"
        );
        bits
    }

    #[test]
    fn tasks_of_several_pairs_give_the_same_bits_at_any_thread_count() {
        // 16 pairs of context 128 (two blocks) and head 32: four pairs a task, four tasks.
        let shape = Heads {
            batch: 4,
            seq: 128,
            heads: 4,
            size: 32,
        };
        assert_eq!((shape.pairs_per_task(), shape.tasks()), (4, 4));
        // 15 pairs of context 200 (four blocks, the last short) and head 17 (padded to 32):
        // four pairs a task, the last task of three.
        let odd = Heads {
            batch: 3,
            seq: 200,
            heads: 5,
            size: 17,
        };
        assert_eq!((odd.pairs_per_task(), odd.tasks()), (4, 3));
        for shape in [shape, odd] {
            let one = passes(shape, 1);
            for threads in [2, 3, 8] {
                assert!(
                    passes(shape, threads) == one,
                    "{shape:?}: {threads} threads"
                );
            }
        }
    }

    #[test]
    fn a_task_takes_enough_pairs_for_its_work() {
        let shape = |seq, size| Heads {
            batch: 16,
            seq,
            heads: 8,
            size,
        };
        // The main job's pairs (context 256, head 32) are a task each; GPT-2 small's too.
        assert_eq!(shape(256, 32).tasks(), 128);
        assert_eq!(shape(1024, 64).pairs_per_task(), 1);
        // Context 64 at head 32: 16 pairs a task.
        assert_eq!(shape(64, 32).pairs_per_task(), 16);
        assert_eq!(shape(64, 32).tasks(), 8);
        // Never no task, and no overflow.
        assert_eq!(shape(1, 1).tasks(), 1);
        assert_eq!(shape(usize::MAX, usize::MAX).pairs_per_task(), 1);
        assert_eq!(shape(64, 0).tasks(), 1);
        // A head too large for memory asks for more scratch than any buffer holds.
        assert_eq!(shape(64, usize::MAX).scratch_len(), usize::MAX);
        assert_eq!(shape(64, 32).scratch_len(), 26_752);
    }
}
