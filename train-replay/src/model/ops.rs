//! What a step of either model does with its tensors, in one place: every buffer it takes
//! from the backend and every kernel that writes one ([`Ops`]). A dry run ([`Ops::dry`])
//! takes the same buffers, of the same sizes, in the same order, and runs no kernel.

use std::mem::MaybeUninit;

use crate::backend::Backend;
use crate::kernels::gemm::{column_sums, gemm, weight_grad, Mat};
use crate::kernels::layernorm;

/// The backend, the threads and whether the step is dry.
#[derive(Debug)]
pub struct Ops<'a, B: Backend> {
    /// Where the tensors come from.
    pub backend: &'a B,
    /// Threads the kernels share.
    pub threads: usize,
    /// No kernel runs: every buffer stays zeros.
    pub dry: bool,
}

impl<B: Backend> Ops<'_, B> {
    /// A `rows x cols` buffer of zeros.
    pub fn zeros(&self, rows: usize, cols: usize) -> anyhow::Result<B::Buf> {
        self.backend.zeros(rows, cols)
    }

    /// A `rows x cols` buffer that `kernel` writes; zeros in a dry run.
    ///
    /// # Safety
    ///
    /// `kernel` writes every element of the slice it is given.
    pub unsafe fn written(
        &self,
        rows: usize,
        cols: usize,
        kernel: impl FnOnce(&mut [MaybeUninit<f32>]),
    ) -> anyhow::Result<B::Buf> {
        if self.dry {
            return self.backend.zeros(rows, cols);
        }
        // SAFETY: the caller's contract.
        unsafe { self.backend.written(rows, cols, kernel) }
    }

    /// Runs `kernel`, which changes buffers in place, unless the step is dry.
    pub fn run(&self, kernel: impl FnOnce()) {
        if !self.dry {
            kernel();
        }
    }

    /// `a * b`, `m x n`.
    pub fn product(
        &self,
        m: usize,
        k: usize,
        n: usize,
        a: Mat<'_>,
        b: Mat<'_>,
    ) -> anyhow::Result<B::Buf> {
        let threads = self.threads;
        // SAFETY: `product` writes every element of its output.
        unsafe { self.written(m, n, |out| gemm(m, k, n, a, b, out, threads)) }
    }

    /// `input^T * grad` over `rows` rows (`input` has `k` columns, `grad` `n`): a layer's
    /// weight gradient, `k x n`.
    pub fn weight_grad(
        &self,
        rows: usize,
        k: usize,
        n: usize,
        input: &[f32],
        grad: &[f32],
    ) -> anyhow::Result<B::Buf> {
        let threads = self.threads;
        // SAFETY: `weight_grad` writes every element of its output.
        unsafe {
            self.written(k, n, |out| {
                weight_grad(rows, k, n, input, grad, out, threads)
            })
        }
    }

    /// The sums of the `rows` rows of `grad` (`n` columns): a bias gradient, `1 x n`.
    pub fn column_sums(&self, rows: usize, n: usize, grad: &[f32]) -> anyhow::Result<B::Buf> {
        let threads = self.threads;
        // SAFETY: `column_sums` writes every element of its output.
        unsafe { self.written(1, n, |out| column_sums(rows, n, grad, out, threads)) }
    }

    /// A layer norm of the `rows` rows of `x` (`c` columns) and each row's statistics
    /// (`rows x 2`: mean, reciprocal deviation).
    pub fn layernorm(
        &self,
        rows: usize,
        c: usize,
        x: &[f32],
        weight: &[f32],
        bias: &[f32],
    ) -> anyhow::Result<(B::Buf, B::Buf)> {
        let mut stats = self.zeros(rows, 2)?;
        let out = {
            let stats = B::slice_mut(&mut stats);
            // SAFETY: `layernorm::forward` writes every element of its output.
            unsafe {
                self.written(rows, c, |out| {
                    layernorm::forward(rows, c, x, weight, bias, out, stats)
                })?
            }
        };
        Ok((out, stats))
    }
}
