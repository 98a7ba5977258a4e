//! The MLP's forward and backward passes: layer by layer or segment by segment, as [`Keep`]
//! says, each layer's Adam step as soon as the backward pass has its gradients.

use std::cell::RefCell;

use anyhow::anyhow;
use bumpalo::Bump;

use super::layer::Forward;
use super::Trainer;
use crate::backend::{Backend, Kernel};
use crate::kernels::elementwise::relu_mask;
use crate::kernels::gemm::Mat;
use crate::recomputes::Kind;

/// Runs `f` with this thread's scratch arena, reset first (a new step: the last step's
/// lists are gone); with a fresh arena if this thread's is in use (a re-entered replay).
fn with_scratch<R>(f: impl FnOnce(&Bump) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            scratch.reset();
            f(&scratch)
        }
        Err(_) => f(&Bump::new()),
    })
}

thread_local! {
    /// The per-step scratch arena of the thread that runs the backward pass: the replay's
    /// short lists (the recomputed inputs of a segment) are bump-allocated here and the arena
    /// is reset at the next step, so after the first step they cost no allocator call.
    static SCRATCH: RefCell<Bump> = RefCell::new(Bump::new());
}

impl<B: Backend> Trainer<'_, B> {
    /// Clips `grad` where the ReLU's `output` is zero (not in a dry run).
    fn relu_mask(&self, grad: &mut B::Buf, output: &[f32]) {
        if !self.ops.dry {
            relu_mask(B::slice_mut(grad), output);
        }
    }

    /// Layer `l` on `rows` rows of `input`: `relu?(input * W + b)`, fused (no ReLU for the
    /// last layer); the GEMM's rows split over the threads.
    fn linear(&self, l: usize, input: &[f32], rows: usize) -> anyhow::Result<B::Buf> {
        let layer = self.forward_kernel(l, rows)?;
        // SAFETY: `Forward::run` writes every element of its output.
        unsafe { self.ops.written(rows, layer.n, |out| layer.run(input, out)) }
    }

    /// What layer `l`'s forward kernel reads on `rows` rows, besides its input.
    fn forward_kernel(&self, l: usize, rows: usize) -> anyhow::Result<Forward<B>> {
        let layer = &self.layers[l];
        let (weight, bias) = layer.shared()?;
        Ok(Forward {
            rows,
            k: layer.inputs,
            n: layer.outputs,
            relu: l + 1 < self.layers.len(),
            threads: self.ops.threads,
            weight,
            bias,
        })
    }

    /// The backward pass of [`Keep::Every`], on the worker threads: segment by segment,
    /// newest first, recompute the segment's inputs from its checkpoint (read in place,
    /// every thread reading it at once), then back-propagate through its layers. Its short
    /// list lives in this thread's scratch arena.
    pub(super) fn backward(
        &self,
        chain: B::Chain,
        mut upstream: B::Buf,
        batch: usize,
        every: usize,
    ) -> anyhow::Result<()> {
        let count = self.layers.len();
        let replayed = with_scratch(|scratch| -> anyhow::Result<()> {
            // The recomputed inputs of the segment's layers after its first, newest last.
            let mut inputs = bumpalo::collections::Vec::with_capacity_in(every, scratch);
            for start in (0..count).step_by(every).rev() {
                let end = (start + every).min(count);
                let _replay = self.ops.backend.span("backward (segment)");
                B::with_saved(&B::checkpoint(&chain, start)?, |first| {
                    inputs.clear();
                    for l in start..end - 1 {
                        let input = inputs.last().map_or(first, |buf| B::slice(buf));
                        let next = self.linear(l, input, batch)?;
                        inputs.push(next);
                    }
                    for l in (start..end).rev() {
                        // The ReLU output is the next layer's input: recomputed (and done
                        // with once read), or the next segment's checkpoint.
                        if l + 1 == end && end < count {
                            B::with_saved(&B::checkpoint(&chain, end)?, |output| {
                                self.relu_mask(&mut upstream, output);
                                Ok(())
                            })?;
                        } else if l + 1 < end {
                            let output = inputs
                                .pop()
                                .ok_or_else(|| anyhow!("layer {l}'s output was not recomputed"))?;
                            self.relu_mask(&mut upstream, B::slice(&output));
                        }
                        let input = inputs.last().map_or(first, |buf| B::slice(buf));
                        if let Some(next) = self.back_propagate(l, input, &upstream, batch)? {
                            upstream = next;
                        }
                    }
                    Ok(())
                })?;
            }
            Ok(())
        });
        drop(chain); // the end of the step's retention: the checkpoints go back
        replayed
    }

    /// The backward pass of [`Keep::Fitted`], on the worker threads, layer by layer, newest
    /// first: each layer's input is read once (the pool recomputes it if it evicted it),
    /// the layer back-propagates through it, and the input goes back. The same operations
    /// on the same rows as [`backward`](Self::backward), in the same order.
    pub(super) fn backward_layers(
        &self,
        mut chain: B::Chain,
        mut upstream: B::Buf,
        batch: usize,
    ) -> anyhow::Result<()> {
        for l in (0..self.layers.len()).rev() {
            let saved = B::checkpoint(&chain, l)?;
            let _layer = self.ops.backend.span("backward (layer)");
            B::with_saved(&saved, |input| {
                if let Some(mut next) = self.back_propagate(l, input, &upstream, batch)? {
                    // The gradient of layer l - 1's output, through its ReLU, whose output
                    // is this layer's input.
                    self.relu_mask(&mut next, input);
                    upstream = next;
                }
                Ok(())
            })?;
            drop(saved);
            B::pop_checkpoint(&mut chain, l); // this layer's input goes back now
        }
        Ok(())
    }

    /// Layer `l`'s weight and bias gradients over the batch's `rows` rows, from its `input`
    /// and the (masked) gradient `g` of its output, and the gradient of its input (`None`
    /// for the first layer, whose input is the data: nothing reads it); then the layer's
    /// Adam step, so that a step holds one layer's gradients at a time. The update changes
    /// nothing that the rest of the pass reads: the input's gradient came from the old
    /// weight, and the layers below recompute from their own.
    fn back_propagate(
        &self,
        l: usize,
        input: &[f32],
        g: &B::Buf,
        rows: usize,
    ) -> anyhow::Result<Option<B::Buf>> {
        let layer = &self.layers[l];
        let (k, n, g) = (layer.inputs, layer.outputs, B::slice(g));
        // dW = input^T * g, its output split over the threads, each summing every batch row.
        let wg = self.ops.weight_grad(rows, k, n, input, g)?;
        let bg = self.ops.column_sums(rows, n, g)?;
        let next = if l == 0 {
            None
        } else {
            // d input = g * W^T (the transpose is a stride, no copy).
            let (weight, _) = layer.shared()?;
            let (g, weight) = (Mat::rows(g, n), Mat::transposed(B::slice(&weight), n));
            Some(self.ops.product(rows, n, k, g, weight)?)
        };
        if self.ops.dry {
            return Ok(next);
        }
        let _update = self.ops.backend.span("optimizer (layer)");
        // Adam's step count (its bias corrections are 1 long before 2^31 steps).
        let t = i32::try_from(self.step).unwrap_or(i32::MAX);
        layer.update(B::slice(&wg), B::slice(&bg), self.lr, t)?;
        Ok(next)
    }

    /// A chain whose first node holds the data, `x`, kept: the chain and what it keeps.
    fn start_chain(&self, x: B::Buf) -> anyhow::Result<(B::Saved, B::Chain)> {
        let mut chain = B::Chain::default();
        let kept = self.ops.backend.save(x)?;
        self.ops
            .backend
            .push_checkpoint(&mut chain, 0, [(0, kept.clone())]);
        Ok((kept, chain))
    }

    /// The forward pass of [`Keep::Every`]: returns the logits and the chain of checkpoints.
    pub(super) fn forward(
        &self,
        x: B::Buf,
        batch: usize,
        every: usize,
    ) -> anyhow::Result<(B::Buf, B::Chain)> {
        let count = self.layers.len();
        let (mut current, mut chain) = self.start_chain(x)?;
        let mut live: Option<B::Buf> = None;
        for l in 0..count {
            let out = match &live {
                Some(buf) => self.linear(l, B::slice(buf), batch)?,
                None => B::with_saved(&current, |input| self.linear(l, input, batch))?,
            };
            if l + 1 < count && (l + 1) % every == 0 {
                current = self.ops.backend.save(out)?;
                self.ops
                    .backend
                    .push_checkpoint(&mut chain, l + 1, [(l + 1, current.clone())]);
                live = None;
            } else {
                live = Some(out); // the previous non-checkpointed activation drops here
            }
        }
        let logits = live.ok_or_else(|| anyhow!("the last layer is never a checkpoint"))?;
        Ok((logits, chain))
    }

    /// The forward pass of [`Keep::Fitted`]: every layer's input is kept, each (but the
    /// data) as a value the pool may evict and recompute from the one before. Returns the
    /// logits and the chain.
    pub(super) fn forward_fitted(
        &self,
        x: B::Buf,
        batch: usize,
    ) -> anyhow::Result<(B::Buf, B::Chain)> {
        let count = self.layers.len();
        let (mut current, mut chain) = self.start_chain(x)?;
        for l in 0..count {
            let out = B::with_saved(&current, |input| self.linear(l, input, batch))?;
            if l + 1 == count {
                return Ok((out, chain));
            }
            let layer = &self.layers[l];
            let cost = (batch as u64)
                .saturating_mul(layer.inputs as u64)
                .saturating_mul(layer.outputs as u64);
            current = self.ops.backend.save_recomputable(
                out,
                &[&current],
                Kind::Layer,
                cost,
                self.kernel(l, batch)?,
            )?;
            self.ops
                .backend
                .push_checkpoint(&mut chain, l + 1, [(l + 1, current.clone())]);
        }
        Err(anyhow!("a model without layers"))
    }

    /// Layer `l` on `rows` rows as a recompute runs it: the forward pass's own computation
    /// (the same rows split over the same threads), so a recomputed value is bit-identical.
    fn kernel(&self, l: usize, rows: usize) -> anyhow::Result<Kernel> {
        if self.ops.dry {
            return Ok(Kernel::zeros());
        }
        let layer = self.forward_kernel(l, rows)?;
        Ok(Kernel::new(move |inputs, out| layer.run(inputs[0], out)))
    }
}
