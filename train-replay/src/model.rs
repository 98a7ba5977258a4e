//! The model and its training step: an MLP (`INPUT -> layers x hidden -> CLASSES`, ReLU),
//! softmax cross-entropy against a random linear teacher, Adam, and activation
//! checkpointing, in one of two ways ([`Keep`]):
//!
//! - every n-th layer: only the input of every `checkpoint_every`-th layer is kept through
//!   the forward pass; the backward pass recomputes the rest, segment by segment, each thread
//!   for its rows;
//! - fitted to the budget: every layer's input is kept as an evictable value; the pool evicts
//!   what does not fit, and the backward pass, layer by layer, reads each input (recomputed
//!   by the pool if it was evicted) and gives it back once done.
//!
//! Both compute the same numbers in the same order: their losses are bit-identical.

use anyhow::anyhow;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use bumpalo::Bump;
use rand::{Rng as _, SeedableRng};
use rand_distr::StandardNormal;
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

use crate::args::{Args, Keep};
use crate::backend::{Backend, Kernel, VecBackend};
use crate::kernels::{self, adam, add_into, par_add_into, relu_mask, Mat};

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

/// One linear layer's parameters and Adam state (allocated once, for the whole run). The
/// weight and bias are shared with the recomputes of a step (see [`Trainer::kernel`]), which
/// are gone by the optimizer's turn.
#[derive(Debug)]
struct Linear {
    inputs: usize,
    outputs: usize,
    weight: Arc<Vec<f32>>,
    bias: Arc<Vec<f32>>,
    /// Adam moments: weight m, weight v, bias m, bias v.
    moments: [Vec<f32>; 4],
}

impl Linear {
    /// A layer with normal initial weights; an error if its buffers overflow or cannot be
    /// had (sizes from the command line).
    fn new(inputs: usize, outputs: usize, rng: &mut Rng) -> anyhow::Result<Self> {
        let scale = (2.0 / inputs as f32).sqrt();
        let zeros = |rows, cols| VecBackend.zeros(rows, cols);
        let mut weight = zeros(inputs, outputs)?;
        weight.fill_with(|| normal(rng) * scale);
        Ok(Self {
            inputs,
            outputs,
            weight: Arc::new(weight),
            bias: Arc::new(zeros(1, outputs)?),
            moments: [
                zeros(inputs, outputs)?,
                zeros(inputs, outputs)?,
                zeros(1, outputs)?,
                zeros(1, outputs)?,
            ],
        })
    }
}

/// The model, its data and its threads.
#[derive(Debug)]
pub struct Trainer<'a, B: Backend> {
    backend: &'a B,
    layers: Vec<Linear>,
    keep: Keep,
    threads: usize,
    teacher: Vec<f32>,
    rng: Rng,
    step: usize,
    lr: f32,
    /// Kept from step to step: the batch's labels.
    labels: Vec<usize>,
    /// The forward pass's and the replay's threads, kept for the whole run (as a training
    /// runtime keeps its threads).
    workers: rayon::ThreadPool,
    /// One per thread, kept from step to step (empty between steps): that thread's share of
    /// the backward pass.
    partials: Vec<Mutex<Partial<B>>>,
}

/// One thread's share of the backward pass: weight and bias gradients for its rows, one per
/// layer (`None` between steps). The lists are kept for the run, so a step allocates none.
struct Partial<B: Backend> {
    weight_grads: Vec<Option<B::Buf>>,
    bias_grads: Vec<Option<B::Buf>>,
}

impl<B: Backend> std::fmt::Debug for Partial<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partial")
            .field("layers", &self.weight_grads.len())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Partial<B> {
    fn new(layers: usize) -> Self {
        Self {
            weight_grads: (0..layers).map(|_| None).collect(),
            bias_grads: (0..layers).map(|_| None).collect(),
        }
    }

    /// Layer `l`'s gradients, which the replay left for every layer.
    fn layer(&mut self, l: usize) -> anyhow::Result<(&mut B::Buf, &mut B::Buf)> {
        let missing = || anyhow!("no gradient of layer {l} from the backward pass");
        Ok((
            self.weight_grads[l].as_mut().ok_or_else(missing)?,
            self.bias_grads[l].as_mut().ok_or_else(missing)?,
        ))
    }
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
    /// Each thread's per-step scratch arena: the replay's short lists (the recomputed inputs
    /// of a segment) are bump-allocated here and the arena is reset when the thread starts
    /// its next step's share, so after the first step they cost no allocator call.
    static SCRATCH: RefCell<Bump> = RefCell::new(Bump::new());
}

impl<'a, B: Backend> Trainer<'a, B> {
    /// A fresh model; an error if its worker threads cannot start.
    pub fn new(backend: &'a B, args: &Args) -> anyhow::Result<Self> {
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
            .map(|w| Linear::new(w[0], w[1], &mut rng))
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
                // does (and sizes a scratch vector by it).
                Keep::Every(every) => Keep::Every(every.clamp(1, layer_count)),
                Keep::Fitted => Keep::Fitted,
            },
            threads,
            teacher,
            rng,
            step: 0,
            lr: args.lr,
            labels,
            partials: (0..threads)
                .map(|_| Mutex::new(Partial::new(dims.len() - 1)))
                .collect(),
            workers,
        })
    }

    /// `relu?(input * W + b)` for `rows` rows, fused; the GEMM's rows split over `threads`.
    fn linear(
        &self,
        l: usize,
        input: &[f32],
        rows: usize,
        relu: bool,
        threads: usize,
    ) -> anyhow::Result<B::Buf> {
        let layer = &self.layers[l];
        let (k, n) = (layer.inputs, layer.outputs);
        // SAFETY: `kernels::linear` writes every element of its output.
        unsafe {
            self.backend.written(rows, n, |out| {
                kernels::linear(
                    rows,
                    k,
                    n,
                    input,
                    &layer.weight,
                    &layer.bias,
                    relu,
                    out,
                    threads,
                )
            })
        }
    }

    /// `a[m x k] * b[k x n]` into a new buffer.
    fn product(
        &self,
        m: usize,
        k: usize,
        n: usize,
        a: Mat<'_>,
        b: Mat<'_>,
    ) -> anyhow::Result<B::Buf> {
        // SAFETY: a GEMM that does not accumulate writes every element of its output.
        unsafe {
            self.backend
                .written(m, n, |out| kernels::gemm(m, k, n, a, b, out, false))
        }
    }

    /// One training step; returns the mean loss.
    pub fn step(&mut self, batch: usize) -> anyhow::Result<f32> {
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

        // Backward: the layers' gradients, each thread's for its rows.
        let shards = self.threads.clamp(1, batch);
        let backward = backend.span("backward");
        let replayed = match self.keep {
            Keep::Every(every) => self.backward(chain, B::slice(&grad), batch, shards, every),
            Keep::Fitted => self.backward_layers(chain, B::slice(&grad), batch, shards),
        };
        drop(backward);
        replayed?;

        let _optimizer = backend.span("optimizer");
        self.optimize(shards)?;
        Ok(loss / batch as f32)
    }

    /// A batch of inputs from the backend; its labels, from the teacher, in `labels`.
    fn batch(&mut self, batch: usize) -> anyhow::Result<B::Buf> {
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

    /// The backward pass of [`Keep::Every`]: each thread replays every segment for its rows,
    /// newest segment first, reading the retained checkpoints concurrently.
    fn backward(
        &self,
        chain: B::Chain,
        grad: &[f32],
        batch: usize,
        shards: usize,
        every: usize,
    ) -> anyhow::Result<()> {
        let replayed = self.workers.install(|| {
            self.partials[..shards]
                .par_iter()
                .enumerate()
                .try_for_each(|(t, partial)| {
                    let (r0, r1) = (t * batch / shards, (t + 1) * batch / shards);
                    let mut partial = partial
                        .lock()
                        .map_err(|_| anyhow!("a replay thread panicked"))?;
                    let _replay = self.backend.span("backward (replay)"); // on each worker
                    let grad = &grad[r0 * CLASSES..r1 * CLASSES];
                    with_scratch(|scratch| {
                        self.replay(&chain, grad, r0, r1, every, &mut partial, scratch)
                    })
                })
        });
        drop(chain); // the end of the step's retention: the checkpoints go back
        replayed
    }

    /// The backward pass of [`Keep::Fitted`], layer by layer, newest first: each layer's
    /// input is read once (the pool recomputes it if it evicted it, on the worker threads),
    /// every thread back-propagates its rows through the layer, and the input goes back.
    /// The same operations on the same rows as [`replay`](Self::replay), in the same order.
    fn backward_layers(
        &self,
        mut chain: B::Chain,
        grad: &[f32],
        batch: usize,
        shards: usize,
    ) -> anyhow::Result<()> {
        let rows = |t: usize| (t * batch / shards, (t + 1) * batch / shards);
        // Each thread's gradient with respect to the current layer's output, for its rows.
        let mut upstream = (0..shards)
            .map(|t| {
                let (r0, r1) = rows(t);
                let mut g = self.backend.zeros(r1 - r0, CLASSES)?;
                B::slice_mut(&mut g).copy_from_slice(&grad[r0 * CLASSES..r1 * CLASSES]);
                Ok(g)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        for l in (0..self.layers.len()).rev() {
            let layer = &self.layers[l];
            let saved = B::checkpoint(&chain, l)?;
            self.workers.install(|| {
                B::with_saved(&saved, |input| {
                    self.partials[..shards]
                        .par_iter()
                        .zip(upstream.par_iter_mut())
                        .enumerate()
                        .try_for_each(|(t, (partial, upstream))| {
                            let (r0, r1) = rows(t);
                            let mut partial = partial
                                .lock()
                                .map_err(|_| anyhow!("a backward thread panicked"))?;
                            let _layer = self.backend.span("backward (layer)");
                            let input = &input[r0 * layer.inputs..r1 * layer.inputs];
                            let next = self.back_propagate(
                                l,
                                input,
                                B::slice(upstream),
                                r1 - r0,
                                &mut partial,
                            )?;
                            if let Some(mut next) = next {
                                // The gradient of layer l - 1's output, through its ReLU,
                                // whose output is this layer's input.
                                relu_mask(B::slice_mut(&mut next), input);
                                *upstream = next;
                            }
                            Ok(())
                        })
                })
            })?;
            drop(saved);
            B::pop_checkpoint(&mut chain, l); // this layer's input goes back now
        }
        Ok(())
    }

    /// Layer `l`'s weight and bias gradients for `rows` rows, from its `input` and the
    /// (masked) gradient `g` of its output, into `partial`; and the gradient of its input
    /// (`None` for the first layer, whose input is the data: nothing reads it).
    fn back_propagate(
        &self,
        l: usize,
        input: &[f32],
        g: &[f32],
        rows: usize,
        partial: &mut Partial<B>,
    ) -> anyhow::Result<Option<B::Buf>> {
        let layer = &self.layers[l];
        // dW = input^T * g
        let wg = self.product(
            layer.inputs,
            rows,
            layer.outputs,
            Mat::transposed(input, layer.inputs),
            Mat::rows(g, layer.outputs),
        )?;
        let mut bg = self.backend.zeros(1, layer.outputs)?;
        for row in g.chunks_exact(layer.outputs) {
            add_into(B::slice_mut(&mut bg), row);
        }
        partial.weight_grads[l] = Some(wg);
        partial.bias_grads[l] = Some(bg);
        // d input = g * W^T (the transpose is a stride, no copy).
        if l == 0 {
            return Ok(None);
        }
        self.product(
            rows,
            layer.outputs,
            layer.inputs,
            Mat::rows(g, layer.outputs),
            Mat::transposed(&layer.weight, layer.outputs),
        )
        .map(Some)
    }

    /// Sums the threads' gradients into the first thread's and takes an Adam step, both split
    /// over the threads; then the gradients go back.
    fn optimize(&mut self, shards: usize) -> anyhow::Result<()> {
        // Adam's step count (its bias corrections are 1 long before 2^31 steps).
        let (t, lr) = (i32::try_from(self.step).unwrap_or(i32::MAX), self.lr);
        let (layers, workers, partials) = (&mut self.layers, &self.workers, &mut self.partials);
        let partials = &mut partials[..shards];
        let (sum, rest) = partials
            .split_first_mut()
            .ok_or_else(|| anyhow!("a backward pass without threads"))?;
        let sum = sum
            .get_mut()
            .map_err(|_| anyhow!("a replay thread panicked"))?;
        workers.install(|| -> anyhow::Result<()> {
            for (l, layer) in layers.iter_mut().enumerate() {
                let (weight_grad, bias_grad) = sum.layer(l)?;
                for p in rest.iter_mut() {
                    let p = p
                        .get_mut()
                        .map_err(|_| anyhow!("a replay thread panicked"))?;
                    let (w, b) = p.layer(l)?;
                    par_add_into(B::slice_mut(weight_grad), B::slice(w));
                    add_into(B::slice_mut(bias_grad), B::slice(b));
                }
                // The step's recomputes are gone with its values: the parameters are ours.
                let shared = || anyhow!("layer {l}'s parameters are still shared");
                let weight = Arc::get_mut(&mut layer.weight).ok_or_else(shared)?;
                let bias = Arc::get_mut(&mut layer.bias).ok_or_else(shared)?;
                let [mw, vw, mb, vb] = &mut layer.moments;
                adam(weight, B::slice(weight_grad), mw, vw, lr, t);
                adam(bias, B::slice(bias_grad), mb, vb, lr, t);
            }
            Ok(())
        })?;
        for partial in partials {
            if let Ok(partial) = partial.get_mut() {
                partial.weight_grads.iter_mut().for_each(|g| *g = None);
                partial.bias_grads.iter_mut().for_each(|g| *g = None);
            }
        }
        Ok(())
    }

    /// The forward pass of [`Keep::Every`]: returns the logits and the chain of checkpoints.
    fn forward(&self, x: B::Buf, batch: usize, every: usize) -> anyhow::Result<(B::Buf, B::Chain)> {
        let count = self.layers.len();
        let mut chain = B::Chain::default();
        let mut current = self.backend.save(x)?;
        self.backend.push_checkpoint(&mut chain, 0, current.clone());
        let mut live: Option<B::Buf> = None;
        for l in 0..count {
            let relu = l + 1 < count;
            let out = match &live {
                Some(buf) => self.linear(l, B::slice(buf), batch, relu, self.threads)?,
                None => B::with_saved(&current, |input| {
                    self.linear(l, input, batch, relu, self.threads)
                })?,
            };
            if l + 1 < count && (l + 1) % every == 0 {
                current = self.backend.save(out)?;
                self.backend
                    .push_checkpoint(&mut chain, l + 1, current.clone());
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
        self.backend.push_checkpoint(&mut chain, 0, current.clone());
        for l in 0..count {
            let relu = l + 1 < count;
            let out = B::with_saved(&current, |input| {
                self.linear(l, input, batch, relu, self.threads)
            })?;
            if l + 1 == count {
                return Ok((out, chain));
            }
            let layer = &self.layers[l];
            let cost = (batch as u64)
                .saturating_mul(layer.inputs as u64)
                .saturating_mul(layer.outputs as u64);
            current = self
                .backend
                .save_recomputable(out, &current, cost, self.kernel(l, batch))?;
            self.backend
                .push_checkpoint(&mut chain, l + 1, current.clone());
        }
        Err(anyhow!("a model without layers"))
    }

    /// Layer `l` on `rows` rows as a recompute runs it: the forward pass's own computation
    /// (the same rows split over the same threads), so a recomputed value is bit-identical.
    fn kernel(&self, l: usize, rows: usize) -> Kernel {
        let layer = &self.layers[l];
        let (k, n, relu, threads) = (
            layer.inputs,
            layer.outputs,
            l + 1 < self.layers.len(),
            self.threads,
        );
        let (weight, bias) = (Arc::clone(&layer.weight), Arc::clone(&layer.bias));
        Arc::new(move |input, out| {
            kernels::linear(rows, k, n, input, &weight, &bias, relu, out, threads);
        })
    }

    /// Rows `r0..r1` of the backward pass: recompute each segment from its checkpoint (read
    /// through the retained handle, concurrently with the other threads), then back-propagate; its
    /// short lists live in `scratch`.
    #[allow(clippy::too_many_arguments)] // a thread's rows, and where its results go
    fn replay(
        &self,
        chain: &B::Chain,
        logits_grad: &[f32],
        r0: usize,
        r1: usize,
        every: usize,
        partial: &mut Partial<B>,
        scratch: &Bump,
    ) -> anyhow::Result<()> {
        let rows = r1 - r0;
        let count = self.layers.len();
        let mut upstream = self.backend.zeros(rows, CLASSES)?;
        B::slice_mut(&mut upstream).copy_from_slice(logits_grad);
        // The recomputed inputs of a segment's layers after its first.
        let mut inputs = bumpalo::collections::Vec::with_capacity_in(every, scratch);
        for start in (0..count).step_by(every).rev() {
            let end = (start + every).min(count);
            let width = self.layers[start].inputs;
            // The segment's first input is our rows of its checkpoint, read in place through
            // the retained handle (concurrently with the other threads) for the whole segment.
            B::with_saved(&B::checkpoint(chain, start)?, |all| {
                let first = &all[r0 * width..r1 * width];
                inputs.clear();
                for l in start..end - 1 {
                    let input = if l == start {
                        first
                    } else {
                        B::slice(&inputs[l - start - 1])
                    };
                    let next = self.linear(l, input, rows, true, 1)?;
                    inputs.push(next);
                }
                // Back-propagate through layers end-1 ..= start.
                for l in (start..end).rev() {
                    let layer = &self.layers[l];
                    let g = B::slice_mut(&mut upstream);
                    if l + 1 < count {
                        // The ReLU output is the next layer's input: recomputed, or the next
                        // segment's checkpoint (read in place, concurrently with other threads).
                        if l + 1 < end {
                            relu_mask(g, B::slice(&inputs[l - start]));
                        } else {
                            let w = layer.outputs;
                            B::with_saved(&B::checkpoint(chain, end)?, |all| {
                                relu_mask(g, &all[r0 * w..r1 * w]);
                                Ok(())
                            })?;
                        }
                    }
                    let g = B::slice(&upstream);
                    let input = if l == start {
                        first
                    } else {
                        B::slice(&inputs[l - start - 1])
                    };
                    if let Some(next) = self.back_propagate(l, input, g, rows, partial)? {
                        upstream = next;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}
