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
//! The threads share each kernel over the whole batch (see [`kernels`](crate::kernels)):
//! every GEMM is one call whose output they split, each summing its elements over every row in the order the
//! shapes fix. So the losses are bit-identical at any thread count, and what a step holds
//! does not grow with the threads: no per-thread copies of the gradients to sum. Each
//! layer's Adam step runs as soon as the backward pass has its gradients, so a step holds
//! one layer's gradients at a time.

mod layer;
mod passes;

use anyhow::anyhow;
use rand::{Rng as _, SeedableRng};
use rand_distr::StandardNormal;
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::ThreadPool;

use self::layer::Linear;
use super::ops::Ops;
use super::{Keep, Model, Runtime};
use crate::backend::Backend;

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

/// Everything an MLP's training is made of but the threads and the memory: what the command
/// line describes (`args.rs` builds it), the model knowing nothing of the command line.
#[derive(Debug, Clone)]
pub struct MlpConfig {
    /// Hidden layers.
    pub layers: usize,
    /// Their width.
    pub hidden: usize,
    /// Examples per batch.
    pub batch: usize,
    /// Adam's learning rate.
    pub lr: f32,
    /// The seed of the weights and the data.
    pub seed: u64,
    /// What the forward pass keeps.
    pub keep: Keep,
}

/// The model, its data, and the driver's threads it runs on.
#[derive(Debug)]
pub struct Trainer<'a, B: Backend> {
    /// The backend, the threads' count and whether the steps are dry.
    ops: Ops<'a, B>,
    layers: Vec<Linear<B>>,
    keep: Keep,
    teacher: Vec<f32>,
    rng: Rng,
    step: usize,
    lr: f32,
    /// Examples per batch.
    batch: usize,
    /// Kept from step to step: the batch's labels.
    labels: Vec<usize>,
    /// The step's threads, the driver's for the whole run (as a training runtime keeps its
    /// threads).
    workers: &'a ThreadPool,
}

impl<B: Backend> Model for Trainer<'_, B> {
    fn step(&mut self) -> anyhow::Result<f32> {
        self.train_step(self.batch)
    }

    fn digest(&self) -> u64 {
        self.layers.iter().fold(super::DIGEST_START, |hash, layer| {
            // A layer whose lock a panicking thread poisoned counts as nothing.
            let Ok((weight, bias)) = layer.shared() else {
                return hash;
            };
            let hash = super::digest_of(hash, B::slice(&weight));
            super::digest_of(hash, B::slice(&bias))
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
    /// A fresh model as `config` says, its buffers from `run`'s backend, its kernels on its
    /// threads. A dry one (see [`Ops::dry`]) takes and gives back the buffers a step takes,
    /// in the same order, without computing them.
    pub fn new(run: Runtime<'a, B>, config: &MlpConfig) -> anyhow::Result<Self> {
        let Runtime { ops, workers } = run;
        let (backend, dry) = (ops.backend, ops.dry);
        let mut rng = Rng::seed_from_u64(config.seed);
        let teacher = (0..INPUT * CLASSES).map(|_| normal(&mut rng)).collect();
        let mut dims = Vec::new();
        dims.try_reserve_exact(config.layers.saturating_add(2))
            .map_err(|e| anyhow!("{} layers: {e}", config.layers))?;
        dims.push(INPUT);
        dims.extend(std::iter::repeat_n(config.hidden, config.layers));
        dims.push(CLASSES);
        let layers = dims
            .windows(2)
            .map(|w| Linear::new(backend, w[0], w[1], (!dry).then_some(&mut rng)))
            .collect::<anyhow::Result<_>>()?;
        let mut labels = Vec::new();
        labels
            .try_reserve_exact(config.batch)
            .map_err(|e| anyhow!("labels for a batch of {}: {e}", config.batch))?;
        // Hidden layers and the output layer.
        let layer_count = config.layers.saturating_add(1);
        Ok(Self {
            ops,
            layers,
            keep: match config.keep {
                // Past the layer count it keeps the first layer's input alone, as the count
                // does (and sizes a scratch vector by it); 0 (keep everything) is 1 here.
                Keep::Every(every) => Keep::Every(every.clamp(1, layer_count)),
                Keep::Fitted => Keep::Fitted,
            },
            teacher,
            rng,
            step: 0,
            lr: config.lr,
            batch: config.batch,
            labels,
            workers,
        })
    }

    /// One training step; returns the mean loss.
    pub fn train_step(&mut self, batch: usize) -> anyhow::Result<f32> {
        // The step's and its phases' spans in the trace (`--trace`), on this thread's track.
        let backend = self.ops.backend;
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
        if self.ops.dry {
            self.labels.clear();
            self.labels.resize(batch, 0);
            return self.ops.backend.zeros(batch, INPUT);
        }
        let rng = &mut self.rng;
        // SAFETY: the closure writes every element.
        let x = unsafe {
            self.ops.backend.written(batch, INPUT, |x| {
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
        let mut grad = self.ops.backend.zeros(batch, CLASSES)?;
        let mut loss = 0.0f32;
        if self.ops.dry {
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
}
