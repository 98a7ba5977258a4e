//! The GPT's two ends: the embedding of the tokens (and its gradients), and the head, the
//! final layer norm and the output projection tied to the token embedding, with the loss.

use std::sync::Arc;

use crate::backend::{Backend, Kernel};
use crate::kernels::attention::Heads;
use crate::kernels::embedding;
use crate::kernels::gemm::{product_over, weight_grad_add, Mat};
use crate::kernels::layernorm;
use crate::kernels::loss::{cross_entropy, cross_entropy_rows, mean};
use crate::recomputes::Kind;

use super::block::Keeping;
use super::params::Params;
use crate::model::ops::Ops;

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
            ops.backend
                .save_recomputable(x, &[], Kind::Embedding, cost, kernel)
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

/// The bytes of logits the head holds at once by default ([`chunk_rows`]).
pub const CHUNK_BYTES: usize = 64 << 20;

/// Rows of logits the head computes at once over a vocabulary of `vocab` by default: as many
/// as [`CHUNK_BYTES`] hold, a multiple of 64, at least 64. A function of the vocabulary
/// alone, never of the threads, so the losses are the same bits at any thread count (at
/// GPT-2's vocabulary 320 rows, 61 MiB; at 256 tokens 65,536, more than any batch here).
pub fn chunk_rows(vocab: usize) -> usize {
    let rows = CHUNK_BYTES / (vocab.max(1) * size_of::<f32>());
    (rows / 64 * 64).max(64)
}

/// The head on the last block's output `x` (`heads.rows()` rows): the final layer norm, the
/// logits (`x W_te^T`), the mean cross-entropy against `targets`; with `grad`, the
/// gradients too. The logits are computed `chunk` rows at a time (0: all at once), and a
/// chunk's logits become its share of the gradients before the next chunk's are computed:
/// the head never holds more than one chunk of logits (the loss ends the graph, so its
/// backward pass can run right there). With one chunk it is the plain head: the logits
/// whole, their gradient in place, the two gradient products over every row at once.
pub fn head<B: Backend>(
    ops: &Ops<'_, B>,
    params: &Params<B>,
    x: &B::Saved,
    heads: Heads,
    targets: &[u32],
    grad: bool,
    chunk: usize,
) -> anyhow::Result<(f32, Option<HeadGrads<B::Buf>>)> {
    let (n, c, v) = (heads.rows(), heads.width(), params.wte.rows());
    let rows = if chunk == 0 { n } else { chunk.min(n) };
    let wte = params.wte.get();
    B::with_saved(x, |x| {
        let (lnf_w, lnf_b) = (params.lnf_w.get(), params.lnf_b.get());
        let (h, stats) = ops.layernorm(n, c, x, lnf_w, lnf_b)?;
        let (loss, grads) = if rows >= n {
            whole(ops, wte, &h, (n, c, v), targets, grad)?
        } else {
            chunked(ops, wte, &h, (n, c, v, rows), targets, grad)?
        };
        let Some((dh, dwte)) = grads else {
            return Ok((loss, None));
        };
        drop(h);
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

/// The gradients of the layer norm's output and of `wte`, `(dh, dwte)`.
type Grads<Buf> = Option<(Buf, Buf)>;

/// The plain head on the layer norm's output `h` (`n x c`, a vocabulary of `v`): the logits
/// whole, their gradient in place, `dh` and `dwte` each one product over every row.
fn whole<B: Backend>(
    ops: &Ops<'_, B>,
    wte: &[f32],
    h: &B::Buf,
    (n, c, v): (usize, usize, usize),
    targets: &[u32],
    grad: bool,
) -> anyhow::Result<(f32, Grads<B::Buf>)> {
    let h = B::slice(h);
    let mut logits = ops.product(n, c, v, Mat::rows(h, c), Mat::transposed(wte, c))?;
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
    let dwte = ops.weight_grad(n, v, c, g, h)?;
    Ok((loss, Some((dh, dwte))))
}

/// The head on `h` (`n x c`, a vocabulary of `v`) `rows` rows at a time: each chunk's
/// logits, their loss and (with `grad`) their gradient in place, then the chunk's rows of
/// `dh` and its share of `dwte`, added in chunk order; then the next chunk, in the same
/// buffer's place (the pool hands the freed block back).
fn chunked<B: Backend>(
    ops: &Ops<'_, B>,
    wte: &[f32],
    h: &B::Buf,
    (n, c, v, rows): (usize, usize, usize, usize),
    targets: &[u32],
    grad: bool,
) -> anyhow::Result<(f32, Grads<B::Buf>)> {
    let h = B::slice(h);
    let mut losses = ops.zeros(n, 1)?;
    let mut grads = match grad {
        true => Some((ops.zeros(n, c)?, ops.zeros(v, c)?)),
        false => None,
    };
    let scale = grad.then(|| 1.0 / n as f32);
    for first in (0..n).step_by(rows) {
        let r = rows.min(n - first);
        let hi = &h[first * c..(first + r) * c];
        let mut logits = ops.product(r, c, v, Mat::rows(hi, c), Mat::transposed(wte, c))?;
        ops.run(|| {
            let (logits, losses) = (B::slice_mut(&mut logits), B::slice_mut(&mut losses));
            let (targets, losses) = (&targets[first..first + r], &mut losses[first..]);
            cross_entropy_rows(r, v, logits, targets, losses, scale);
        });
        if let Some((dh, dwte)) = &mut grads {
            let g = B::slice(&logits);
            let threads = ops.threads;
            ops.run(|| {
                let dh = &mut B::slice_mut(dh)[first * c..(first + r) * c];
                product_over(r, v, c, Mat::rows(g, v), Mat::rows(wte, c), dh, threads);
                weight_grad_add(r, v, c, g, hi, B::slice_mut(dwte), threads);
            });
        }
    }
    Ok((mean(B::slice(&losses)), grads))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::SeedableRng;

    use super::*;
    use crate::backend::VecBackend;
    use crate::model::gpt::Shape;

    /// The head's loss and gradients on one batch, `chunk` rows at a time on `threads`
    /// threads: `[dx, dwte, dlnf_w, dlnf_b]`.
    fn run(chunk: usize, threads: usize) -> (f32, [Vec<f32>; 4]) {
        let shape = Shape {
            vocab: 61,
            context: 9,
            width: 16,
            heads: 2,
            layers: 1,
            batch: 3,
        };
        let backend = VecBackend;
        let mut rng = crate::model::gpt::Rng::seed_from_u64(3);
        let params = Params::new(&backend, &shape, Some(&mut rng)).unwrap();
        let heads = Heads {
            batch: 3,
            seq: 9,
            heads: 2,
            size: 8,
        };
        let n = heads.rows();
        let x: Vec<f32> = (0..n * 16)
            .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
            .collect();
        let targets: Vec<u32> = (0..n as u32).map(|i| (i * 13) % 61).collect();
        let ops = Ops {
            backend: &backend,
            threads,
            dry: false,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let x = Arc::new(x);
            let (loss, grads) = head(&ops, &params, &x, heads, &targets, true, chunk).unwrap();
            let g = grads.unwrap();
            let [w, b] = g.lnf;
            (loss, [g.dx, g.dwte, w, b])
        })
    }

    /// Chunks of rows (7 of 27: the last one short) give the plain head's loss and
    /// gradients within rounding, the same bits at any thread count; the gradient of the
    /// mean is scaled by the whole batch's rows, not a chunk's.
    #[test]
    fn chunks_give_the_whole_heads_gradients() {
        let (loss, whole) = run(0, 1);
        let (chunked_loss, chunked) = run(7, 1);
        assert!(
            (loss - chunked_loss).abs() <= 1e-6 * loss.abs(),
            "{loss} {chunked_loss}"
        );
        for (a, b) in whole.iter().zip(&chunked) {
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(scale > 0.0);
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-5 * scale,
                    "{x} against {y} (of {scale})"
                );
            }
        }
        let bits =
            |g: &[Vec<f32>; 4]| -> Vec<u32> { g.iter().flatten().map(|v| v.to_bits()).collect() };
        assert_eq!(bits(&run(7, 3).1), bits(&chunked));
        assert_eq!(run(7, 3).0.to_bits(), chunked_loss.to_bits());
    }
}
