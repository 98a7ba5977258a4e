//! The GPT's parameters and AdamW state, every tensor from the backend (under a budget they
//! count in it), and their exchange with PyTorch: safetensors files under nanoGPT's
//! state-dict names and layouts, so that a file either side writes, the other reads.
//!
//! A linear layer's weight is kept as `in x out` (the GEMM reads it row by row), the
//! transpose of PyTorch's `nn.Linear` layout (`out x in`); the files hold PyTorch's, and
//! [`Params::save`] and [`Params::load`] transpose. The output projection is tied to the token
//! embedding, so a file holds it once: as `transformer.wte.weight` (this job and
//! `scripts/torch_gpt.py` write that), or as `lm_head.weight` (what
//! `safetensors.torch.save_model` keeps of the pair); a file with both must hold the same
//! tensor twice.

use std::ops::{Index, IndexMut};
use std::path::Path;
use std::sync::Arc;

use anyhow::anyhow;
use rand::Rng as _;
use rand_distr::StandardNormal;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::backend::Backend;
use crate::error::BadInput;
use crate::kernels::optim::AdamW;

use super::Shape;

/// A parameter shared with the kernels that read it (a recompute's included).
pub type Shared<B> = Arc<<B as Backend>::Buf>;

/// How a parameter starts (nanoGPT's initialisation).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// Normal with this standard deviation.
    Normal(f32),
    /// All ones (a layer norm's weight).
    Ones,
    /// All zeros (a bias).
    Zeros,
}

/// What a parameter is to the optimiser and to the exchange with PyTorch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An embedding table: a matrix in PyTorch's layout.
    Table,
    /// A linear layer's weight: a matrix kept transposed.
    Linear,
    /// A bias or a layer norm's parameter: no weight decay.
    Vector,
}

/// One parameter tensor, its AdamW moments and what the exchange with PyTorch needs.
pub struct Param<B: Backend> {
    /// nanoGPT's name.
    name: String,
    /// Rows and columns as kept here.
    rows: usize,
    cols: usize,
    /// What it is to the optimiser and to PyTorch.
    kind: Kind,
    value: Shared<B>,
    moments: [B::Buf; 2],
}

impl<B: Backend> std::fmt::Debug for Param<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Param")
            .field("name", &self.name)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Param<B> {
    /// A parameter of `rows x cols` from `backend`, initialised with `rng` as `init` says
    /// (zeros without it: a dry run).
    fn new(
        backend: &B,
        name: String,
        (rows, cols): (usize, usize),
        (init, kind): (Init, Kind),
        rng: Option<&mut super::Rng>,
    ) -> anyhow::Result<Self> {
        let mut value = backend.zeros(rows, cols)?;
        if let Some(rng) = rng {
            let values = B::slice_mut(&mut value);
            match init {
                Init::Normal(std) => values
                    .iter_mut()
                    .for_each(|v| *v = rng.sample::<f32, _>(StandardNormal) * std),
                Init::Ones => values.fill(1.0),
                Init::Zeros => {}
            }
        }
        Ok(Self {
            kind,
            name,
            rows,
            cols,
            value: Arc::new(value),
            moments: [backend.zeros(rows, cols)?, backend.zeros(rows, cols)?],
        })
    }

    /// The elements.
    pub fn get(&self) -> &[f32] {
        B::slice(&self.value)
    }

    /// The elements, for writing; an error if a kernel still holds the parameter.
    pub fn get_mut(&mut self) -> anyhow::Result<&mut [f32]> {
        let name = &self.name;
        Arc::get_mut(&mut self.value)
            .map(B::slice_mut)
            .ok_or_else(|| anyhow!("{name} is still shared"))
    }

    /// Rows as kept here.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// A handle for a kernel that outlives this borrow (a recompute's).
    pub fn handle(&self) -> Shared<B> {
        Arc::clone(&self.value)
    }

    /// PyTorch's shape.
    fn torch_shape(&self) -> Vec<usize> {
        match self.kind {
            Kind::Linear => vec![self.cols, self.rows],
            Kind::Table => vec![self.rows, self.cols],
            Kind::Vector => vec![self.cols],
        }
    }

    /// The elements in PyTorch's layout, as little-endian bytes.
    fn torch_bytes(&self) -> Vec<u8> {
        let values = self.get();
        let mut bytes = Vec::with_capacity(values.len() * 4);
        if self.kind == Kind::Linear {
            for c in 0..self.cols {
                for r in 0..self.rows {
                    bytes.extend(values[r * self.cols + c].to_le_bytes());
                }
            }
        } else {
            values.iter().for_each(|v| bytes.extend(v.to_le_bytes()));
        }
        bytes
    }

    /// Sets the elements from `view` (PyTorch's layout), checked against this parameter's
    /// dtype and shape, each value finite.
    fn set(&mut self, view: &TensorView<'_>, file: &Path) -> Result<(), BadInput> {
        let name = &self.name;
        if view.dtype() != Dtype::F32 {
            return Err(BadInput(format!(
                "--load {}: {name} is {:?}; the model's tensors are F32",
                file.display(),
                view.dtype()
            )));
        }
        if view.shape() != self.torch_shape() {
            return Err(BadInput(format!(
                "--load {}: {name} is {:?} in the file, the model's is {:?} (--vocab, \
                 --context, --width and --layers must match the file's model; --heads too, \
                 though the shapes do not show it)",
                file.display(),
                view.shape(),
                self.torch_shape()
            )));
        }
        let values = view.data().chunks_exact(4);
        if values
            .clone()
            .any(|v| !f32::from_le_bytes(v.try_into().expect("4")).is_finite())
        {
            return Err(BadInput(format!(
                "--load {}: {name} holds a value that is not finite",
                file.display()
            )));
        }
        let (rows, cols, transposed) = (self.rows, self.cols, self.kind == Kind::Linear);
        let values = Arc::get_mut(&mut self.value)
            .map(B::slice_mut)
            .ok_or_else(|| BadInput(format!("{name} is shared while it is loaded")))?;
        for (i, chunk) in view.data().chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes(chunk.try_into().expect("chunks of 4"));
            let at = if transposed {
                (i % rows) * cols + i / rows
            } else {
                i
            };
            values[at] = v;
        }
        Ok(())
    }

    /// AdamW's step `t` with `grad` (decay only where it applies), split over the current
    /// rayon pool's threads; an error if a kernel still holds the parameter.
    pub fn update(&mut self, grad: &[f32], opt: &AdamW, t: i32) -> anyhow::Result<()> {
        // nanoGPT's rule: decay every tensor of two dimensions or more.
        let opt = AdamW {
            weight_decay: if self.kind == Kind::Vector {
                0.0
            } else {
                opt.weight_decay
            },
            ..*opt
        };
        let name = &self.name;
        let value = Arc::get_mut(&mut self.value)
            .ok_or_else(|| anyhow!("{name} is still shared at its update"))?;
        let [m, v] = &mut self.moments;
        opt.step(
            B::slice_mut(value),
            grad,
            B::slice_mut(m),
            B::slice_mut(v),
            t,
        );
        Ok(())
    }
}

/// A block's parameters, in the order of [`BLOCK_PARAMS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum W {
    /// `ln_1.weight`.
    Ln1W,
    /// `ln_1.bias`.
    Ln1B,
    /// `attn.c_attn.weight`: `width x 3 width` here.
    AttnW,
    /// `attn.c_attn.bias`.
    AttnB,
    /// `attn.c_proj.weight`: `width x width` here.
    ProjW,
    /// `attn.c_proj.bias`.
    ProjB,
    /// `ln_2.weight`.
    Ln2W,
    /// `ln_2.bias`.
    Ln2B,
    /// `mlp.c_fc.weight`: `width x 4 width` here.
    FcW,
    /// `mlp.c_fc.bias`.
    FcB,
    /// `mlp.c_proj.weight`: `4 width x width` here.
    OutW,
    /// `mlp.c_proj.bias`.
    OutB,
}

/// A block's parameters: each one's name and its shape here, in multiples of the width (rows,
/// columns; 0 rows: a vector). The matrices are linear layers' weights, kept transposed.
pub const BLOCK_PARAMS: [(W, &str, (usize, usize)); 12] = [
    (W::Ln1W, "ln_1.weight", (0, 1)),
    (W::Ln1B, "ln_1.bias", (0, 1)),
    (W::AttnW, "attn.c_attn.weight", (1, 3)),
    (W::AttnB, "attn.c_attn.bias", (0, 3)),
    (W::ProjW, "attn.c_proj.weight", (1, 1)),
    (W::ProjB, "attn.c_proj.bias", (0, 1)),
    (W::Ln2W, "ln_2.weight", (0, 1)),
    (W::Ln2B, "ln_2.bias", (0, 1)),
    (W::FcW, "mlp.c_fc.weight", (1, 4)),
    (W::FcB, "mlp.c_fc.bias", (0, 4)),
    (W::OutW, "mlp.c_proj.weight", (4, 1)),
    (W::OutB, "mlp.c_proj.bias", (0, 1)),
];

/// One block's parameters.
#[derive(Debug)]
pub struct Block<B: Backend> {
    params: Vec<Param<B>>,
}

impl<B: Backend> Index<W> for Block<B> {
    type Output = Param<B>;
    fn index(&self, which: W) -> &Param<B> {
        &self.params[which as usize]
    }
}

impl<B: Backend> IndexMut<W> for Block<B> {
    fn index_mut(&mut self, which: W) -> &mut Param<B> {
        &mut self.params[which as usize]
    }
}

impl<B: Backend> Block<B> {
    /// AdamW's step `t` of every parameter with its gradient (in [`BLOCK_PARAMS`]' order).
    pub fn update(&mut self, grads: &[B::Buf], opt: &AdamW, t: i32) -> anyhow::Result<()> {
        for (param, grad) in self.params.iter_mut().zip(grads) {
            param.update(B::slice(grad), opt, t)?;
        }
        Ok(())
    }
}

/// Every parameter of the model.
#[derive(Debug)]
pub struct Params<B: Backend> {
    /// Token embedding, `vocab x width` (tied to the output projection).
    pub wte: Param<B>,
    /// Position embedding, `context x width`.
    pub wpe: Param<B>,
    /// The blocks.
    pub blocks: Vec<Block<B>>,
    /// The final layer norm's weight.
    pub lnf_w: Param<B>,
    /// The final layer norm's bias.
    pub lnf_b: Param<B>,
}

impl<B: Backend> Params<B> {
    /// The parameters of a model of `shape` from `backend`, initialised as nanoGPT does from
    /// `rng` (normal with deviation 0.02, the residual projections' divided by `sqrt(2 x
    /// layers)`; layer norms 1 and 0; biases 0), or zeros without it (a dry run).
    pub fn new(
        backend: &B,
        shape: &Shape,
        mut rng: Option<&mut super::Rng>,
    ) -> anyhow::Result<Self> {
        let (c, std) = (shape.width, 0.02);
        let residual = std / (2.0 * shape.layers as f32).sqrt();
        let mut param = |name: String, dims: (usize, usize), init: (Init, Kind)| {
            Param::new(backend, name, dims, init, rng.as_deref_mut())
        };
        let table = (Init::Normal(std), Kind::Table);
        let wte = param("transformer.wte.weight".into(), (shape.vocab, c), table)?;
        let wpe = param("transformer.wpe.weight".into(), (shape.context, c), table)?;
        let mut blocks = Vec::new();
        blocks
            .try_reserve_exact(shape.layers)
            .map_err(|e| anyhow!("{} blocks: {e}", shape.layers))?;
        for b in 0..shape.layers {
            let params = BLOCK_PARAMS
                .iter()
                .map(|&(which, name, (rows, cols))| {
                    let init = match (which, rows) {
                        (W::ProjW | W::OutW, _) => Init::Normal(residual),
                        (W::Ln1W | W::Ln2W, _) => Init::Ones,
                        (_, 0) => Init::Zeros,
                        _ => Init::Normal(std),
                    };
                    let dims = (if rows == 0 { 1 } else { rows * c }, cols * c);
                    let kind = if rows == 0 {
                        Kind::Vector
                    } else {
                        Kind::Linear
                    };
                    param(format!("transformer.h.{b}.{name}"), dims, (init, kind))
                })
                .collect::<anyhow::Result<_>>()?;
            blocks.push(Block { params });
        }
        let lnf_w = param(
            "transformer.ln_f.weight".into(),
            (1, c),
            (Init::Ones, Kind::Vector),
        )?;
        let lnf_b = param(
            "transformer.ln_f.bias".into(),
            (1, c),
            (Init::Zeros, Kind::Vector),
        )?;
        Ok(Self {
            wte,
            wpe,
            blocks,
            lnf_w,
            lnf_b,
        })
    }

    /// Every parameter, in nanoGPT's state-dict order.
    fn all(&self) -> impl Iterator<Item = &Param<B>> {
        [&self.wte, &self.wpe]
            .into_iter()
            .chain(self.blocks.iter().flat_map(|b| b.params.iter()))
            .chain([&self.lnf_w, &self.lnf_b])
    }

    /// Every parameter, for writing.
    fn all_mut(&mut self) -> impl Iterator<Item = &mut Param<B>> {
        [&mut self.wte, &mut self.wpe]
            .into_iter()
            .chain(self.blocks.iter_mut().flat_map(|b| b.params.iter_mut()))
            .chain([&mut self.lnf_w, &mut self.lnf_b])
    }

    /// A digest of every parameter's bits, in nanoGPT's order (see `Model::digest`).
    pub fn digest(&self) -> u64 {
        self.all().fold(crate::model::DIGEST_START, |hash, p| {
            crate::model::digest_of(hash, p.get())
        })
    }

    /// The number of parameters.
    pub fn count(&self) -> usize {
        self.all().map(|p| p.rows * p.cols).sum()
    }

    /// Writes the parameters to `path` as safetensors, nanoGPT's names and layouts.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .all()
            .map(|p| (p.name.clone(), p.torch_shape(), p.torch_bytes()))
            .collect();
        let views = tensors
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(Dtype::F32, shape.clone(), bytes).map(|view| (name.as_str(), view))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("{e}"))?;
        safetensors::serialize_to_file(views, None, path)
            .map_err(|e| anyhow!("--save-init {}: {e}", path.display()))
    }

    /// Sets the parameters from the safetensors file at `path`; an error naming the tensor if
    /// the file lacks one, holds one the model does not have, or holds one of another dtype
    /// or shape (both shapes named).
    pub fn load(&mut self, path: &Path) -> Result<(), BadInput> {
        let file = path.display();
        let bytes = std::fs::read(path)
            .map_err(|e| BadInput(format!("--load {file}: {e}: give a safetensors file")))?;
        let tensors = SafeTensors::deserialize(&bytes)
            .map_err(|e| BadInput(format!("--load {file}: not a safetensors file: {e}")))?;
        let tied = "lm_head.weight";
        let mut names: Vec<&str> = tensors.names();
        names.sort_unstable();
        if let (Ok(wte), Ok(head)) = (
            tensors.tensor("transformer.wte.weight"),
            tensors.tensor(tied),
        ) {
            if wte.data() != head.data() || wte.shape() != head.shape() {
                return Err(BadInput(format!(
                    "--load {file}: {tied} differs from transformer.wte.weight, but the model \
                     ties them"
                )));
            }
        }
        for param in self.all_mut() {
            let view = tensors
                .tensor(&param.name)
                .or_else(|_| match param.name == "transformer.wte.weight" {
                    true => tensors.tensor(tied),
                    false => tensors.tensor(&param.name),
                })
                .map_err(|_| {
                    BadInput(format!(
                        "--load {file}: no tensor {} (of shape {:?}) in the file",
                        param.name,
                        param.torch_shape()
                    ))
                })?;
            param.set(&view, path)?;
        }
        let known: Vec<String> = self.all().map(|p| p.name.clone()).collect();
        // nanoGPT's own checkpoints may hold each block's causal mask (`attn.bias`), a buffer,
        // not a parameter: passed over as nanoGPT's loader does.
        let mask = |n: &str| n.ends_with(".attn.bias");
        if let Some(extra) = names
            .iter()
            .find(|n| **n != tied && !mask(n) && !known.iter().any(|k| k == *n))
        {
            let shape = tensors
                .tensor(extra)
                .map(|v| v.shape().to_vec())
                .unwrap_or_default();
            return Err(BadInput(format!(
                "--load {file}: the tensor {extra} (of shape {shape:?}) is not one of the \
                 model's (--layers {} has blocks 0 to {})",
                self.blocks.len(),
                self.blocks.len().saturating_sub(1)
            )));
        }
        Ok(())
    }
}
