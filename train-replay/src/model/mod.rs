//! The models the job trains, behind one trait ([`Model`]): the GPT ([`gpt`], the default)
//! and the MLP ([`mlp`]). [`build`] makes the one `--model` names.

pub mod gpt;
pub mod mlp;
pub mod ops;

use crate::backend::Backend;

pub use self::gpt::GptConfig;
pub use self::mlp::MlpConfig;

/// What the forward pass keeps for the backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The input of every n-th layer or block; the rest is recomputed from them. 0: every
    /// tensor the backward pass reads.
    Every(usize),
    /// Every tensor the backward pass reads, as a value the pool may evict: what fits under
    /// the budget stays, and the pool evicts the rest, which the backward pass recomputes
    /// when it reads it.
    Fitted,
}

/// The model a run trains, as the command line describes it (`args.rs` builds it).
#[derive(Debug, Clone)]
pub enum Config {
    /// The GPT.
    Gpt(GptConfig),
    /// The MLP.
    Mlp(MlpConfig),
}

/// What the driver lends a model for its run: the backend its tensors come from and whether
/// its steps are dry ([`ops::Ops`]), and the threads its kernels run on. A model keeps no
/// threads of its own.
#[derive(Debug)]
pub struct Runtime<'a, B: Backend> {
    /// The backend, the threads' count, dryness.
    pub ops: ops::Ops<'a, B>,
    /// The driver's threads.
    pub workers: &'a rayon::ThreadPool,
}

/// A model in training: its steps, and what a person reads of it.
pub trait Model {
    /// One training step on the next batch; returns its mean loss.
    fn step(&mut self) -> anyhow::Result<f32>;
    /// The mean loss over held-out batches (`None`: the model has none, or the run is dry).
    fn validate(&mut self) -> anyhow::Result<Option<f32>> {
        Ok(None)
    }
    /// Text the model generates, `len` tokens of it (`None`: it generates none).
    fn sample(&mut self, _len: usize) -> anyhow::Result<Option<String>> {
        Ok(None)
    }
    /// What trains, on one line.
    fn describe(&self) -> String;
    /// A digest of every parameter's bits (FNV-1a over them, in a fixed order): two runs
    /// whose parameters are the same bits have the same digest. The losses of a few steps
    /// hide a difference of an ulp in a gradient (AdamW divides it away); the weights keep it.
    fn digest(&self) -> u64;
}

/// FNV-1a over the bits of `values`, continuing from `hash`.
pub fn digest_of(hash: u64, values: &[f32]) -> u64 {
    values.iter().fold(hash, |hash, v| {
        v.to_bits().to_le_bytes().iter().fold(hash, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    })
}

/// FNV-1a's starting value.
pub const DIGEST_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The model `config` describes, its tensors from `backend`, its kernels on `workers`' threads
/// (the driver's: a model keeps no threads of its own). A dry one takes the buffers a step
/// takes, of the same sizes and in the same order, without computing them: it finds what a
/// step needs from the memory in a fraction of a step's time; its losses mean nothing.
pub fn build<'a, B: Backend>(
    backend: &'a B,
    workers: &'a rayon::ThreadPool,
    config: &Config,
    dry: bool,
) -> anyhow::Result<Box<dyn Model + 'a>> {
    let ops = ops::Ops {
        backend,
        threads: workers.current_num_threads(),
        dry,
    };
    let run = Runtime { ops, workers };
    Ok(match config {
        Config::Gpt(config) => Box::new(gpt::Gpt::new(run, config)?),
        Config::Mlp(config) => Box::new(mlp::Trainer::new(run, config)?),
    })
}

/// The threads a run's kernels share, for the whole run (as a training runtime keeps its
/// threads), named for the trace's tracks.
pub fn workers(threads: usize) -> anyhow::Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("worker {i}"))
        .build()
        .map_err(|e| anyhow::anyhow!("starting {threads} worker thread(s): {e}"))
}
