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
}

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
