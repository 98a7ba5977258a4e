//! The training: an MLP (`INPUT -> layers x hidden -> CLASSES`, ReLU) on burn's flex backend
//! (pure-Rust CPU) with autodiff, softmax cross-entropy against the argmax labels of a fixed
//! random linear teacher, Adam. Every step draws a fresh batch of standard normal inputs.

use std::time::Instant;

use burn::module::{Initializer, Module};
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Distribution, Int, Tensor};
use ferropool_figures::{anon_huge_bytes, cpu_seconds, minor_faults, peak_rss};
use serde::{Deserialize, Serialize};

use crate::allocator;

/// Input features.
pub const INPUT: usize = 128;
/// Output classes.
pub const CLASSES: usize = 10;

/// What one training run does.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// Training steps (the second half is timed).
    pub steps: usize,
    /// Rows per batch.
    pub batch: usize,
    /// Hidden layers.
    pub layers: usize,
    /// Width of every hidden layer.
    pub hidden: usize,
    /// Adam's learning rate.
    pub lr: f64,
    /// Worker threads (reported; `main` sizes the thread pools before training).
    pub threads: usize,
}

impl Recipe {
    /// A floor on the bytes a run holds at once: the `f32` parameters with their gradients
    /// and Adam's two moments, and one batch's input, its layers' outputs and their ReLUs
    /// (autodiff keeps them for the backward pass). `None` where the count overflows.
    pub fn bytes(&self) -> Option<usize> {
        let (batch, hidden, layers) = (self.batch, self.hidden, self.layers);
        // Weights and biases: INPUT -> hidden, (layers - 1) x hidden -> hidden, hidden -> CLASSES.
        let first = INPUT.checked_add(1)?.checked_mul(hidden)?;
        let middle = hidden
            .checked_add(1)?
            .checked_mul(hidden)?
            .checked_mul(layers.saturating_sub(1))?;
        let last = hidden.checked_add(1)?.checked_mul(CLASSES)?;
        let parameters = first.checked_add(middle)?.checked_add(last)?;
        let widths = hidden
            .checked_mul(layers)?
            .checked_mul(2)?
            .checked_add(INPUT + CLASSES)?;
        let activations = batch.checked_mul(widths)?;
        parameters
            .checked_mul(4)?
            .checked_add(activations)?
            .checked_mul(std::mem::size_of::<f32>())
    }
}

/// The MLP.
#[derive(Module, Debug)]
struct Mlp {
    layers: Vec<Linear>,
    relu: Relu,
}

impl Mlp {
    fn new(recipe: &Recipe, device: &Device) -> Self {
        let mut dims = vec![INPUT];
        dims.extend(std::iter::repeat_n(recipe.hidden, recipe.layers));
        dims.push(CLASSES);
        // He initialisation, as in the main job: normal with standard deviation sqrt(2 / fan-in).
        let init = Initializer::KaimingNormal {
            gain: std::f64::consts::SQRT_2,
            fan_out_only: false,
        };
        let layers = dims
            .windows(2)
            .map(|w| {
                LinearConfig::new(w[0], w[1])
                    .with_initializer(init.clone())
                    .init(device)
            })
            .collect();
        Self {
            layers,
            relu: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i < last {
                x = self.relu.forward(x);
            }
        }
        x
    }
}

/// The pool's figures over the timed steps (pool variants only).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PoolFigures {
    /// Pool allocations per step (requests of at least the 64 KiB threshold).
    pub allocations_per_step: f64,
    /// Fraction of those served by the thread's cache.
    pub cache_hit_rate: f64,
    /// Blocks the pool took from the system per step.
    pub system_allocations_per_step: f64,
    /// Blocks the pool gave back to the system per step.
    pub system_frees_per_step: f64,
    /// Requests of at least the threshold that the pool refused and the fallback served, over
    /// the whole run.
    pub fallback_allocations: u64,
    /// High-water mark of the bytes the pool held from the system, over the whole run.
    pub peak_reserved_bytes: u64,
    /// High-water mark of the bytes in blocks handed out, over the whole run.
    pub peak_in_use_bytes: u64,
}

/// What one run measured; printed as one JSON line.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    /// `glibc`, `mimalloc`, `pool` or `pool-mimalloc`.
    pub allocator: String,
    /// Worker threads.
    pub threads: usize,
    /// Training steps run (the second half timed).
    pub steps: usize,
    /// Rows per batch.
    pub batch: usize,
    /// Steady-state steps per second (the second half of the steps).
    pub steps_per_s: f64,
    /// Minor page faults per steady-state step.
    pub faults_per_step: f64,
    /// CPU time (user and system, every thread) per steady-state step, in milliseconds.
    #[serde(default)]
    pub cpu_ms_per_step: f64,
    /// Anonymous memory backed by transparent huge pages at the end of the run, in bytes.
    #[serde(default)]
    pub thp_bytes: u64,
    /// Peak resident set size of the process, in bytes.
    pub peak_rss: u64,
    /// Loss of the first step.
    pub first_loss: f32,
    /// Loss of the last step.
    pub last_loss: f32,
    /// The pool's figures, for `pool` and `pool-mimalloc`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pool: Option<PoolFigures>,
}

/// Trains the model and measures the second half of the steps.
pub fn run(recipe: &Recipe) -> Summary {
    let device = Device::flex().autodiff();
    // Fixed, so every allocator trains the same model on the same data.
    device.seed(42);
    let teacher = Tensor::<2>::random([INPUT, CLASSES], Distribution::Normal(0.0, 1.0), &device);
    let mut model = Mlp::new(recipe, &device);
    let mut optimizer = AdamConfig::new().with_epsilon(1e-8).init();
    let loss_fn: CrossEntropyLoss = CrossEntropyLossConfig::new().init(&device);

    let choice = allocator::choice();
    let pool = ferropool::BufferPool::global();
    let warmup = (recipe.steps / 2).min(recipe.steps.saturating_sub(1));
    let mut summary = Summary {
        allocator: choice.name().into(),
        threads: recipe.threads,
        steps: recipe.steps,
        batch: recipe.batch,
        ..Summary::default()
    };
    let (mut faults, mut stats, mut started) = (0, pool.stats(), Instant::now());
    let mut cpu = 0.0;
    for step in 0..recipe.steps {
        if step == warmup {
            faults = minor_faults();
            cpu = cpu_seconds();
            stats = pool.stats();
            started = Instant::now();
        }
        let x = Tensor::<2>::random(
            [recipe.batch, INPUT],
            Distribution::Normal(0.0, 1.0),
            &device,
        );
        let labels: Tensor<1, Int> = x
            .clone()
            .matmul(teacher.clone())
            .argmax(1)
            .reshape([recipe.batch]);
        let logits = model.forward(x);
        let loss = loss_fn.forward(logits, labels);
        let value: f32 = loss.clone().into_scalar();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(recipe.lr, model, grads);
        if step == 0 {
            summary.first_loss = value;
        }
        summary.last_loss = value;
    }
    let measured = (recipe.steps - warmup).max(1) as f64;
    summary.steps_per_s = measured / started.elapsed().as_secs_f64();
    summary.faults_per_step = (minor_faults() - faults) as f64 / measured;
    summary.cpu_ms_per_step = (cpu_seconds() - cpu) * 1e3 / measured;
    summary.thp_bytes = anon_huge_bytes();
    summary.peak_rss = peak_rss();
    if choice.is_pool() {
        let after = pool.stats();
        let allocations = after.allocations - stats.allocations;
        let hits = after.cache_hits - stats.cache_hits;
        summary.pool = Some(PoolFigures {
            allocations_per_step: allocations as f64 / measured,
            cache_hit_rate: if allocations == 0 {
                0.0
            } else {
                hits as f64 / allocations as f64
            },
            system_allocations_per_step: (after.system_allocations - stats.system_allocations)
                as f64
                / measured,
            system_frees_per_step: (after.system_frees - stats.system_frees) as f64 / measured,
            fallback_allocations: ferropool::PoolAllocator::fallback_allocations(),
            peak_reserved_bytes: after.peak_reserved_bytes,
            peak_in_use_bytes: after.peak_in_use_bytes,
        });
    }
    summary
}
