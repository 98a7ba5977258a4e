//! A decoder-only transformer in GPT-2's layout, trained on the bytes of a text: token and
//! learned position embeddings, `layers` pre-LayerNorm blocks of causal multi-head
//! self-attention and a 4x MLP with GELU (tanh form), each with its residual, a final layer
//! norm, the output projection tied to the token embedding, softmax cross-entropy, AdamW
//! with weight decay on the matrices and embeddings. nanoGPT's model; `scripts/torch_gpt.py`
//! is the same model and recipe in PyTorch, and the two exchange weights ([`params`]).
//!
//! What the forward pass keeps ([`Keep`]):
//!
//! - `--checkpoint-every 0`: every tensor each block's backward pass reads (its input,
//!   `qkv`, the attention's output and its rows' log-sum-exps, the residual after it and the
//!   MLP's hidden layer);
//! - `--checkpoint-every k`: only the input of every k-th block; the backward pass
//!   recomputes each segment of k blocks from its input, then runs back through it;
//! - fitted to the budget: everything, each tensor a value the pool may evict and recompute
//!   from the ones it was computed from.
//!
//! All three compute the same numbers in the same order: their losses are the same bits, at
//! any thread count (see [`kernels`](crate::kernels)). Each block's AdamW step runs as soon as
//! the backward pass has its gradients, so a step holds one block's gradients at a time (and
//! the token embedding's, which the output projection shares, until the end).

pub mod block;
pub mod head;
pub mod params;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use rand::{Rng as _, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use rayon::ThreadPool;

use crate::backend::Backend;
use crate::data::{Part, Text, Tokenizer};
use crate::kernels::attention::Heads;
use crate::kernels::optim::AdamW;

use self::block::{Keeping, Layer, Values};
use self::params::Params;
use super::ops::Ops;
use super::{Keep, Model, Runtime};

/// The weights' and the samples' random numbers.
type Rng = Xoshiro256PlusPlus;

/// Validation batches in each evaluation.
const EVAL_BATCHES: u64 = 4;

/// What the seed is mixed with for the sample's random numbers ("SAMPLE").
const SAMPLE_STREAM: u64 = 0x5341_4D50_4C45;

/// The sampling temperature.
const TEMPERATURE: f32 = 0.8;

/// The model's and a batch's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Positions per sequence.
    pub context: usize,
    /// Width of the residual stream.
    pub width: usize,
    /// Attention heads.
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// Sequences per batch.
    pub batch: usize,
}

impl Shape {
    /// An upper bound of the bytes a step of this shape touches: the parameters and their
    /// two moments, every tensor every block keeps, and the largest temporaries (the kept
    /// attention weights, the logits); `None` if it overflows.
    pub fn bytes(&self) -> Option<u64> {
        let (c, l) = (self.width as u64, self.layers as u64);
        let rows = (self.batch as u64).checked_mul(self.context as u64)?;
        let tables = (self.vocab as u64 + self.context as u64).checked_mul(c)?;
        let params = c.checked_mul(c)?.checked_mul(12)?.checked_add(13 * c)?;
        let params = params
            .checked_mul(l)?
            .checked_add(tables)?
            .checked_add(2 * c)?;
        let kept = rows
            .checked_mul(c)?
            .checked_mul(12)?
            .checked_mul(l.checked_add(1)?)?;
        let scores = rows
            .checked_mul(self.context as u64)?
            .checked_mul(self.heads as u64)?;
        let logits = rows.checked_mul(self.vocab as u64)?;
        params
            .checked_mul(3)?
            .checked_add(kept)?
            .checked_add(scores)?
            .checked_add(logits)?
            .checked_mul(size_of::<f32>() as u64)
    }

    /// A batch of `batch` sequences of `seq` positions.
    fn heads(&self, batch: usize, seq: usize) -> Heads {
        Heads {
            batch,
            seq,
            heads: self.heads,
            size: self.width / self.heads,
        }
    }
}

/// Everything a GPT's training is made of but the threads and the memory: what the
/// command line describes (`args.rs` builds it), the model knowing nothing of the command line.
#[derive(Debug, Clone)]
pub struct GptConfig {
    /// The model's and a batch's dimensions.
    pub shape: Shape,
    /// How the text becomes tokens.
    pub tokenizer: Tokenizer,
    /// The text (`None`: the shipped one).
    pub data: Option<PathBuf>,
    /// What the forward pass keeps.
    pub keep: Keep,
    /// The attention keeps its softmax weights for the backward pass.
    pub keep_scores: bool,
    /// Rows of logits the head computes at once (`None`: [`head::chunk_rows`]; 0: all).
    pub head_rows: Option<usize>,
    /// The optimiser.
    pub opt: AdamW,
    /// The seed of the weights, the batches and the sample.
    pub seed: u64,
    /// Weights to start from (safetensors).
    pub load: Option<PathBuf>,
    /// Where to write the initial weights (safetensors).
    pub save_init: Option<PathBuf>,
}

/// The kinds of tensors a block keeps on the step's checkpoint chain; a tensor's key is
/// `block x KINDS + kind`.
const KINDS: usize = 6;

/// The key of kind `kind` of block `block`.
fn key(block: usize, kind: usize) -> usize {
    block * KINDS + kind
}

/// Writes the initial weights a run of `config` starts from (drawn from its seed) to `path`:
/// what `compare` hands to every run, PyTorch's included.
pub fn save_init(config: &GptConfig, path: &std::path::Path) -> anyhow::Result<()> {
    let mut rng = Rng::seed_from_u64(config.seed);
    Params::new(&crate::backend::VecBackend, &config.shape, Some(&mut rng))?.save(path)
}

/// The GPT, its data, and the driver's threads it runs on.
#[derive(Debug)]
pub struct Gpt<'a, B: Backend> {
    /// The step's threads, the driver's for the whole run (as a training runtime keeps its
    /// threads).
    workers: &'a ThreadPool,
    state: State<'a, B>,
}

/// Everything but the threads (so that a step can run on them with `&mut` to the rest).
#[derive(Debug)]
struct State<'a, B: Backend> {
    ops: Ops<'a, B>,
    shape: Shape,
    params: Params<B>,
    keep: Keep,
    keep_scores: bool,
    /// Rows of logits the head computes at once (0: all).
    head_rows: usize,
    text: Text,
    opt: AdamW,
    seed: u64,
    step: usize,
    /// The batch's input tokens and the tokens that follow each, kept from step to step.
    inputs: Vec<u32>,
    targets: Vec<u32>,
}

impl<'a, B: Backend> Gpt<'a, B> {
    /// A GPT as `config` says, its parameters from `run`'s backend, its kernels on its threads:
    /// initialised from the seed, or loaded from `config.load`, and written to
    /// `config.save_init` if asked. A dry one (see [`Ops::dry`]) has zeros for weights and
    /// computes nothing.
    pub fn new(run: Runtime<'a, B>, config: &GptConfig) -> anyhow::Result<Self> {
        let Runtime { ops, workers } = run;
        let (backend, dry, shape) = (ops.backend, ops.dry, config.shape);
        let text = Text::load(
            config.data.as_deref(),
            shape.context,
            shape.vocab,
            config.tokenizer,
        )?;
        let mut rng = Rng::seed_from_u64(config.seed);
        let mut params = Params::new(backend, &shape, (!dry).then_some(&mut rng))?;
        if let (Some(path), false) = (&config.load, dry) {
            params.load(path)?;
        }
        if let (Some(path), false) = (&config.save_init, dry) {
            params.save(path)?;
        }
        let keep = match config.keep {
            // Past the block count it keeps the first block's input alone, as the count does.
            Keep::Every(every) => Keep::Every(every.min(shape.layers)),
            Keep::Fitted => Keep::Fitted,
        };
        let rows = shape.batch * shape.context;
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        inputs
            .try_reserve_exact(rows)
            .and_then(|()| targets.try_reserve_exact(rows))
            .map_err(|e| anyhow!("the tokens of a batch of {rows}: {e}"))?;
        Ok(Self {
            workers,
            state: State {
                ops,
                shape,
                params,
                keep,
                keep_scores: config.keep_scores,
                head_rows: config
                    .head_rows
                    .unwrap_or_else(|| head::chunk_rows(shape.vocab)),
                text,
                opt: config.opt,
                seed: config.seed,
                step: 0,
                inputs,
                targets,
            },
        })
    }
}

impl<B: Backend> Model for Gpt<'_, B> {
    fn step(&mut self) -> anyhow::Result<f32> {
        let state = &mut self.state;
        self.workers.install(|| state.step())
    }

    fn validate(&mut self) -> anyhow::Result<Option<f32>> {
        let state = &mut self.state;
        if state.ops.dry {
            return Ok(None);
        }
        self.workers.install(|| state.validate()).map(Some)
    }

    fn sample(&mut self, len: usize) -> anyhow::Result<Option<String>> {
        let state = &mut self.state;
        if state.ops.dry {
            return Ok(None);
        }
        self.workers.install(|| state.sample(len)).map(Some)
    }

    fn digest(&self) -> u64 {
        self.state.params.digest()
    }

    fn describe(&self) -> String {
        let (s, state) = (&self.state.shape, &self.state);
        format!(
            "GPT of {} blocks of width {} ({} heads), context {}, vocabulary {}, {:.2}M \
             parameters; batch {} x {} tokens of {}, {}",
            s.layers,
            s.width,
            s.heads,
            s.context,
            s.vocab,
            state.params.count() as f64 / 1e6,
            s.batch,
            s.context,
            state
                .text
                .path
                .as_ref()
                .map_or_else(|| "Shakespeare".to_owned(), |p| p.display().to_string()),
            match state.keep {
                Keep::Every(0) => "every tensor kept".to_owned(),
                Keep::Every(k) => format!("checkpoint every {k} block(s)"),
                Keep::Fitted => "tensors kept as the budget allows".to_owned(),
            },
        )
    }
}

impl<B: Backend> State<'_, B> {
    /// Block `b` of a batch of `heads`.
    fn layer(&self, b: usize, heads: Heads) -> Layer<'_, '_, B> {
        Layer {
            ops: &self.ops,
            params: &self.params.blocks[b],
            heads,
            keep_scores: self.keep_scores,
        }
    }

    /// AdamW's step count (its bias corrections are 1 long before 2^31 steps).
    fn t(&self) -> i32 {
        i32::try_from(self.step).unwrap_or(i32::MAX)
    }

    /// One training step on the next batch; returns the mean loss.
    fn step(&mut self) -> anyhow::Result<f32> {
        let backend = self.ops.backend;
        let _step = backend.span("step");
        let (batch, context) = (self.shape.batch, self.shape.context);
        self.text.batch(
            Part::Train,
            self.seed,
            self.step as u64,
            (batch, context),
            &mut self.inputs,
            &mut self.targets,
        );
        self.step += 1;
        let heads = self.shape.heads(batch, context);
        let tokens: Arc<[u32]> = Arc::from(self.inputs.as_slice());
        match self.keep {
            Keep::Every(0) => self.step_kept(heads, &tokens, Keeping::Plain),
            Keep::Fitted => self.step_kept(heads, &tokens, Keeping::Evictable),
            Keep::Every(k) => self.step_segments(heads, &tokens, k),
        }
    }

    /// A step that keeps every tensor the backward pass reads, as `keeping` says.
    fn step_kept(
        &mut self,
        heads: Heads,
        tokens: &Arc<[u32]>,
        keeping: Keeping,
    ) -> anyhow::Result<f32> {
        let backend = self.ops.backend;
        let forward = backend.span("forward");
        let mut chain = B::Chain::default();
        let mut x = head::embed(&self.ops, &self.params, tokens, heads, keeping)?;
        for b in 0..self.shape.layers {
            let (values, out) = self.layer(b, heads).forward(x, keeping, true)?;
            self.push(&mut chain, b, values);
            x = out.ok_or_else(|| anyhow!("block {b} without an output"))?;
        }
        drop(forward);
        let (loss, grads) = self.head(&x, heads)?;
        drop(x);
        let _backward = backend.span("backward");
        let mut dx = grads.dx;
        for b in (0..self.shape.layers).rev() {
            let _block = backend.span("backward (block)");
            let values = self.values(&chain, b)?;
            let grads;
            (dx, grads) = self.layer(b, heads).backward(&values, dx)?;
            // The block's tensors go back, and with them the recomputes that hold its
            // parameters: then its AdamW step.
            drop(values);
            B::pop_checkpoint(&mut chain, b);
            self.update_block(b, &grads)?;
        }
        self.embed_backward(tokens, heads, &dx, grads.dwte)?;
        Ok(loss)
    }

    /// A step that keeps the input of every `every`-th block and recomputes each segment in
    /// the backward pass.
    fn step_segments(
        &mut self,
        heads: Heads,
        tokens: &Arc<[u32]>,
        every: usize,
    ) -> anyhow::Result<f32> {
        let (backend, layers) = (self.ops.backend, self.shape.layers);
        let forward = backend.span("forward");
        let mut chain = B::Chain::default();
        let mut x = head::embed(&self.ops, &self.params, tokens, heads, Keeping::Plain)?;
        for b in 0..layers {
            if b % every == 0 {
                backend.push_checkpoint(&mut chain, b, [(key(b, 0), x.clone())]);
            }
            let (_, out) = self.layer(b, heads).forward(x, Keeping::Plain, true)?;
            x = out.ok_or_else(|| anyhow!("block {b} without an output"))?;
        }
        drop(forward);
        let (loss, grads) = self.head(&x, heads)?;
        drop(x);
        let _backward = backend.span("backward");
        let mut dx = grads.dx;
        for start in (0..layers).step_by(every).rev() {
            let _segment = backend.span("backward (segment)");
            let end = (start + every).min(layers);
            let mut x = B::checkpoint(&chain, key(start, 0))?;
            let mut kept = Vec::with_capacity(end - start);
            for b in start..end {
                // The segment's last output is the next segment's input: not computed again.
                let (values, out) = self
                    .layer(b, heads)
                    .forward(x, Keeping::Plain, b + 1 < end)?;
                kept.push(values);
                match out {
                    Some(out) => x = out,
                    None => break,
                }
            }
            for b in (start..end).rev() {
                let values = kept
                    .pop()
                    .ok_or_else(|| anyhow!("block {b} was not recomputed"))?;
                let grads;
                (dx, grads) = self.layer(b, heads).backward(&values, dx)?;
                drop(values);
                self.update_block(b, &grads)?;
            }
            B::pop_checkpoint(&mut chain, start);
        }
        self.embed_backward(tokens, heads, &dx, grads.dwte)?;
        Ok(loss)
    }

    /// Puts block `b`'s kept tensors on the chain.
    fn push(&self, chain: &mut B::Chain, b: usize, values: Values<B::Saved>) {
        let Values {
            x,
            qkv,
            att,
            res2,
            fch,
            stats,
        } = values;
        let entries = [x, qkv, att, res2, fch, stats]
            .into_iter()
            .enumerate()
            .map(|(kind, saved)| (key(b, kind), saved));
        self.ops.backend.push_checkpoint(chain, b, entries);
    }

    /// Block `b`'s kept tensors on the chain.
    fn values(&self, chain: &B::Chain, b: usize) -> anyhow::Result<Values<B::Saved>> {
        let at = |kind| B::checkpoint(chain, key(b, kind));
        Ok(Values {
            x: at(0)?,
            qkv: at(1)?,
            att: at(2)?,
            res2: at(3)?,
            fch: at(4)?,
            stats: at(5)?,
        })
    }

    /// Block `b`'s AdamW step with its gradients, once nothing else holds its parameters.
    fn update_block(&mut self, b: usize, grads: &[B::Buf]) -> anyhow::Result<()> {
        if !self.ops.dry {
            let _update = self.ops.backend.span("optimizer (block)");
            let (opt, t) = (self.opt, self.t());
            self.params.blocks[b].update(grads, &opt, t)?;
        }
        Ok(())
    }

    /// The head on the last block's output: the loss and the gradients, and `ln_f`'s AdamW
    /// step.
    fn head(
        &mut self,
        x: &B::Saved,
        heads: Heads,
    ) -> anyhow::Result<(f32, head::HeadGrads<B::Buf>)> {
        let _loss = self.ops.backend.span("loss");
        let (ops, params, targets) = (&self.ops, &self.params, &self.targets);
        let (loss, grads) = head::head(ops, params, x, heads, targets, true, self.head_rows)?;
        let grads = grads.ok_or_else(|| anyhow!("the head gave no gradients"))?;
        if !self.ops.dry {
            let (opt, t) = (self.opt, self.t());
            self.params.lnf_w.update(B::slice(&grads.lnf[0]), &opt, t)?;
            self.params.lnf_b.update(B::slice(&grads.lnf[1]), &opt, t)?;
        }
        Ok((loss, grads))
    }

    /// The embeddings' gradients from `dx` and `dwte` (the head's share), and their AdamW
    /// steps.
    fn embed_backward(
        &mut self,
        tokens: &[u32],
        heads: Heads,
        dx: &B::Buf,
        mut dwte: B::Buf,
    ) -> anyhow::Result<()> {
        let dwpe = head::embed_backward(&self.ops, tokens, heads, dx, &mut dwte)?;
        if !self.ops.dry {
            let (opt, t) = (self.opt, self.t());
            self.params.wte.update(B::slice(&dwte), &opt, t)?;
            self.params.wpe.update(B::slice(&dwpe), &opt, t)?;
        }
        Ok(())
    }

    /// The output of the last block on `tokens` (`heads`), keeping nothing for a backward
    /// pass.
    fn infer(&self, tokens: &Arc<[u32]>, heads: Heads) -> anyhow::Result<B::Saved> {
        let mut x = head::embed(&self.ops, &self.params, tokens, heads, Keeping::Plain)?;
        for b in 0..self.shape.layers {
            let (_, out) = self.layer(b, heads).forward(x, Keeping::Plain, true)?;
            x = out.ok_or_else(|| anyhow!("block {b} without an output"))?;
        }
        Ok(x)
    }

    /// The mean loss over [`EVAL_BATCHES`] fixed batches of the validation part.
    fn validate(&mut self) -> anyhow::Result<f32> {
        let (batch, context) = (self.shape.batch, self.shape.context);
        let heads = self.shape.heads(batch, context);
        let mut total = 0.0f64;
        for index in 0..EVAL_BATCHES {
            let (inputs, targets) = (&mut self.inputs, &mut self.targets);
            self.text.batch(
                Part::Val,
                self.seed,
                index,
                (batch, context),
                inputs,
                targets,
            );
            let tokens: Arc<[u32]> = Arc::from(self.inputs.as_slice());
            let x = self.infer(&tokens, heads)?;
            let (ops, params, targets) = (&self.ops, &self.params, &self.targets);
            let (loss, _) = head::head(ops, params, &x, heads, targets, false, self.head_rows)?;
            total += loss as f64;
        }
        Ok((total / EVAL_BATCHES as f64) as f32)
    }

    /// `len` tokens generated from the model after a line break (at temperature
    /// [`TEMPERATURE`], from the seed), decoded. Tokens past the tokenizer's (a vocabulary
    /// padded beyond it) are never drawn.
    fn sample(&mut self, len: usize) -> anyhow::Result<String> {
        let (c, vocab, tokenizer) = (self.shape.width, self.shape.vocab, self.text.tokenizer);
        let drawn = vocab.min(tokenizer.vocab());
        let start = match tokenizer.newline() {
            newline if (newline as usize) < vocab => newline,
            _ => 0,
        };
        let mut tokens = vec![start];
        let mut rng = Rng::seed_from_u64(self.seed ^ SAMPLE_STREAM);
        for _ in 0..len {
            let window: Arc<[u32]> =
                Arc::from(&tokens[tokens.len().saturating_sub(self.shape.context)..]);
            let heads = self.shape.heads(1, window.len());
            let x = self.infer(&window, heads)?;
            let logits = head::last_logits(&self.ops, &self.params, &x, window.len(), c)?;
            let logits = &B::slice(&logits)[..drawn];
            let max = logits.iter().copied().fold(f32::MIN, f32::max);
            let weights: Vec<f32> = logits
                .iter()
                .map(|l| ((l - max) / TEMPERATURE).exp())
                .collect();
            let mut pick = rng.random::<f32>() * weights.iter().sum::<f32>();
            let token = weights
                .iter()
                .position(|&w| {
                    pick -= w;
                    pick < 0.0
                })
                .unwrap_or(drawn - 1);
            tokens.push(token as u32);
        }
        tokenizer.decode(&tokens[1..])
    }
}
