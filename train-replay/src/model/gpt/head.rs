//! The GPT's two ends: the embedding of the tokens (and its gradients), and the head, the
//! final layer norm and the output projection tied to the token embedding, with the loss.

use std::sync::Arc;

use crate::backend::{Backend, Kernel};
use crate::kernels::attention::Heads;
use crate::kernels::embedding;
use crate::kernels::gemm::Mat;
use crate::kernels::layernorm;
use crate::kernels::loss::cross_entropy;

use super::block::Keeping;
use super::ops::Ops;
use super::params::Params;

/// The embedding of `tokens` (`heads.rows()` of them, `heads.seq` per sequence): each token's
/// row of `wte` plus its position's row of `wpe`, kept as `keeping` says (evictable: the
/// pool recomputes it from the tokens).
pub fn embed<B: Backend>(
    ops: &Ops<'_, B>,
    params: &Params<B>,
    tokens: &Arc<[u32]>,
    heads: Heads,
    keeping: Keeping,
) -> anyhow::Result<B::Saved> {
    let (n, c) = (heads.rows(), heads.width());
    let kernel: Kernel = if ops.dry {
        Kernel::zeros()
    } else {
        let (wte, wpe, tokens, seq) = (
            params.wte.handle(),
            params.wpe.handle(),
            Arc::clone(tokens),
            heads.seq,
        );
        Kernel::new(move |_, out| {
            embedding::forward(&tokens, seq, c, B::slice(&wte), B::slice(&wpe), out)
        })
    };
    // SAFETY: `embedding::forward` writes every element of its output.
    let x = unsafe { ops.written(n, c, |out| kernel.run(&[], out))? };
    match keeping {
        Keeping::Plain => ops.backend.save(x),
        Keeping::Evictable => {
            let cost = (n * c) as u64;
            ops.backend.save_recomputable(x, &[], cost, kernel)
        }
    }
}

/// The gradients of the embeddings from that of the embedding's output, `dx`: added to
/// `dwte` (which holds the output projection's already), and `wpe`'s, returned.
pub fn embed_backward<B: Backend>(
    ops: &Ops<'_, B>,
    tokens: &[u32],
    heads: Heads,
    dx: &B::Buf,
    dwte: &mut B::Buf,
) -> anyhow::Result<B::Buf> {
    let (seq, c) = (heads.seq, heads.width());
    let dwte = B::slice_mut(dwte);
    // SAFETY: `embedding::backward` writes every element of its position gradient.
    unsafe {
        ops.written(seq, c, |dwpe| {
            embedding::backward(tokens, seq, c, B::slice(dx), dwte, dwpe)
        })
    }
}

/// What the head's backward pass gives: the gradient of the last block's output, the output
/// projection's share of `wte`'s gradient, and the final layer norm's weight and bias
/// gradients.
#[derive(Debug)]
pub struct HeadGrads<Buf> {
    /// Of the last block's output.
    pub dx: Buf,
    /// Of `wte`, through the tied output projection.
    pub dwte: Buf,
    /// Of `ln_f`'s weight and bias.
    pub lnf: [Buf; 2],
}

/// The head on the last block's output `x` (`heads.rows()` rows): the final layer norm, the
/// logits (`x W_te^T`), the mean cross-entropy against `targets`; with `grad`, the
/// gradients too.
pub fn head<B: Backend>(
    ops: &Ops<'_, B>,
    params: &Params<B>,
    x: &B::Saved,
    heads: Heads,
    targets: &[u32],
    grad: bool,
) -> anyhow::Result<(f32, Option<HeadGrads<B::Buf>>)> {
    let (n, c, v) = (heads.rows(), heads.width(), params.wte.rows());
    let wte = params.wte.get();
    B::with_saved(x, |x| {
        let (lnf_w, lnf_b) = (params.lnf_w.get(), params.lnf_b.get());
        let (h, stats) = ops.layernorm(n, c, x, lnf_w, lnf_b)?;
        let mut logits =
            ops.product(n, c, v, Mat::rows(B::slice(&h), c), Mat::transposed(wte, c))?;
        let mut losses = ops.zeros(n, 1)?;
        let mut loss = 0.0;
        ops.run(|| {
            let logits = B::slice_mut(&mut logits);
            loss = cross_entropy(n, v, logits, targets, B::slice_mut(&mut losses), grad);
        });
        drop(losses);
        if !grad {
            return Ok((loss, None));
        }
        let g = B::slice(&logits);
        let dh = ops.product(n, v, c, Mat::rows(g, v), Mat::rows(wte, c))?;
        let dwte = ops.weight_grad(n, v, c, g, B::slice(&h))?;
        drop((logits, h));
        let mut dx = ops.zeros(n, c)?;
        let (mut dw, mut db) = (ops.zeros(1, c)?, ops.zeros(1, c)?);
        ops.run(|| {
            layernorm::backward(
                n,
                c,
                B::slice(&dh),
                x,
                lnf_w,
                B::slice(&stats),
                B::slice_mut(&mut dx),
                B::slice_mut(&mut dw),
                B::slice_mut(&mut db),
            )
        });
        let grads = HeadGrads {
            dx,
            dwte,
            lnf: [dw, db],
        };
        Ok((loss, Some(grads)))
    })
}

/// The logits of the last row of `x` (`rows` rows of `c`): the next token's scores after
/// the sequence, for sampling.
pub fn last_logits<B: Backend>(
    ops: &Ops<'_, B>,
    params: &Params<B>,
    x: &B::Saved,
    rows: usize,
    c: usize,
) -> anyhow::Result<B::Buf> {
    let v = params.wte.rows();
    B::with_saved(x, |x| {
        let last = &x[(rows - 1) * c..rows * c];
        let (h, _) = ops.layernorm(1, c, last, params.lnf_w.get(), params.lnf_b.get())?;
        let wte = Mat::transposed(params.wte.get(), c);
        ops.product(1, c, v, Mat::rows(B::slice(&h), c), wte)
    })
}
