//! One linear layer of the MLP: its parameters and Adam's state (from the backend, for the
//! whole run), its Adam step, and its forward kernel as a recompute runs it.

use std::sync::{Arc, Mutex};

use anyhow::anyhow;

use super::{normal, Rng};
use crate::backend::Backend;
use crate::kernels::gemm::{Linear as Fused, Prologue};
use crate::kernels::optim::adam;

/// One linear layer: its shape, and its parameters and Adam state (allocated once, for the
/// whole run, from the backend: under a budget they count in it).
pub(super) struct Linear<B: Backend> {
    pub(super) inputs: usize,
    pub(super) outputs: usize,
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
pub(super) type Shared<B> = Arc<<B as Backend>::Buf>;

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
    pub(super) fn new(
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
    pub(super) fn shared(&self) -> anyhow::Result<(Shared<B>, Shared<B>)> {
        let params = self.params()?;
        Ok((Arc::clone(&params.weight), Arc::clone(&params.bias)))
    }

    /// Adam's step `t` (from 1) with learning rate `lr` and the layer's gradients, split over
    /// the current rayon pool's threads; an error if a kernel still holds the parameters.
    pub(super) fn update(
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

/// One layer's forward kernel on a number of rows: the shapes, the threads, and handles to
/// the weight and bias (kept by a recompute for as long as its value lives).
pub(super) struct Forward<B: Backend> {
    pub(super) rows: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) relu: bool,
    pub(super) threads: usize,
    pub(super) weight: Shared<B>,
    pub(super) bias: Shared<B>,
}

impl<B: Backend> Forward<B> {
    /// Writes every element of `out` from `input`.
    pub(super) fn run(&self, input: &[f32], out: &mut [std::mem::MaybeUninit<f32>]) {
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
