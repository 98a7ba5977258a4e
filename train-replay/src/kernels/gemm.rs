//! Matrix products ([`tile`](super::tile)'s blocked product under the shapes the models
//! use) and a linear layer fused with what comes before and after its product ([`Linear`]):
//! the bias (and a residual) is each sum's starting value, a layer norm or a GELU is applied
//! to the input's rows as they are packed, and a ReLU runs on each output tile as it is
//! stored. No call keeps a buffer per thread beyond a tile on its stack; the packed weight is
//! one panel all the threads read.
//!
//! Every kernel gives the same bits at any thread count: each element of a product is one
//! chain of fused multiply-adds over the depth in order (see [`tile`](super::tile)), and the
//! bias gradient's column sums are cut by the shapes ([`ROW_BLOCK`]), never by the threads.
//! The tests check it.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::scratch::Stash;
use super::simd::vectorized;
pub use super::tile::{Mat, Prologue};
use super::tile::{Product, Start};

/// The bias gradients' partial sums, a row per block of [`ROW_BLOCK`] rows.
static SUMS: Stash = Stash::new();

/// `c[m x n] = a[m x k] * b[k x n]`, `c` row-major, on `threads` threads of the current
/// rayon pool (1: this thread), the same bits on any number (see the module's
/// documentation). `c` is written whole and never read, so it may be uninitialised.
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
    threads: usize,
) {
    let elements = m.checked_mul(n).expect("m * n overflows");
    assert!(c.len() >= elements, "output too short for its shape");
    // SAFETY: `c` holds the `m x n` row-major output (checked above), is exclusively ours and
    // does not overlap `a` or `b` (a `&mut` next to shared slices); from a zero start the
    // product writes each element before it reads it, so it may be uninitialised.
    unsafe { gemm_into(m, k, n, a, b, c.as_mut_ptr().cast(), n, false, threads) }
}

/// `c[m x n] += a[m x k] * b[k x n]`, `c` row-major and initialised, as [`gemm()`] computes
/// the product.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn gemm_add(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    threads: usize,
) {
    into_initialised(m, k, n, a, b, c, true, threads);
}

/// The product into an initialised row-major output `c`, added to it (`accumulate`) or
/// over it: [`gemm_add`] and [`product_over`].
#[allow(clippy::too_many_arguments)] // a GEMM's shape, operands and mode
fn into_initialised(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    let elements = m.checked_mul(n).expect("m * n overflows");
    assert!(c.len() >= elements, "output too short for its shape");
    // SAFETY: `c` holds the `m x n` row-major output (checked above), initialised (a
    // `&mut [f32]`), exclusively ours and apart from `a` and `b`.
    unsafe { gemm_into(m, k, n, a, b, c.as_mut_ptr(), n, accumulate, threads) }
}

/// [`gemm()`] into a row-major output of row stride `c_rs` at `c` (the columns of one head in
/// a wider matrix, say), added to it if `accumulate`.
///
/// # Safety
///
/// `c` is non-null, aligned for `f32` and valid for writes (and for reads if `accumulate`)
/// of every element `i * c_rs + j`, `i < m`, `j < n`, those elements are initialised if
/// `accumulate`, and no other reference reaches them or overlaps `a` and `b` while the call
/// runs. (A row stride below `n` with more than one row panics: rows would overlap.)
///
/// # Panics
///
/// If `a` or `b` is too short for its shape.
#[allow(clippy::too_many_arguments)] // a GEMM's shape, operands, mode and threads
pub unsafe fn gemm_into(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: *mut f32,
    c_rs: usize,
    accumulate: bool,
    threads: usize,
) {
    let product = Product {
        m,
        k,
        n,
        a,
        prologue: Prologue::Identity,
        b,
        start: if accumulate {
            Start::Output
        } else {
            Start::Zero
        },
        relu: false,
    };
    // SAFETY: the caller's contract is the product's (initialised when its start reads it).
    unsafe { product.run(c, c_rs, threads) }
}

/// Rows per block of the bias gradient's column sums ([`column_sums`]): the rows are cut into
/// blocks of this many (the last may be shorter) whatever the thread count.
pub const ROW_BLOCK: usize = 256;

/// A linear layer `out = relu?(prologue(input) * weight + bias + residual?)`, fused: the bias
/// (and the residual's element) is each sum's starting value, the prologue is applied to the
/// input's rows as the product packs them, and the ReLU as it stores each tile. No
/// intermediate is kept: each thread holds a sliver of the prepared rows on its stack.
#[derive(Clone, Copy, Debug)]
pub struct Linear<'a> {
    /// Input columns.
    pub k: usize,
    /// Output columns.
    pub n: usize,
    /// `k x n`, row-major (the transpose of PyTorch's `nn.Linear` weight).
    pub weight: &'a [f32],
    /// `n` elements.
    pub bias: &'a [f32],
    /// What each input row goes through first.
    pub prologue: Prologue<'a>,
    /// Added to the output (`rows x n`, row-major): a residual connection.
    pub residual: Option<&'a [f32]>,
    /// A ReLU on the output.
    pub relu: bool,
}

impl Linear<'_> {
    /// Runs the layer on `rows` rows of `input` (row-major, `k` columns) into `out` (`rows x
    /// n`, every element written), on `threads` threads of the current rayon pool: the same
    /// bits at every thread count.
    ///
    /// # Panics
    ///
    /// If an operand is too short for its shape.
    pub fn run(&self, rows: usize, input: &[f32], out: &mut [MaybeUninit<f32>], threads: usize) {
        let (k, n) = (self.k, self.n);
        let fits = |len: usize, cols: usize| rows.checked_mul(cols).is_some_and(|need| len >= need);
        assert!(
            self.bias.len() == n
                && fits(input.len(), k)
                && fits(out.len(), n)
                && k.checked_mul(n)
                    .is_some_and(|need| self.weight.len() >= need),
            "operands too short for their shapes"
        );
        let product = Product {
            m: rows,
            k,
            n,
            a: Mat::rows(input, k),
            prologue: self.prologue,
            b: Mat::rows(self.weight, n),
            start: match self.residual {
                Some(residual) => Start::Residual {
                    bias: self.bias,
                    residual,
                },
                None => Start::Bias(self.bias),
            },
            relu: self.relu,
        };
        // SAFETY: `out` holds the `rows x n` row-major output (checked above), is ours alone
        // (a `&mut` beside shared operands); the product writes each element's start value
        // before it reads it.
        unsafe { product.run(out.as_mut_ptr().cast(), n, threads) }
    }
}

/// A layer's weight gradient `out[k x n] = input^T * grad` over `rows` batch rows (`input`
/// `rows x k`, `grad` `rows x n`, both row-major), as one GEMM whose output the `threads`
/// threads of the current rayon pool share, each summing its elements over every batch row:
/// the extra memory is the product's shared panel, not a copy of the gradient per thread.
/// The same bits at every thread count.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn weight_grad(
    rows: usize,
    k: usize,
    n: usize,
    input: &[f32],
    grad: &[f32],
    out: &mut [MaybeUninit<f32>],
    threads: usize,
) {
    let (input, grad) = (Mat::transposed(input, k), Mat::rows(grad, n));
    gemm(k, rows, n, input, grad, out, threads);
}

/// [`gemm()`] into an output that holds values already (overwritten, not read): a block
/// of rows of a larger matrix, say.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn product_over(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    threads: usize,
) {
    into_initialised(m, k, n, a, b, c, false, threads);
}

/// [`weight_grad`] added to `out` (`k x n`, holding a gradient already): the weight
/// gradient of a batch whose rows come a block at a time, each block's sum added in turn.
/// The same bits at every thread count.
///
/// # Panics
///
/// If an operand is too short for its shape.
pub fn weight_grad_add(
    rows: usize,
    k: usize,
    n: usize,
    input: &[f32],
    grad: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    let (input, grad) = (Mat::transposed(input, k), Mat::rows(grad, n));
    gemm_add(k, rows, n, input, grad, out, threads);
}

/// `out[n] = ` the sum of the `rows` rows of `grad` (row-major, `n` columns): a layer's bias
/// gradient. The rows are cut into blocks of [`ROW_BLOCK`] whatever the thread count, each
/// block summed row by row (on the current rayon pool's threads at once), and the blocks'
/// sums are added in block order: the same bits at any thread count, every row read once,
/// whole.
///
/// # Panics
///
/// If `grad` or `out` is too short for its shape.
pub fn column_sums(
    rows: usize,
    n: usize,
    grad: &[f32],
    out: &mut [MaybeUninit<f32>],
    threads: usize,
) {
    let fits = rows.checked_mul(n).is_some_and(|need| grad.len() >= need);
    assert!(
        fits && out.len() >= n,
        "operands too short for their shapes"
    );
    let out = &mut out[..n];
    out.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just written.
    let out = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
    if rows == 0 || n == 0 {
        return;
    }
    let grad = &grad[..rows * n];
    let blocks = rows.div_ceil(ROW_BLOCK);
    SUMS.with(blocks * n, |partial| {
        let sum_block = |(sums, block): (&mut [f32], &[f32])| {
            sums.fill(0.0);
            for row in block.chunks_exact(n) {
                add_rows(sums, row);
            }
        };
        if threads > 1 && blocks > 1 {
            partial
                .par_chunks_mut(n)
                .zip(grad.par_chunks(ROW_BLOCK * n))
                .for_each(sum_block);
        } else {
            partial
                .chunks_mut(n)
                .zip(grad.chunks(ROW_BLOCK * n))
                .for_each(sum_block);
        }
        for sums in partial.chunks_exact(n) {
            add_rows(out, sums);
        }
    });
}

vectorized! {
    /// `acc += values`, element by element.
    fn add_rows(acc: &mut [f32], values: &[f32]) {
        for (a, v) in acc.iter_mut().zip(values) {
            *a += v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tile::tests::values;
    use super::*;

    /// A plain (ReLU or not) layer on row-major operands.
    #[allow(clippy::too_many_arguments)]
    fn linear(
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
        let layer = Linear {
            k,
            n,
            weight,
            bias,
            prologue: Prologue::Identity,
            residual: None,
            relu,
        };
        layer.run(rows, input, out, threads);
    }

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
            gemm(m, k, n, a, b, &mut c, 1);
            // SAFETY: the elements started initialised, and the GEMM writes only floats.
            let c: Vec<f32> = c.iter().map(|v| unsafe { v.assume_init() }).collect();
            assert_eq!(c, naive(m, k, n, a, b));
        }
    }

    /// No batch rows: the weight gradient is zeros, every element written.
    #[test]
    fn a_weight_gradient_over_no_rows_is_zeros() {
        let (k, n) = (13, 40);
        let mut out = vec![MaybeUninit::new(f32::NAN); k * n];
        weight_grad(0, k, n, &[], &[], &mut out, 2);
        // SAFETY: every element started initialised, and the kernel writes only floats.
        let out: Vec<f32> = out.iter().map(|v| unsafe { v.assume_init() }).collect();
        assert!(out.iter().all(|&v| v == 0.0));
    }

    /// `threads` worker threads, as the trainer's pool has.
    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool")
    }

    /// Runs `kernel` into a fresh output of `len` elements.
    fn written(len: usize, kernel: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
        let mut out = vec![MaybeUninit::new(f32::NAN); len];
        kernel(&mut out);
        // SAFETY: the elements started initialised, and the kernels write only floats.
        out.iter().map(|v| unsafe { v.assume_init() }).collect()
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
            let out = pool(threads).install(|| {
                written(rows * n, |out| {
                    linear(rows, k, n, &input, &weight, &bias, true, out, threads)
                })
            });
            assert_eq!(out, expected, "{threads} threads");
        }
    }

    /// Every kernel of the backward pass gives the same bits at every thread count, on shapes
    /// where a split by the threads would change the sums: a depth of several of the GEMM's
    /// depth blocks, rows that are not a multiple of a block, and an output 10 wide (the
    /// GEMM's path for small shapes blocks the depth differently).
    #[test]
    fn every_kernel_gives_the_same_bits_at_every_thread_count() {
        for (rows, k, n) in [(421, 300, 10), (2_100, 64, 96), (70, 1_100, 10)] {
            let (input, grad) = (values(rows * k, 1), values(rows * n, 2));
            let (weight, bias) = (values(k * n, 3), values(n, 4));
            let run = |threads: usize| {
                pool(threads).install(|| {
                    let forward = written(rows * n, |out| {
                        linear(rows, k, n, &input, &weight, &bias, true, out, threads)
                    });
                    let weight_grad = written(k * n, |out| {
                        weight_grad(rows, k, n, &input, &grad, out, threads)
                    });
                    let bias_grad = written(n, |out| column_sums(rows, n, &grad, out, threads));
                    let (g, w) = (Mat::rows(&grad, n), Mat::transposed(&weight, n));
                    let input_grad = written(rows * k, |out| gemm(rows, n, k, g, w, out, threads));
                    [forward, weight_grad, bias_grad, input_grad]
                })
            };
            let one = run(1);
            let close = |got: &[f32], want: &[f32]| {
                got.iter()
                    .zip(want)
                    .all(|(a, b)| (a - b).abs() <= 1e-3 * (1.0 + b.abs()))
            };
            let exact = naive(k, rows, n, Mat::transposed(&input, k), Mat::rows(&grad, n));
            assert!(
                close(&one[1], &exact),
                "the weight gradient is input^T grad"
            );
            let (g, w) = (Mat::rows(&grad, n), Mat::transposed(&weight, n));
            assert!(close(&one[3], &naive(rows, n, k, g, w)), "grad W^T");
            // Each block of ROW_BLOCK rows summed in order, then the blocks in order.
            let sums: Vec<f32> = (0..n)
                .map(|c| {
                    grad.chunks(ROW_BLOCK * n)
                        .map(|block| block.chunks_exact(n).map(|row| row[c]).sum::<f32>())
                        .fold(0.0, |total, block| total + block)
                })
                .collect();
            assert_eq!(
                one[2], sums,
                "the bias gradient sums the rows in blocks, in order"
            );
            for threads in [2, 3, 8] {
                let other = run(threads);
                for (kernel, (a, b)) in ["forward", "weight grad", "bias grad", "input grad"]
                    .iter()
                    .zip(one.iter().zip(&other))
                {
                    let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{kernel} at {threads} threads, {rows}x{k}x{n}");
                }
            }
        }
    }
}
