//! The model and its training step: an MLP (`INPUT -> layers x hidden -> CLASSES`, ReLU),
//! softmax cross-entropy against a random linear teacher, Adam, and activation
//! checkpointing: only the input of every `checkpoint_every`-th layer is kept through the
//! forward pass; the backward pass recomputes the rest, segment by segment.

use rayon::prelude::*;

use crate::args::Args;
use crate::backend::Backend;
use crate::kernels::{self, adam, add_into, par_add_into, relu_mask, Mat};

/// Input features.
pub const INPUT: usize = 128;
/// Output classes.
pub const CLASSES: usize = 10;

/// xorshift64*: deterministic, so every allocator trains the same model on the same data.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform().max(1e-7), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
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
    fn new(inputs: usize, outputs: usize, rng: &mut Rng) -> Self {
        let scale = (2.0 / inputs as f32).sqrt();
        Self {
            inputs,
            outputs,
            weight: (0..inputs * outputs)
                .map(|_| rng.normal() * scale)
                .collect(),
            bias: vec![0.0; outputs],
            moments: [
                vec![0.0; inputs * outputs],
                vec![0.0; inputs * outputs],
                vec![0.0; outputs],
                vec![0.0; outputs],
            ],
        }
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
}

/// One thread's share of the backward pass: weight and bias gradients for its rows.
struct Partial<B: Backend> {
    weight_grads: Vec<B::Buf>,
    bias_grads: Vec<B::Buf>,
}

impl<'a, B: Backend> Trainer<'a, B> {
    /// A fresh model; an error if its worker threads cannot start.
    pub fn new(backend: &'a B, args: &Args) -> Result<Self, String> {
        let mut rng = Rng(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let teacher = (0..INPUT * CLASSES).map(|_| rng.normal()).collect();
        let mut dims = vec![INPUT];
        dims.extend(std::iter::repeat_n(args.hidden, args.layers));
        dims.push(CLASSES);
        let layers = dims
            .windows(2)
            .map(|w| Linear::new(w[0], w[1], &mut rng))
            .collect();
        let threads = args.threads();
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| format!("starting {threads} worker thread(s): {e}"))?;
        Ok(Self {
            backend,
            layers,
            checkpoint_every: args.checkpoint_every.max(1),
            threads,
            teacher,
            rng,
            step: 0,
            lr: args.lr,
            labels: Vec::with_capacity(args.batch),
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
    ) -> Result<B::Buf, String> {
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
    ) -> Result<B::Buf, String> {
        // SAFETY: a GEMM that does not accumulate writes every element of its output.
        unsafe {
            self.backend
                .written(m, n, |out| kernels::gemm(m, k, n, a, b, out, false))
        }
    }

    /// One training step; returns the mean loss.
    pub fn step(&mut self, batch: usize) -> Result<f32, String> {
        self.step += 1;
        let count = self.layers.len();
        // The batch: inputs from the backend, labels from the teacher.
        let rng = &mut self.rng;
        // SAFETY: the closure writes every element.
        let x = unsafe {
            self.backend.written(batch, INPUT, |x| {
                x.iter_mut().for_each(|v| {
                    v.write(rng.normal());
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
        let (logits, chain, current) = self.workers.install(|| self.forward(x, batch, count))?;

        // Loss and its gradient (softmax cross-entropy, mean over the batch).
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

        // Backward: each thread replays every segment for its rows, newest segment first,
        // reading the retained checkpoints concurrently.
        let shards = self.threads.clamp(1, batch);
        let partials: Vec<Result<Partial<B>, String>> = {
            let (chain, grad, this) = (&chain, B::slice(&grad), &*self);
            self.workers.install(|| {
                (0..shards)
                    .into_par_iter()
                    .map(|t| {
                        let (r0, r1) = (t * batch / shards, (t + 1) * batch / shards);
                        this.replay(chain, &grad[r0 * CLASSES..r1 * CLASSES], r0, r1)
                    })
                    .collect()
            })
        };
        drop(chain); // the end of the step's retention: the checkpoints go back
        drop(current);
        let mut partials = partials.into_iter().collect::<Result<Vec<_>, _>>()?;

        // Sum the threads' gradients into the first thread's and take an Adam step, both
        // split over the threads.
        let (t, lr) = (self.step as i32, self.lr);
        let (sum, rest) = partials
            .split_first_mut()
            .ok_or("a backward pass without threads")?;
        let (layers, workers) = (&mut self.layers, &self.workers);
        workers.install(|| {
            for (l, layer) in layers.iter_mut().enumerate() {
                for p in rest.iter() {
                    par_add_into(
                        B::slice_mut(&mut sum.weight_grads[l]),
                        B::slice(&p.weight_grads[l]),
                    );
                    add_into(
                        B::slice_mut(&mut sum.bias_grads[l]),
                        B::slice(&p.bias_grads[l]),
                    );
                }
                let [mw, vw, mb, vb] = &mut layer.moments;
                adam(
                    &mut layer.weight,
                    B::slice(&sum.weight_grads[l]),
                    mw,
                    vw,
                    lr,
                    t,
                );
                adam(&mut layer.bias, B::slice(&sum.bias_grads[l]), mb, vb, lr, t);
            }
        });
        Ok(loss / batch as f32)
    }

    /// The forward pass: returns the logits, the chain of checkpoints, and the last one.
    #[allow(clippy::type_complexity)] // three results of one pass
    fn forward(
        &self,
        x: B::Buf,
        batch: usize,
        count: usize,
    ) -> Result<(B::Buf, B::Chain, B::Saved), String> {
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
    /// through the retained handle, concurrently with the other threads), then back-propagate.
    fn replay(
        &self,
        chain: &B::Chain,
        logits_grad: &[f32],
        r0: usize,
        r1: usize,
    ) -> Result<Partial<B>, String> {
        let rows = r1 - r0;
        let count = self.layers.len();
        let mut weight_grads: Vec<Option<B::Buf>> = (0..count).map(|_| None).collect();
        let mut bias_grads: Vec<Option<B::Buf>> = (0..count).map(|_| None).collect();
        let mut upstream = self.backend.zeros(rows, CLASSES)?;
        B::slice_mut(&mut upstream).copy_from_slice(logits_grad);
        let starts: Vec<usize> = (0..count).step_by(self.checkpoint_every).collect();
        // The recomputed inputs of a segment's layers after its first.
        let mut inputs: Vec<B::Buf> = Vec::with_capacity(self.checkpoint_every);
        for (s, &start) in starts.iter().enumerate().rev() {
            let end = starts.get(s + 1).copied().unwrap_or(count);
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
                    // d input = g * W^T (the transpose is a stride, no copy)
                    upstream = self.product(
                        rows,
                        layer.outputs,
                        layer.inputs,
                        Mat::rows(g, layer.outputs),
                        Mat::transposed(&layer.weight, layer.outputs),
                    )?;
                }
                Ok(())
            })?;
        }
        let every = |grads: Vec<Option<B::Buf>>| {
            grads.into_iter().map(|g| g.expect("every layer")).collect()
        };
        Ok(Partial {
            weight_grads: every(weight_grads),
            bias_grads: every(bias_grads),
        })
    }
}
