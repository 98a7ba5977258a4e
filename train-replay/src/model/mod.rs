//! The models the job trains, behind one trait ([`Model`]): the GPT ([`gpt`], the default)
//! and the MLP ([`mlp`]). [`build`] makes the one `--model` names.

pub mod gpt;
pub mod mlp;

use crate::args::{Args, ModelKind};
use crate::backend::Backend;

/// A model in training: its steps, and what a person reads of it.
pub trait Model {
    /// One training step on the next batch; returns its mean loss.
    fn step(&mut self) -> anyhow::Result<f32>;
    /// The mean loss over held-out batches (`None`: the model has none, or the run is dry).
    fn validate(&mut self) -> anyhow::Result<Option<f32>> {
        Ok(None)
    }
    /// `len` bytes of text the model generates (`None`: it generates none).
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

/// The model `args` name, its tensors from `backend`. A dry one takes the buffers a step
/// takes, of the same sizes and in the same order, without computing them: it finds what a
/// step needs from the memory in a fraction of a step's time; its losses mean nothing.
pub fn build<'a, B: Backend>(
    backend: &'a B,
    args: &Args,
    dry: bool,
) -> anyhow::Result<Box<dyn Model + 'a>> {
    Ok(match args.model {
        ModelKind::Gpt => Box::new(gpt::Gpt::new(backend, args, dry)?),
        ModelKind::Mlp => Box::new(mlp::Trainer::with_kernels(backend, args, !dry)?),
    })
}
