//! The MLP and its training step: an MLP (`INPUT -> layers x hidden -> CLASSES`, ReLU),
//! softmax cross-entropy against a random linear teacher, Adam, and activation
//! checkpointing, in one of two ways ([`Keep`]):
//!
//! - every n-th layer: only the input of every `checkpoint_every`-th layer is kept through
//!   the forward pass; the backward pass recomputes the rest, segment by segment;
//! - fitted to the budget: every layer's input is kept as an evictable value; the pool evicts
//!   what does not fit, and the backward pass, layer by layer, reads each input (recomputed
//!   by the pool if it was evicted) and gives it back once done.
//!
//! Both compute the same numbers in the same order: their losses are bit-identical.
//!
//! The threads share each kernel over the whole batch (see [`kernels`]): every GEMM is one
//! call whose output they split, each summing its elements over every row in the order the
//! shapes fix. So the losses are bit-identical at any thread count, and what a step holds
//! does not grow with the threads: no per-thread copies of the gradients to sum. Each
//! layer's Adam step runs as soon as the backward pass has its gradients, so a step holds
//! one layer's gradients at a time.

use anyhow::anyhow;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use bumpalo::Bump;
use rand::{Rng as _, SeedableRng};
use rand_distr::StandardNormal;
use rand_xoshiro::Xoshiro256PlusPlus;

use super::Model;
use crate::args::{Args, Keep};
use crate::backend::{Backend, Kernel};
use crate::kernels::elementwise::{adam, relu_mask};
use crate::kernels::gemm::{self as kernels, Linear as Fused, Mat, Prologue};

/// Input features.
pub const INPUT: usize = 128;
/// Output classes.
pub const CLASSES: usize = 10;

/// The data's and the weights' random numbers: a seeded xoshiro256++, so every allocator
/// trains the same model on the same data.
type Rng = Xoshiro256PlusPlus;

/// A standard normal sample.
fn normal(rng: &mut Rng) -> f32 {
    rng.sample(StandardNormal)
}

/// One linear layer: its shape, and its parameters and Adam state (allocated once, for the
/// whole run, from the backend: under a budget they count in it).
struct Linear<B: Backend> {
    inputs: usize,
    outputs: usize,
    /// Locked only to take handles to the weight and bias or to update them.
    params: Mutex<Params<B>>,
}

impl<B: Backend> std::fmt::Debug for Linear<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear")
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .finish_non_exhaustive()
    }
}

/// A parameter tensor, shared with the kernels that read it.
type Shared<B> = Arc<<B as Backend>::Buf>;

/// A layer's weight and bias, shared (`Arc`) with the kernels that read them (a recompute's
/// included, see [`Trainer::kernel`]), and Adam's moments. The backward pass updates them as
/// soon as it has the layer's gradients, when no kernel of the step reads them any more.
struct Params<B: Backend> {
    weight: Shared<B>,
    bias: Shared<B>,
    /// Adam moments: weight m, weight v, bias m, bias v.
    moments: [B::Buf; 4],
}

impl<B: Backend> Linear<B> {
    /// A layer with normal initial weights drawn from `rng` (zeros without it, for a dry
    /// run), its buffers from `backend`; an error if they overflow or cannot be had (sizes
    /// from the command line).
    fn new(
        backend: &B,
        inputs: usize,
        outputs: usize,
        rng: Option<&mut Rng>,
    ) -> anyhow::Result<Self> {
        let scale = (2.0 / inputs as f32).sqrt();
        let zeros = |rows, cols| backend.zeros(rows, cols);
        let mut weight = zeros(inputs, outputs)?;
        if let Some(rng) = rng {
            B::slice_mut(&mut weight)
                .iter_mut()
                .for_each(|w| *w = normal(rng) * scale);
        }
        let params = Params {
            weight: Arc::new(weight),
            bias: Arc::new(zeros(1, outputs)?),
            moments: [
                zeros(inputs, outputs)?,
                zeros(inputs, outputs)?,
                zeros(1, outputs)?,
                zeros(1, outputs)?,
            ],
        };
        Ok(Self {
            inputs,
            outputs,
            params: Mutex::new(params),
        })
    }

    /// The parameters, locked.
    fn params(&self) -> anyhow::Result<std::sync::MutexGuard<'_, Params<B>>> {
        self.params
            .lock()
            .map_err(|_| anyhow!("a thread panicked updating a layer"))
    }

    /// Handles to the weight and bias.
    fn shared(&self) -> anyhow::Result<(Shared<B>, Shared<B>)> {
        let params = self.params()?;
        Ok((Arc::clone(&params.weight), Arc::clone(&params.bias)))
    }

    /// Adam's step `t` (from 1) with learning rate `lr` and the layer's gradients, split over
    /// the current rayon pool's threads; an error if a kernel still holds the parameters.
    fn update(
        &self,
        weight_grad: &[f32],
        bias_grad: &[f32],
        lr: f32,
        t: i32,
    ) -> anyhow::Result<()> {
        let mut params = self.params()?;
        let Params {
            weight,
            bias,
            moments: [mw, vw, mb, vb],
        } = &mut *params;
        let shared = || anyhow!("a layer's parameters are still shared at its update");
        adam(
            B::slice_mut(Arc::get_mut(weight).ok_or_else(shared)?),
            weight_grad,
            B::slice_mut(mw),
            B::slice_mut(vw),
            lr,
            t,
        );
        adam(
            B::slice_mut(Arc::get_mut(bias).ok_or_else(shared)?),
            bias_grad,
            B::slice_mut(mb),
            B::slice_mut(vb),
            lr,
            t,
        );
        Ok(())
    }
}

/// The model, its data and its threads.
#[derive(Debug)]
pub struct Trainer<'a, B: Backend> {
    backend: &'a B,
    layers: Vec<Linear<B>>,
    keep: Keep,
    threads: usize,
    teacher: Vec<f32>,
    rng: Rng,
    step: usize,
    lr: f32,
    /// Examples per batch.
    batch: usize,
    /// Kept from step to step: the batch's labels.
    labels: Vec<usize>,
    /// The step's threads, kept for the whole run (as a training runtime keeps its threads).
    workers: rayon::ThreadPool,
    /// A dry run: the same buffers, of the same sizes, taken and given back in the same
    /// order, but no kernel runs (each buffer is zeros). It finds what a step needs from the
    /// memory in a fraction of a step's time; its losses mean nothing.
    dry: bool,
}

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

impl<B: Backend> Model for Trainer<'_, B> {
    fn step(&mut self) -> anyhow::Result<f32> {
        self.train_step(self.batch)
    }

    fn digest(&self) -> u64 {
        self.layers.iter().fold(super::DIGEST_START, |hash, layer| {
            let params = layer.params.lock().unwrap_or_else(|e| e.into_inner());
            let hash = super::digest_of(hash, B::slice(&params.weight));
            super::digest_of(hash, B::slice(&params.bias))
        })
    }

    fn describe(&self) -> String {
        let hidden = self.layers.first().map_or(0, |layer| layer.outputs);
        format!(
            "MLP {INPUT} -> {} x {hidden} -> {CLASSES}, batch {}, {}",
            self.layers.len() - 1,
            self.batch,
            match self.keep {
                Keep::Every(every) => format!("checkpoint every {every} layer(s)"),
                Keep::Fitted => "inputs kept as the budget allows".to_owned(),
            },
        )
    }
}

impl<'a, B: Backend> Trainer<'a, B> {
    /// A fresh model; an error if its worker threads cannot start. Without `kernels` its
    /// steps are dry (see the `dry` field): it takes and gives back the buffers a step
    /// takes, in the same order, without computing them.
    pub fn with_kernels(backend: &'a B, args: &Args, kernels: bool) -> anyhow::Result<Self> {
        let mut rng = Rng::seed_from_u64(args.seed);
        let teacher = (0..INPUT * CLASSES).map(|_| normal(&mut rng)).collect();
        let mut dims = Vec::new();
        dims.try_reserve_exact(args.layers.saturating_add(2))
            .map_err(|e| anyhow!("{} layers: {e}", args.layers))?;
        dims.push(INPUT);
        dims.extend(std::iter::repeat_n(args.hidden, args.layers));
        dims.push(CLASSES);
        let layers = dims
            .windows(2)
            .map(|w| Linear::new(backend, w[0], w[1], kernels.then_some(&mut rng)))
            .collect::<anyhow::Result<_>>()?;
        let mut labels = Vec::new();
        labels
            .try_reserve_exact(args.batch)
            .map_err(|e| anyhow!("labels for a batch of {}: {e}", args.batch))?;
        let threads = args.threads();
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("worker {i}")) // the trace's track names
            .build()
            .map_err(|e| anyhow!("starting {threads} worker thread(s): {e}"))?;
        // Hidden layers and the output layer.
        let layer_count = args.layers.saturating_add(1);
        Ok(Self {
            backend,
            layers,
            keep: match args.keep() {
                // Past the layer count it keeps the first layer's input alone, as the count
                // does (and sizes a scratch vector by it); 0 (keep everything) is 1 here.
                Keep::Every(every) => Keep::Every(every.clamp(1, layer_count)),
                Keep::Fitted => Keep::Fitted,
            },
            threads,
            teacher,
            rng,
            step: 0,
            lr: args.lr as f32,
            batch: args.batch,
            labels,
            workers,
            dry: !kernels,
        })
    }

    /// Clips `grad` where the ReLU's `output` is zero (not in a dry run).
    fn relu_mask(&self, grad: &mut B::Buf, output: &[f32]) {
        if !self.dry {
            relu_mask(B::slice_mut(grad), output);
        }
    }

    /// A `rows x cols` buffer that `kernel` writes; zeros in a dry run, which runs no kernel.
    ///
    /// # Safety
    ///
    /// `kernel` writes every element of the slice it is given.
    unsafe fn written(
        &self,
        rows: usize,
        cols: usize,
        kernel: impl FnOnce(&mut [std::mem::MaybeUninit<f32>]),
    ) -> anyhow::Result<B::Buf> {
        if self.dry {
            return self.backend.zeros(rows, cols);
        }
        // SAFETY: the caller's contract.
        unsafe { self.backend.written(rows, cols, kernel) }
    }

    /// Layer `l` on `rows` rows of `input`: `relu?(input * W + b)`, fused (no ReLU for the
    /// last layer); the GEMM's rows split over the threads.
    fn linear(&self, l: usize, input: &[f32], rows: usize) -> anyhow::Result<B::Buf> {
        let layer = self.forward_kernel(l, rows)?;
        // SAFETY: `Forward::run` writes every element of its output.
        unsafe { self.written(rows, layer.n, |out| layer.run(input, out)) }
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
            threads: self.threads,
            weight,
            bias,
        })
    }

    /// One training step; returns the mean loss.
    pub fn train_step(&mut self, batch: usize) -> anyhow::Result<f32> {
        // The step's and its phases' spans in the trace (`--trace`), on this thread's track.
        let backend = self.backend;
        let _step = backend.span("step");
        self.step += 1;
        let x = self.batch(batch)?;

        // Forward, on every thread: keep the inputs of the layers `keep` says.
        let forward = backend.span("forward");
        let (logits, chain) = self.workers.install(|| match self.keep {
            Keep::Every(every) => self.forward(x, batch, every),
            Keep::Fitted => self.forward_fitted(x, batch),
        })?;
        drop(forward);

        let loss_span = backend.span("loss");
        let (grad, loss) = self.loss(&logits, batch)?;
        drop(logits);
        drop(loss_span);

        // Backward: each layer's gradients, and its Adam step as soon as it has them.
        let _backward = backend.span("backward");
        self.workers.install(|| match self.keep {
            Keep::Every(every) => self.backward(chain, grad, batch, every),
            Keep::Fitted => self.backward_layers(chain, grad, batch),
        })?;
        Ok(loss / batch as f32)
    }

    /// A batch of inputs from the backend; its labels, from the teacher, in `labels`.
    fn batch(&mut self, batch: usize) -> anyhow::Result<B::Buf> {
        if self.dry {
            self.labels.clear();
            self.labels.resize(batch, 0);
            return self.backend.zeros(batch, INPUT);
        }
        let rng = &mut self.rng;
        // SAFETY: the closure writes every element.
        let x = unsafe {
            self.backend.written(batch, INPUT, |x| {
                x.iter_mut().for_each(|v| {
                    v.write(normal(rng));
                })
            })?
        };
        self.labels.clear();
        for row in B::slice(&x).chunks_exact(INPUT) {
            let label = (0..CLASSES)
                .map(|c| {
                    let score: f32 = (0..INPUT)
                        .map(|i| row[i] * self.teacher[i * CLASSES + c])
                        .sum();
                    (c, score)
                })
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(0, |(c, _)| c);
            self.labels.push(label);
        }
        Ok(x)
    }

    /// The loss's gradient with respect to the logits (softmax cross-entropy, mean over the
    /// batch), and the summed loss.
    fn loss(&self, logits: &B::Buf, batch: usize) -> anyhow::Result<(B::Buf, f32)> {
        let mut grad = self.backend.zeros(batch, CLASSES)?;
        let mut loss = 0.0f32;
        if self.dry {
            return Ok((grad, loss));
        }
        for ((row, g), &label) in B::slice(logits)
            .chunks_exact(CLASSES)
            .zip(B::slice_mut(&mut grad).chunks_exact_mut(CLASSES))
            .zip(&self.labels)
        {
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
            for c in 0..CLASSES {
                let p = (row[c] - max).exp() / sum;
                g[c] = (p - f32::from(u8::from(c == label))) / batch as f32;
            }
            loss -= ((row[label] - max).exp() / sum).ln();
        }
        Ok((grad, loss))
    }

    /// The backward pass of [`Keep::Every`], on the worker threads: segment by segment,
    /// newest first, recompute the segment's inputs from its checkpoint (read in place,
    /// every thread reading it at once), then back-propagate through its layers. Its short
    /// list lives in this thread's scratch arena.
    fn backward(
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
                let _replay = self.backend.span("backward (segment)");
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
    fn backward_layers(
        &self,
        mut chain: B::Chain,
        mut upstream: B::Buf,
        batch: usize,
    ) -> anyhow::Result<()> {
        for l in (0..self.layers.len()).rev() {
            let saved = B::checkpoint(&chain, l)?;
            let _layer = self.backend.span("backward (layer)");
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
        let (k, n, threads, g) = (layer.inputs, layer.outputs, self.threads, B::slice(g));
        // dW = input^T * g, its output split over the threads, each summing every batch row.
        // SAFETY: `weight_grad` writes every element of its output.
        let wg = unsafe {
            self.written(k, n, |out| {
                kernels::weight_grad(rows, k, n, input, g, out, threads)
            })?
        };
        // SAFETY: `column_sums` writes every element of its output.
        let bg =
            unsafe { self.written(1, n, |out| kernels::column_sums(rows, n, g, out, threads))? };
        let next = if l == 0 {
            None
        } else {
            // d input = g * W^T (the transpose is a stride, no copy).
            let (weight, _) = layer.shared()?;
            let (g, weight) = (Mat::rows(g, n), Mat::transposed(B::slice(&weight), n));
            // SAFETY: `product` writes every element of its output.
            let next = unsafe {
                self.written(rows, k, |out| {
                    kernels::product(rows, n, k, g, weight, out, threads)
                })?
            };
            Some(next)
        };
        if self.dry {
            return Ok(next);
        }
        let _update = self.backend.span("optimizer (layer)");
        // Adam's step count (its bias corrections are 1 long before 2^31 steps).
        let t = i32::try_from(self.step).unwrap_or(i32::MAX);
        layer.update(B::slice(&wg), B::slice(&bg), self.lr, t)?;
        Ok(next)
    }

    /// The forward pass of [`Keep::Every`]: returns the logits and the chain of checkpoints.
    fn forward(&self, x: B::Buf, batch: usize, every: usize) -> anyhow::Result<(B::Buf, B::Chain)> {
        let count = self.layers.len();
        let mut chain = B::Chain::default();
        let mut current = self.backend.save(x)?;
        self.backend
            .push_checkpoint(&mut chain, 0, [(0, current.clone())]);
        let mut live: Option<B::Buf> = None;
        for l in 0..count {
            let out = match &live {
                Some(buf) => self.linear(l, B::slice(buf), batch)?,
                None => B::with_saved(&current, |input| self.linear(l, input, batch))?,
            };
            if l + 1 < count && (l + 1) % every == 0 {
                current = self.backend.save(out)?;
                self.backend
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
    fn forward_fitted(&self, x: B::Buf, batch: usize) -> anyhow::Result<(B::Buf, B::Chain)> {
        let count = self.layers.len();
        let mut chain = B::Chain::default();
        let mut current = self.backend.save(x)?;
        self.backend
            .push_checkpoint(&mut chain, 0, [(0, current.clone())]);
        for l in 0..count {
            let out = B::with_saved(&current, |input| self.linear(l, input, batch))?;
            if l + 1 == count {
                return Ok((out, chain));
            }
            let layer = &self.layers[l];
            let cost = (batch as u64)
                .saturating_mul(layer.inputs as u64)
                .saturating_mul(layer.outputs as u64);
            current =
                self.backend
                    .save_recomputable(out, &[&current], cost, self.kernel(l, batch)?)?;
            self.backend
                .push_checkpoint(&mut chain, l + 1, [(l + 1, current.clone())]);
        }
        Err(anyhow!("a model without layers"))
    }

    /// Layer `l` on `rows` rows as a recompute runs it: the forward pass's own computation
    /// (the same rows split over the same threads), so a recomputed value is bit-identical.
    fn kernel(&self, l: usize, rows: usize) -> anyhow::Result<Kernel> {
        if self.dry {
            return Ok(Kernel::zeros());
        }
        let layer = self.forward_kernel(l, rows)?;
        Ok(Kernel::new(move |inputs, out| layer.run(inputs[0], out)))
    }
}

/// One layer's forward kernel on a number of rows: the shapes, the threads, and handles to
/// the weight and bias (kept by a recompute for as long as its value lives).
struct Forward<B: Backend> {
    rows: usize,
    k: usize,
    n: usize,
    relu: bool,
    threads: usize,
    weight: Shared<B>,
    bias: Shared<B>,
}

impl<B: Backend> Forward<B> {
    /// Writes every element of `out` from `input`.
    fn run(&self, input: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) {
        let layer = Fused {
            k: self.k,
            n: self.n,
            weight: B::slice(&self.weight),
            bias: B::slice(&self.bias),
            prologue: Prologue::Identity,
            residual: None,
            relu: self.relu,
        };
        layer.run(self.rows, input, out, self.threads);
    }
}
