//! The model and its training step: an MLP (`INPUT -> layers x hidden -> CLASSES`, ReLU),
//! softmax cross-entropy against a random linear teacher, Adam, and activation
//! checkpointing: only the input of every `checkpoint_every`-th layer is kept through the
//! forward pass; the backward pass recomputes the rest, segment by segment.

use anyhow::anyhow;
use std::cell::RefCell;
use std::sync::Mutex;

use bumpalo::Bump;
use rand::{Rng as _, SeedableRng};
use rand_distr::StandardNormal;
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::prelude::*;

use crate::args::Args;
use crate::backend::{Backend, VecBackend};
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

/// One linear layer's parameters and Adam state (allocated once, for the whole run).
#[derive(Debug)]
struct Linear {
    inputs: usize,
    outputs: usize,
    weight: Vec<f32>,
    bias: Vec<f32>,
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
            weight,
            bias: zeros(1, outputs)?,
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
    checkpoint_every: usize,
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
        Ok(Self {
            backend,
            layers,
            checkpoint_every: args.checkpoint_every.max(1),
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
        let count = self.layers.len();
        // The batch: inputs from the backend, labels from the teacher.
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

        // Forward, on every thread: keep only the inputs of every checkpoint_every-th layer.
        let forward = backend.span("forward");
        let (logits, chain, current) = self.workers.install(|| self.forward(x, batch, count))?;
        drop(forward);

        // Loss and its gradient (softmax cross-entropy, mean over the batch).
        let loss_span = backend.span("loss");
        let mut grad = self.backend.zeros(batch, CLASSES)?;
        let mut loss = 0.0f32;
        for ((row, g), &label) in B::slice(&logits)
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
        drop(logits);
        drop(loss_span);

        // Backward: each thread replays every segment for its rows, newest segment first,
        // reading the retained checkpoints concurrently.
        let shards = self.threads.clamp(1, batch);
        let backward = backend.span("backward");
        let replayed = {
            let (chain, grad, this) = (&chain, B::slice(&grad), &*self);
            self.workers.install(|| {
                this.partials[..shards]
                    .par_iter()
                    .enumerate()
                    .try_for_each(|(t, partial)| {
                        let (r0, r1) = (t * batch / shards, (t + 1) * batch / shards);
                        let mut partial = partial
                            .lock()
                            .map_err(|_| anyhow!("a replay thread panicked"))?;
                        let _replay = this.backend.span("backward (replay)"); // on each worker
                        let grad = &grad[r0 * CLASSES..r1 * CLASSES];
                        with_scratch(|scratch| {
                            this.replay(chain, grad, r0, r1, &mut partial, scratch)
                        })
                    })
            })
        };
        drop(chain); // the end of the step's retention: the checkpoints go back
        drop(current);
        drop(backward);
        replayed?;

        // Sum the threads' gradients into the first thread's and take an Adam step, both
        // split over the threads; then the gradients go back.
        let _optimizer = backend.span("optimizer");
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
                let [mw, vw, mb, vb] = &mut layer.moments;
                adam(&mut layer.weight, B::slice(weight_grad), mw, vw, lr, t);
                adam(&mut layer.bias, B::slice(bias_grad), mb, vb, lr, t);
            }
            Ok(())
        })?;
        for partial in partials {
            if let Ok(partial) = partial.get_mut() {
                partial.weight_grads.iter_mut().for_each(|g| *g = None);
                partial.bias_grads.iter_mut().for_each(|g| *g = None);
            }
        }
        Ok(loss / batch as f32)
    }

    /// The forward pass: returns the logits, the chain of checkpoints, and the last one.
    #[allow(clippy::type_complexity)] // three results of one pass
    fn forward(
        &self,
        x: B::Buf,
        batch: usize,
        count: usize,
    ) -> anyhow::Result<(B::Buf, B::Chain, B::Saved)> {
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
            if l + 1 < count && (l + 1) % self.checkpoint_every == 0 {
                current = self.backend.save(out)?;
                self.backend
                    .push_checkpoint(&mut chain, l + 1, current.clone());
                live = None;
            } else {
                live = Some(out); // the previous non-checkpointed activation drops here
            }
        }
        let logits = live.expect("the last layer is never a checkpoint");
        Ok((logits, chain, current))
    }

    /// Rows `r0..r1` of the backward pass: recompute each segment from its checkpoint (read
    /// through the retained handle, concurrently with the other threads), then back-propagate; its
    /// short lists live in `scratch`.
    fn replay(
        &self,
        chain: &B::Chain,
        logits_grad: &[f32],
        r0: usize,
        r1: usize,
        partial: &mut Partial<B>,
        scratch: &Bump,
    ) -> anyhow::Result<()> {
        let rows = r1 - r0;
        let count = self.layers.len();
        let (weight_grads, bias_grads) = (&mut partial.weight_grads, &mut partial.bias_grads);
        let mut upstream = self.backend.zeros(rows, CLASSES)?;
        B::slice_mut(&mut upstream).copy_from_slice(logits_grad);
        // The recomputed inputs of a segment's layers after its first.
        let mut inputs =
            bumpalo::collections::Vec::with_capacity_in(self.checkpoint_every, scratch);
        for start in (0..count).step_by(self.checkpoint_every).rev() {
            let end = (start + self.checkpoint_every).min(count);
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
                    weight_grads[l] = Some(wg);
                    bias_grads[l] = Some(bg);
                    // d input = g * W^T (the transpose is a stride, no copy); the first
                    // layer's input is the data, whose gradient nothing reads.
                    if l > 0 {
                        upstream = self.product(
                            rows,
                            layer.outputs,
                            layer.inputs,
                            Mat::rows(g, layer.outputs),
                            Mat::transposed(&layer.weight, layer.outputs),
                        )?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}
