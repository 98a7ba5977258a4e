//! One transformer block, pre-LayerNorm as GPT-2 has it:
//!
//! ```text
//! qkv  = ln_1(x) W_attn + b_attn                 (the layer norm fused into the GEMM)
//! att  = causal softmax attention of qkv         (no score matrix kept)
//! res2 = x + att W_proj + b_proj                 (the residual the GEMM's start)
//! fch  = ln_2(res2) W_fc + b_fc
//! out  = res2 + gelu(fch) W_out + b_out          (the GELU fused into the GEMM)
//! ```
//!
//! Each line is one kernel ([`Op`]) that reads tensors kept for the backward pass and writes
//! one, so that each kept tensor can be a value the pool evicts and recomputes from the ones
//! it was computed from ([`Keeping::Evictable`]); the attention also keeps each row's
//! log-sum-exp, one number a row. The backward pass ([`Layer::backward`]) reads `x`, `qkv`,
//! `att`, those statistics, `res2` and `fch` (computing the layer norms again from `x` and
//! `res2`), and returns the block's input gradient and its parameters' gradients.

use crate::backend::{Backend, Kernel};
use crate::kernels::attention::{self, Heads};
use crate::kernels::elementwise::{gelu_backward, gelu_uninit};
use crate::kernels::gemm::{Linear, Mat, Prologue};
use crate::kernels::layernorm;
use crate::recomputes::Kind;

use super::params::{Block, BLOCK_PARAMS, W};
use crate::model::ops::Ops;

/// How the forward pass keeps a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keeping {
    /// As a retained value, for as long as the step holds it.
    Plain,
    /// As a value the pool may evict under its budget and recompute from its inputs.
    Evictable,
}

/// A block's kernels, in the order the forward pass runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `qkv` from `x`.
    Qkv,
    /// `att` from `qkv`.
    Attention,
    /// `res2` from `att` and `x`.
    Proj,
    /// `fch` from `res2`.
    Fc,
    /// `out` from `fch` and `res2`.
    Out,
}

impl Op {
    /// The kind its output is counted under when recomputed.
    fn kind(self) -> Kind {
        match self {
            Op::Qkv => Kind::Qkv,
            Op::Attention => Kind::Attention,
            Op::Proj => Kind::Residual,
            Op::Fc => Kind::Hidden,
            Op::Out => Kind::BlockOutput,
        }
    }
}

/// The tensors a block's forward pass keeps for its backward pass.
#[derive(Debug)]
pub struct Values<S> {
    /// The block's input.
    pub x: S,
    /// The attention's input projection.
    pub qkv: S,
    /// The attention's output (and with kept scores, its softmax weights after it).
    pub att: S,
    /// The attention's rows' log-sum-exps.
    pub stats: S,
    /// The residual stream after the attention.
    pub res2: S,
    /// The MLP's hidden layer before its GELU.
    pub fch: S,
}

/// What a block's forward pass gives: the tensors it keeps and its output (if asked).
pub type Forward<S> = (Values<S>, Option<S>);

/// One block of a step: its parameters, the shape of the step's attention and whether the
/// attention keeps its softmax weights.
#[derive(Debug)]
pub struct Layer<'s, 'a, B: Backend> {
    /// The step's backend, threads and dryness.
    pub ops: &'s Ops<'a, B>,
    /// The block's parameters.
    pub params: &'s Block<B>,
    /// The step's batch, sequence and heads.
    pub heads: Heads,
    /// The attention keeps its softmax weights (`--keep-scores`).
    pub keep_scores: bool,
}

impl<B: Backend> Layer<'_, '_, B> {
    /// The rows and columns of `op`'s output.
    fn shape(&self, op: Op) -> (usize, usize) {
        let (n, c) = (self.heads.rows(), self.heads.width());
        match op {
            Op::Qkv => (n, 3 * c),
            Op::Attention if self.keep_scores => {
                let probs = self.heads.probs_len().unwrap_or(usize::MAX);
                (1, (n * c).saturating_add(probs))
            }
            Op::Attention => (n, c),
            Op::Proj | Op::Out => (n, c),
            Op::Fc => (n, 4 * c),
        }
    }

    /// A recompute's cost, in multiply-adds at a GEMM's rate.
    fn cost(&self, op: Op) -> u64 {
        let (n, c) = (self.heads.rows() as u64, self.heads.width() as u64);
        let h = self.heads;
        let attention = (h.batch * h.heads) as u64 * (h.seq as u64).pow(2) * h.size as u64;
        match op {
            Op::Qkv => n * c * 3 * c,
            // Its multiply-adds run at about a third of a GEMM's rate (small products and
            // a softmax between them): the cost is the time a recompute takes.
            Op::Attention => attention * 3,
            Op::Proj => n * c * c,
            Op::Fc | Op::Out => n * c * 4 * c,
        }
    }

    /// `op` as a kernel: what the forward pass runs and a recompute runs again (holding the
    /// parameters it reads for as long as its value lives).
    pub fn kernel(&self, op: Op) -> Kernel {
        if self.ops.dry {
            return Kernel::zeros();
        }
        let (heads, threads, keep_scores) = (self.heads, self.ops.threads, self.keep_scores);
        let (n, c) = (heads.rows(), heads.width());
        let p = |which: W| self.params[which].handle();
        // The layer `k -> n_out` with weight `w` and bias `b` as the GEMM reads them.
        fn layer<'a>(
            (k, n): (usize, usize),
            (w, b): (&'a [f32], &'a [f32]),
            prologue: Prologue<'a>,
            residual: Option<&'a [f32]>,
        ) -> Linear<'a> {
            Linear {
                k,
                n,
                weight: w,
                bias: b,
                prologue,
                residual,
                relu: false,
            }
        }
        match op {
            Op::Qkv => {
                let (lw, lb, w, b) = (p(W::Ln1W), p(W::Ln1B), p(W::AttnW), p(W::AttnB));
                Kernel::new(move |inputs, out| {
                    let norm = Prologue::LayerNorm {
                        weight: B::slice(&lw),
                        bias: B::slice(&lb),
                    };
                    let weights = (B::slice(&w), B::slice(&b));
                    layer((c, 3 * c), weights, norm, None).run(n, inputs[0], out, threads);
                })
            }
            Op::Attention => Kernel::new(move |inputs, out| {
                // A recompute: the rows' statistics, kept from the first run, are not kept.
                let (out, probs) = out.split_at_mut(n * c);
                let probs = keep_scores.then_some(probs);
                attention::forward(heads, inputs[0], out, None, probs);
            }),
            Op::Proj => {
                let (w, b) = (p(W::ProjW), p(W::ProjB));
                Kernel::new(move |inputs, out| {
                    let (att, x) = (&inputs[0][..n * c], inputs[1]);
                    let weights = (B::slice(&w), B::slice(&b));
                    layer((c, c), weights, Prologue::Identity, Some(x)).run(n, att, out, threads);
                })
            }
            Op::Fc => {
                let (lw, lb, w, b) = (p(W::Ln2W), p(W::Ln2B), p(W::FcW), p(W::FcB));
                Kernel::new(move |inputs, out| {
                    let norm = Prologue::LayerNorm {
                        weight: B::slice(&lw),
                        bias: B::slice(&lb),
                    };
                    let weights = (B::slice(&w), B::slice(&b));
                    layer((c, 4 * c), weights, norm, None).run(n, inputs[0], out, threads);
                })
            }
            Op::Out => {
                let (w, b) = (p(W::OutW), p(W::OutB));
                Kernel::new(move |inputs, out| {
                    let (fch, res2) = (inputs[0], inputs[1]);
                    let weights = (B::slice(&w), B::slice(&b));
                    let gelu = layer((4 * c, c), weights, Prologue::Gelu, Some(res2));
                    gelu.run(n, fch, out, threads);
                })
            }
        }
    }

    /// Runs `op` on `inputs` and keeps its output as `keeping` says.
    fn apply(&self, op: Op, inputs: &[&B::Saved], keeping: Keeping) -> anyhow::Result<B::Saved> {
        let kernel = self.kernel(op);
        let (rows, cols) = self.shape(op);
        let out = with_all::<B, _>(inputs, |slices| {
            // SAFETY: every kernel of a block writes every element of its output.
            unsafe { self.ops.written(rows, cols, |out| kernel.run(slices, out)) }
        })?;
        self.keep(op, out, inputs, keeping)
    }

    /// Keeps `op`'s output `out` (from `inputs`) as `keeping` says.
    fn keep(
        &self,
        op: Op,
        out: B::Buf,
        inputs: &[&B::Saved],
        keeping: Keeping,
    ) -> anyhow::Result<B::Saved> {
        match keeping {
            Keeping::Plain => self.ops.backend.save(out),
            Keeping::Evictable => {
                let (kind, cost) = (op.kind(), self.cost(op));
                let kernel = self.kernel(op);
                self.ops
                    .backend
                    .save_recomputable(out, inputs, kind, cost, kernel)
            }
        }
    }

    /// The attention on `qkv`: its output (with kept scores, its weights after it), kept as
    /// `keeping` says, and its rows' log-sum-exps (one number a row, from which the backward
    /// pass computes the weights), kept plainly. Two tensors, not one: the output keeps its
    /// own size (4 MiB at the main job's shape, a whole size class), which a few KiB more
    /// would round up to the next. A recompute of an evicted output runs
    /// [`Op::Attention`]'s kernel, which finds the same statistics again and drops them.
    fn attention(&self, qkv: &B::Saved, keeping: Keeping) -> anyhow::Result<(B::Saved, B::Saved)> {
        let (heads, keep_scores) = (self.heads, self.keep_scores);
        let (n, c) = (heads.rows(), heads.width());
        let (rows, cols) = self.shape(Op::Attention);
        let len = heads
            .stats_len()
            .ok_or_else(|| anyhow::anyhow!("the attention's statistics overflow"))?;
        let (out, stats) = with_all::<B, _>(&[qkv], |slices| {
            let mut out = None;
            // SAFETY: `attention::forward` writes every element of the statistics and of its
            // output (the kept weights too); if the output cannot be had, the statistics are
            // written zeros (and dropped below); a dry step runs neither closure.
            let stats = unsafe {
                self.ops.written(1, len, |stats| {
                    let written = self.ops.written(rows, cols, |out| {
                        let (out, probs) = out.split_at_mut(n * c);
                        let probs = keep_scores.then_some(probs);
                        attention::forward(heads, slices[0], out, Some(stats), probs);
                    });
                    if written.is_err() {
                        stats.fill(std::mem::MaybeUninit::new(0.0));
                    }
                    out = Some(written);
                })?
            };
            let out = match out {
                Some(out) => out?,
                None if self.ops.dry => self.ops.zeros(rows, cols)?,
                None => anyhow::bail!("the attention's output was not written"),
            };
            Ok((out, stats))
        })?;
        let stats = self.ops.backend.save(stats)?;
        Ok((self.keep(Op::Attention, out, &[qkv], keeping)?, stats))
    }

    /// The block's forward pass from its input `x`: the tensors it keeps, each as `keeping`
    /// says, and its output (unless `with_out` is false: a recomputed segment's last block,
    /// whose output the step has already).
    pub fn forward(
        &self,
        x: B::Saved,
        keeping: Keeping,
        with_out: bool,
    ) -> anyhow::Result<Forward<B::Saved>> {
        let qkv = self.apply(Op::Qkv, &[&x], keeping)?;
        let (att, stats) = self.attention(&qkv, keeping)?;
        let res2 = self.apply(Op::Proj, &[&att, &x], keeping)?;
        let fch = self.apply(Op::Fc, &[&res2], keeping)?;
        let out = match with_out {
            true => Some(self.apply(Op::Out, &[&fch, &res2], keeping)?),
            false => None,
        };
        let values = Values {
            x,
            qkv,
            att,
            stats,
            res2,
            fch,
        };
        Ok((values, out))
    }

    /// The block's backward pass: from the gradient `dx` of its output (which becomes that of
    /// its input, in place) and the tensors its forward pass kept, its parameters' gradients
    /// (in [`BLOCK_PARAMS`]' order). Each kept tensor is read (recomputed if it was evicted)
    /// while it is needed and not longer.
    pub fn backward(
        &self,
        values: &Values<B::Saved>,
        mut dx: B::Buf,
    ) -> anyhow::Result<(B::Buf, Vec<B::Buf>)> {
        let mut grads: Vec<Option<B::Buf>> = (0..BLOCK_PARAMS.len()).map(|_| None).collect();
        let dh = self.mlp_out_backward(values, &dx, &mut grads)?;
        self.mlp_in_backward(values, dh, &mut dx, &mut grads)?;
        let dqkv = self.attention_backward(values, &dx, &mut grads)?;
        self.qkv_backward(values, dqkv, &mut dx, &mut grads)?;
        let grads = grads
            .into_iter()
            .map(|g| g.ok_or_else(|| anyhow::anyhow!("a block parameter without a gradient")))
            .collect::<anyhow::Result<_>>()?;
        Ok((dx, grads))
    }

    /// Through `out = res2 + gelu(fch) W_out + b_out`: `W_out`'s and `b_out`'s gradients, and
    /// the gradient of `fch` (the residual's passes through `dx` as it is).
    fn mlp_out_backward(
        &self,
        values: &Values<B::Saved>,
        dx: &B::Buf,
        grads: &mut [Option<B::Buf>],
    ) -> anyhow::Result<B::Buf> {
        let (n, c, ops) = (self.heads.rows(), self.heads.width(), self.ops);
        let dx = B::slice(dx);
        B::with_saved(&values.fch, |fch| {
            // SAFETY: `gelu_uninit` writes every element of its output.
            let g = unsafe { ops.written(n, 4 * c, |out| gelu_uninit(&fch[..n * 4 * c], out))? };
            grads[W::OutW as usize] = Some(ops.weight_grad(n, 4 * c, c, B::slice(&g), dx)?);
            grads[W::OutB as usize] = Some(ops.column_sums(n, c, dx)?);
            drop(g);
            let w_out = Mat::transposed(self.params[W::OutW].get(), c);
            let mut dh = ops.product(n, c, 4 * c, Mat::rows(dx, c), w_out)?;
            ops.run(|| gelu_backward(B::slice_mut(&mut dh), fch));
            Ok(dh)
        })
    }

    /// Through `fch = ln_2(res2) W_fc + b_fc`: `W_fc`'s, `b_fc`'s and `ln_2`'s gradients, and
    /// `res2`'s added to `dx`.
    fn mlp_in_backward(
        &self,
        values: &Values<B::Saved>,
        dh: B::Buf,
        dx: &mut B::Buf,
        grads: &mut [Option<B::Buf>],
    ) -> anyhow::Result<()> {
        let (n, c, ops, p) = (self.heads.rows(), self.heads.width(), self.ops, self.params);
        B::with_saved(&values.res2, |res2| {
            let (h2, stats) = ops.layernorm(n, c, res2, p[W::Ln2W].get(), p[W::Ln2B].get())?;
            let g = B::slice(&dh);
            grads[W::FcW as usize] = Some(ops.weight_grad(n, c, 4 * c, B::slice(&h2), g)?);
            grads[W::FcB as usize] = Some(ops.column_sums(n, 4 * c, g)?);
            drop(h2);
            let w_fc = Mat::transposed(p[W::FcW].get(), 4 * c);
            let dh2 = ops.product(n, 4 * c, c, Mat::rows(g, 4 * c), w_fc)?;
            drop(dh);
            let (dw, db) = self.layernorm_backward(res2, &dh2, &stats, W::Ln2W, dx)?;
            grads[W::Ln2W as usize] = Some(dw);
            grads[W::Ln2B as usize] = Some(db);
            Ok(())
        })
    }

    /// Through `res2 = x + att W_proj + b_proj` and the attention: `W_proj`'s and `b_proj`'s
    /// gradients, and the gradient of `qkv` (the residual's passes through `dx`).
    fn attention_backward(
        &self,
        values: &Values<B::Saved>,
        dx: &B::Buf,
        grads: &mut [Option<B::Buf>],
    ) -> anyhow::Result<B::Buf> {
        let (n, c, ops, heads) = (self.heads.rows(), self.heads.width(), self.ops, self.heads);
        let dx = B::slice(dx);
        B::with_saved(&values.att, |att| {
            let (out, probs) = att.split_at(n * c);
            let probs = self.keep_scores.then_some(probs);
            grads[W::ProjW as usize] = Some(ops.weight_grad(n, c, c, out, dx)?);
            grads[W::ProjB as usize] = Some(ops.column_sums(n, c, dx)?);
            let w_proj = Mat::transposed(self.params[W::ProjW].get(), c);
            let d_out = ops.product(n, c, c, Mat::rows(dx, c), w_proj)?;
            B::with_saved(&values.qkv, |qkv| {
                B::with_saved(&values.stats, |stats| {
                    let d_out = B::slice(&d_out);
                    // SAFETY: `attention::backward` writes every element of its output.
                    unsafe {
                        ops.written(n, 3 * c, |dqkv| {
                            attention::backward(heads, qkv, (out, stats), d_out, probs, dqkv)
                        })
                    }
                })
            })
        })
    }

    /// Through `qkv = ln_1(x) W_attn + b_attn`: `W_attn`'s, `b_attn`'s and `ln_1`'s
    /// gradients, and `x`'s added to `dx`.
    fn qkv_backward(
        &self,
        values: &Values<B::Saved>,
        dqkv: B::Buf,
        dx: &mut B::Buf,
        grads: &mut [Option<B::Buf>],
    ) -> anyhow::Result<()> {
        let (n, c, ops, p) = (self.heads.rows(), self.heads.width(), self.ops, self.params);
        B::with_saved(&values.x, |x| {
            let (h1, stats) = ops.layernorm(n, c, x, p[W::Ln1W].get(), p[W::Ln1B].get())?;
            let g = B::slice(&dqkv);
            grads[W::AttnW as usize] = Some(ops.weight_grad(n, c, 3 * c, B::slice(&h1), g)?);
            grads[W::AttnB as usize] = Some(ops.column_sums(n, 3 * c, g)?);
            drop(h1);
            let w_attn = Mat::transposed(p[W::AttnW].get(), 3 * c);
            let dh1 = ops.product(n, 3 * c, c, Mat::rows(g, 3 * c), w_attn)?;
            drop(dqkv);
            let (dw, db) = self.layernorm_backward(x, &dh1, &stats, W::Ln1W, dx)?;
            grads[W::Ln1W as usize] = Some(dw);
            grads[W::Ln1B as usize] = Some(db);
            Ok(())
        })
    }

    /// A layer norm's backward pass (its weight is `weight`): the input's gradient added to
    /// `dx`, and the weight's and the bias's gradients.
    fn layernorm_backward(
        &self,
        input: &[f32],
        dout: &B::Buf,
        stats: &B::Buf,
        weight: W,
        dx: &mut B::Buf,
    ) -> anyhow::Result<(B::Buf, B::Buf)> {
        let (n, c, ops) = (self.heads.rows(), self.heads.width(), self.ops);
        let (mut dw, mut db) = (ops.zeros(1, c)?, ops.zeros(1, c)?);
        let w = self.params[weight].get();
        ops.run(|| {
            layernorm::backward(
                n,
                c,
                B::slice(dout),
                input,
                w,
                B::slice(stats),
                B::slice_mut(dx),
                B::slice_mut(&mut dw),
                B::slice_mut(&mut db),
            )
        });
        Ok((dw, db))
    }
}

/// Runs `f` on the elements of every one of `inputs` (at most two), each read (and pinned,
/// or recomputed if it was evicted) while `f` runs.
pub fn with_all<B: Backend, R>(
    inputs: &[&B::Saved],
    f: impl FnOnce(&[&[f32]]) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    match inputs {
        [] => f(&[]),
        [a] => B::with_saved(a, |a| f(&[a])),
        [a, b] => B::with_saved(a, |a| B::with_saved(b, |b| f(&[a, b]))),
        _ => Err(anyhow::anyhow!("a kernel of more than two inputs")),
    }
}
