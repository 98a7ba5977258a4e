//! Trains a multi-layer perceptron on the CPU with activation checkpointing, on ferropool.
//!
//! The task: inputs are Gaussian vectors, labels are the arg-max of a fixed random linear
//! "teacher"; the student MLP learns it and the loss falls. Every activation, gradient and
//! scratch tensor of a step comes from a `BufferPool`:
//!
//! - **forward**: each layer's output is a pooled tensor; only the inputs of every
//!   `--checkpoint-every`-th layer are kept, as `RetainedValue`s on a `CheckpointNode` chain;
//!   the others go back to the pool at once;
//! - **backward**: `--threads` threads each take a slice of the batch and replay the chain's
//!   segments newest first: they read the retained checkpoints concurrently through
//!   `tensor_read`, recompute the segment's activations from their own thread caches, and
//!   back-propagate; their weight gradients are summed and Adam updates the parameters;
//! - **end of step**: the chain drops, the retained values drop, the buffers return.
//!
//! `--compare` runs the same training (same seed, same checkpointing) twice, in child
//! processes, once on the pool and once on plain `Vec<f32>` from the system allocator, and
//! prints both side by side.
//!
//! Run: `cargo run --release --example train_replay` (see `--help`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use ferropool::{
    BufferPool, CheckpointNode, DType, PoolConfig, PoolEventKind, RetainedInputMap, RetainedValue,
    Tensor,
};

// ---- a counting system allocator: system allocations per step, for both backends ----------

struct Counting;
static SYSTEM_ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to `System`, only counting allocations.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        SYSTEM_ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        SYSTEM_ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        SYSTEM_ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---- command line -------------------------------------------------------------------------

/// Train an MLP with checkpoint replay on ferropool.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    /// Training steps.
    #[arg(long, default_value_t = 60)]
    steps: usize,
    /// Examples per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Width of the hidden layers.
    #[arg(long, default_value_t = 512)]
    hidden: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 6)]
    layers: usize,
    /// Keep the input of every N-th layer; recompute the rest in the backward pass.
    #[arg(long, default_value_t = 2)]
    checkpoint_every: usize,
    /// Replay threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Pool byte budget, e.g. 256MiB, 1GiB or 1000000 (default: none).
    #[arg(long, value_parser = parse_bytes)]
    budget: Option<u64>,
    /// Adam learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f32,
    /// Seed of the data and the initial weights.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Run on the pool and on plain Vec storage, in child processes, and compare.
    #[arg(long)]
    compare: bool,
    /// Write the pool's event trace as JSON.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Draw the pool's memory timeline as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Storage backend (used by --compare's child processes).
    #[arg(long, default_value = "pool", value_parser = ["pool", "vec"], hide = true)]
    backend: String,
    /// Print one machine-readable summary line only (used by --compare).
    #[arg(long, hide = true)]
    summary_only: bool,
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        other => return Err(format!("unknown unit {other:?} (use B, KiB, MiB or GiB)")),
    };
    number
        .parse::<u64>()
        .map(|n| n * scale)
        .map_err(|e| format!("{text:?}: {e}"))
}

// ---- storage backends ---------------------------------------------------------------------

/// Where a step's tensors live.
trait Backend: Sync {
    /// An owned `rows x cols` f32 buffer.
    type Buf: Send + Sync;
    /// A retained (checkpointed) activation.
    type Saved: Clone + Send + Sync;
    /// The checkpoint chain of one step.
    type Chain: Default + Sync;

    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Buf, String>;
    fn slice(buf: &Self::Buf) -> &[f32];
    fn slice_mut(buf: &mut Self::Buf) -> &mut [f32];
    fn save(&self, buf: Self::Buf) -> Self::Saved;
    fn with_saved<R>(saved: &Self::Saved, f: impl FnOnce(&[f32]) -> R) -> R;
    fn push_checkpoint(&self, chain: &mut Self::Chain, layer: usize, saved: Self::Saved);
    fn checkpoint(chain: &Self::Chain, layer: usize) -> Self::Saved;
    /// Called at a step's high-water marks (end of forward, end of backward).
    fn sample(&self) {}
}

struct PoolBackend {
    pool: BufferPool,
}

/// What a checkpoint node's graph is here: the layer its retained input feeds.
#[derive(Debug)]
struct Segment {
    first_layer: usize,
}

type Chain = Option<Arc<CheckpointNode<Segment, usize, usize>>>;

impl Backend for PoolBackend {
    type Buf = Tensor;
    type Saved = Arc<RetainedValue>;
    type Chain = Chain;

    fn zeros(&self, rows: usize, cols: usize) -> Result<Tensor, String> {
        Tensor::zeros_in(&self.pool, DType::F32, &[rows, cols]).map_err(|e| e.to_string())
    }
    fn slice(buf: &Tensor) -> &[f32] {
        buf.as_slice().expect("f32 tensor")
    }
    fn slice_mut(buf: &mut Tensor) -> &mut [f32] {
        buf.as_mut_slice().expect("f32 tensor")
    }
    fn save(&self, buf: Tensor) -> Arc<RetainedValue> {
        Arc::new(RetainedValue::from_tensor(buf))
    }
    fn with_saved<R>(saved: &Arc<RetainedValue>, f: impl FnOnce(&[f32]) -> R) -> R {
        let read = saved.tensor_read().expect("a retained checkpoint resolves");
        f(read.as_slice().expect("f32 checkpoint"))
    }
    fn push_checkpoint(&self, chain: &mut Chain, layer: usize, saved: Arc<RetainedValue>) {
        let mut inputs = RetainedInputMap::new();
        inputs.insert(layer, saved);
        *chain = Some(Arc::new(CheckpointNode {
            graph: Arc::new(Segment { first_layer: layer }),
            alias_key: layer,
            alias_target: layer,
            old_inputs: Arc::new(inputs),
            prev: chain.take(),
        }));
    }
    fn sample(&self) {
        // Reading the stats updates the pool's sampled peaks (live, cached, requested).
        let _ = self.pool.stats();
    }
    fn checkpoint(chain: &Chain, layer: usize) -> Arc<RetainedValue> {
        let head = chain.as_ref().expect("a chain");
        debug_assert!(head.iter().any(|node| node.graph.first_layer == layer));
        Arc::clone(head.lookup_input(&layer).expect("checkpointed layer"))
    }
}

struct VecBackend;

impl Backend for VecBackend {
    type Buf = Vec<f32>;
    type Saved = Arc<Vec<f32>>;
    type Chain = HashMap<usize, Arc<Vec<f32>>>;

    fn zeros(&self, rows: usize, cols: usize) -> Result<Vec<f32>, String> {
        Ok(vec![0.0; rows * cols])
    }
    fn slice(buf: &Vec<f32>) -> &[f32] {
        buf
    }
    fn slice_mut(buf: &mut Vec<f32>) -> &mut [f32] {
        buf
    }
    fn save(&self, buf: Vec<f32>) -> Arc<Vec<f32>> {
        Arc::new(buf)
    }
    fn with_saved<R>(saved: &Arc<Vec<f32>>, f: impl FnOnce(&[f32]) -> R) -> R {
        f(saved)
    }
    fn push_checkpoint(&self, chain: &mut Self::Chain, layer: usize, saved: Arc<Vec<f32>>) {
        chain.insert(layer, saved);
    }
    fn checkpoint(chain: &Self::Chain, layer: usize) -> Arc<Vec<f32>> {
        Arc::clone(&chain[&layer])
    }
}

// ---- the model ------------------------------------------------------------------------------

const INPUT: usize = 128;
const CLASSES: usize = 10;

/// xorshift64*: deterministic across backends.
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

/// One linear layer's parameters and Adam state (persistent, allocated once).
struct Linear {
    inputs: usize,
    outputs: usize,
    weight: Vec<f32>,
    bias: Vec<f32>,
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

/// `c[m x n] = a[m x k] * b[k x n]`: `a` with explicit strides (read one scalar at a time, so
/// a transposed `a` costs nothing), `b` and `c` row-major. Blocked over `k` so that the rows of
/// `b` in use stay in cache; the inner loop runs along rows and vectorises. It needs no
/// scratch memory at all, so a training step makes no allocation outside the pool.
fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    strides: (usize, usize),
    b: &[f32],
    c: &mut [f32],
) {
    assert!(b.len() >= k * n && c.len() >= m * n);
    assert!(m == 0 || k == 0 || a.len() > (m - 1) * strides.0 + (k - 1) * strides.1);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { gemm_fma(m, k, n, a, strides, b, c) };
    }
    gemm_body::<false>(m, k, n, a, strides, b, c);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gemm_fma(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    strides: (usize, usize),
    b: &[f32],
    c: &mut [f32],
) {
    gemm_body::<true>(m, k, n, a, strides, b, c);
}

#[inline(always)]
fn gemm_body<const FMA: bool>(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    c: &mut [f32],
) {
    const K_BLOCK: usize = 64;
    c[..m * n].fill(0.0);
    for k0 in (0..k).step_by(K_BLOCK) {
        let k1 = (k0 + K_BLOCK).min(k);
        for (i, c_row) in c[..m * n].chunks_exact_mut(n).enumerate() {
            for p in k0..k1 {
                let a_ip = a[i * rsa + p * csa];
                for (cv, &bv) in c_row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                    *cv = if FMA {
                        a_ip.mul_add(bv, *cv)
                    } else {
                        *cv + a_ip * bv
                    };
                }
            }
        }
    }
}

struct Trainer<'a, B: Backend> {
    backend: &'a B,
    layers: Vec<Linear>,
    checkpoint_every: usize,
    threads: usize,
    teacher: Vec<f32>,
    rng: Rng,
    step: usize,
    lr: f32,
    /// Replay workers, kept for the whole run (as a training runtime keeps its threads), so
    /// their pool caches stay warm from step to step.
    workers: rayon::ThreadPool,
}

/// One thread's share of the backward pass.
struct Partial<B: Backend> {
    weight_grads: Vec<B::Buf>,
    bias_grads: Vec<B::Buf>,
}

impl<'a, B: Backend> Trainer<'a, B> {
    fn new(backend: &'a B, args: &Args) -> Self {
        let mut rng = Rng(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let teacher = (0..INPUT * CLASSES).map(|_| rng.normal()).collect();
        let mut dims = vec![INPUT];
        dims.extend(std::iter::repeat_n(args.hidden, args.layers));
        dims.push(CLASSES);
        let layers = dims
            .windows(2)
            .map(|w| Linear::new(w[0], w[1], &mut rng))
            .collect();
        let threads = args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1);
        Self {
            backend,
            layers,
            checkpoint_every: args.checkpoint_every.max(1),
            threads,
            workers: rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("replay threads"),
            teacher,
            rng,
            step: 0,
            lr: args.lr,
        }
    }

    /// `out = relu?(input * W + b)` for `rows` rows.
    fn linear(&self, l: usize, input: &[f32], rows: usize, relu: bool) -> Result<B::Buf, String> {
        let layer = &self.layers[l];
        let mut out = self.backend.zeros(rows, layer.outputs)?;
        let o = B::slice_mut(&mut out);
        gemm(
            rows,
            layer.inputs,
            layer.outputs,
            input,
            (layer.inputs, 1),
            &layer.weight,
            o,
        );
        for row in o.chunks_exact_mut(layer.outputs) {
            for (v, b) in row.iter_mut().zip(&layer.bias) {
                *v += b;
                if relu && *v < 0.0 {
                    *v = 0.0;
                }
            }
        }
        Ok(out)
    }

    /// One training step; returns the mean loss.
    fn step(&mut self, batch: usize) -> Result<f32, String> {
        self.step += 1;
        let count = self.layers.len();
        // The batch: inputs in the pool, labels from the teacher.
        let mut x = self.backend.zeros(batch, INPUT)?;
        B::slice_mut(&mut x)
            .iter_mut()
            .for_each(|v| *v = self.rng.normal());
        let labels: Vec<usize> = B::slice(&x)
            .chunks_exact(INPUT)
            .map(|row| {
                (0..CLASSES)
                    .map(|c| {
                        (0..INPUT)
                            .map(|i| row[i] * self.teacher[i * CLASSES + c])
                            .sum::<f32>()
                    })
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map_or(0, |(c, _)| c)
            })
            .collect();

        // Forward: keep only the inputs of every checkpoint_every-th layer, on the chain.
        let mut chain = B::Chain::default();
        let mut current = self.backend.save(x);
        self.backend.push_checkpoint(&mut chain, 0, current.clone());
        let mut live: Option<B::Buf> = None;
        for l in 0..count {
            let relu = l + 1 < count;
            let out = match &live {
                Some(buf) => self.linear(l, B::slice(buf), batch, relu)?,
                None => B::with_saved(&current, |input| self.linear(l, input, batch, relu))?,
            };
            if l + 1 < count && (l + 1) % self.checkpoint_every == 0 {
                current = self.backend.save(out);
                self.backend
                    .push_checkpoint(&mut chain, l + 1, current.clone());
                live = None;
            } else {
                live = Some(out); // the previous non-checkpointed activation drops here
            }
        }
        let logits = live.expect("the last layer is never a checkpoint");

        // Loss and its gradient (softmax cross-entropy, mean over the batch).
        let mut grad = self.backend.zeros(batch, CLASSES)?;
        let mut loss = 0.0f32;
        for ((row, g), &label) in B::slice(&logits)
            .chunks_exact(CLASSES)
            .zip(B::slice_mut(&mut grad).chunks_exact_mut(CLASSES))
            .zip(&labels)
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

        // Backward: each thread replays every segment for its rows, newest segment first.
        let shards = self.threads.clamp(1, batch);
        self.backend.sample();
        // W^T of every layer, for the input gradients (scratch for this step, in the pool).
        let transposed = self
            .layers
            .iter()
            .map(|layer| {
                let mut t = self.backend.zeros(layer.outputs, layer.inputs)?;
                let out = B::slice_mut(&mut t);
                for (r, row) in layer.weight.chunks_exact(layer.outputs).enumerate() {
                    for (c, &w) in row.iter().enumerate() {
                        out[c * layer.inputs + r] = w;
                    }
                }
                Ok(t)
            })
            .collect::<Result<Vec<_>, String>>()?;
        let partials: Vec<Result<Partial<B>, String>> = {
            use rayon::prelude::*;
            let (chain, grad, this, transposed) =
                (&chain, B::slice(&grad), &*self, &transposed[..]);
            self.workers.install(|| {
                (0..shards)
                    .into_par_iter()
                    .map(|t| {
                        let (r0, r1) = (t * batch / shards, (t + 1) * batch / shards);
                        this.replay(chain, transposed, &grad[r0 * CLASSES..r1 * CLASSES], r0, r1)
                    })
                    .collect()
            })
        };
        self.backend.sample();
        drop(chain); // end of the step's retention: the checkpoints go back to the pool
        drop(current);
        let partials = partials.into_iter().collect::<Result<Vec<_>, _>>()?;

        // Sum the threads' gradients and take an Adam step.
        let (t, lr) = (self.step as i32, self.lr);
        for l in 0..count {
            let (inputs, outputs) = (self.layers[l].inputs, self.layers[l].outputs);
            let mut weight_grad = self.backend.zeros(inputs, outputs)?;
            let mut bias_grad = self.backend.zeros(1, outputs)?;
            for p in &partials {
                add_into(B::slice_mut(&mut weight_grad), B::slice(&p.weight_grads[l]));
                add_into(B::slice_mut(&mut bias_grad), B::slice(&p.bias_grads[l]));
            }
            let layer = &mut self.layers[l];
            let [mw, vw, mb, vb] = &mut layer.moments;
            adam(&mut layer.weight, B::slice(&weight_grad), mw, vw, lr, t);
            adam(&mut layer.bias, B::slice(&bias_grad), mb, vb, lr, t);
        }
        Ok(loss / batch as f32)
    }

    /// Rows `r0..r1` of the backward pass: recompute each segment from its checkpoint (read
    /// through the retained handle, concurrently with the other threads), then back-propagate.
    fn replay(
        &self,
        chain: &B::Chain,
        transposed: &[B::Buf],
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
        for (s, &start) in starts.iter().enumerate().rev() {
            let end = starts.get(s + 1).copied().unwrap_or(count);
            // Recompute the inputs of layers start..end for our rows, from the checkpoint.
            let width = self.layers[start].inputs;
            let mut first = self.backend.zeros(rows, width)?;
            B::with_saved(&B::checkpoint(chain, start), |all| {
                B::slice_mut(&mut first).copy_from_slice(&all[r0 * width..r1 * width]);
            });
            let mut inputs: Vec<B::Buf> = vec![first];
            for l in start..end - 1 {
                let next = self.linear(l, B::slice(&inputs[l - start]), rows, true)?;
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
                        relu_mask(g, B::slice(&inputs[l + 1 - start]));
                    } else {
                        let w = layer.outputs;
                        B::with_saved(&B::checkpoint(chain, end), |all| {
                            relu_mask(g, &all[r0 * w..r1 * w]);
                        });
                    }
                }
                let mut wg = self.backend.zeros(layer.inputs, layer.outputs)?;
                // dW = input^T * g
                let input = B::slice(&inputs[l - start]);
                gemm(
                    layer.inputs,
                    rows,
                    layer.outputs,
                    input,
                    (1, layer.inputs),
                    g,
                    B::slice_mut(&mut wg),
                );
                let mut bg = self.backend.zeros(1, layer.outputs)?;
                for row in g.chunks_exact(layer.outputs) {
                    add_into(B::slice_mut(&mut bg), row);
                }
                weight_grads[l] = Some(wg);
                bias_grads[l] = Some(bg);
                // d input = g * W^T (W^T transposed once per step, in the pool)
                let mut down = self.backend.zeros(rows, layer.inputs)?;
                let wt = B::slice(&transposed[l]);
                gemm(
                    rows,
                    layer.outputs,
                    layer.inputs,
                    g,
                    (layer.outputs, 1),
                    wt,
                    B::slice_mut(&mut down),
                );
                upstream = down;
            }
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

fn add_into(acc: &mut [f32], values: &[f32]) {
    for (a, v) in acc.iter_mut().zip(values) {
        *a += v;
    }
}

/// Zeroes `grad` where the ReLU output was clipped.
fn relu_mask(grad: &mut [f32], output: &[f32]) {
    for (g, o) in grad.iter_mut().zip(output) {
        if *o <= 0.0 {
            *g = 0.0;
        }
    }
}

fn adam(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, t: i32) {
    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
    let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    for (((p, g), m), v) in param.iter_mut().zip(grad).zip(m).zip(v) {
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        *p -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
    }
}

// ---- measurements ---------------------------------------------------------------------------

#[path = "../support/procfs.rs"]
mod procfs;
use procfs::{minor_faults, peak_rss};

/// What one run measured.
#[derive(Debug, Default, Clone)]
struct Summary {
    first_loss: f32,
    last_loss: f32,
    steps_per_s: f64,
    faults_per_step: f64,
    allocs_per_step: f64,
    peak_rss: u64,
}

impl Summary {
    fn line(&self) -> String {
        format!(
            "SUMMARY first_loss={} last_loss={} steps_per_s={} faults_per_step={} allocs_per_step={} peak_rss={}",
            self.first_loss, self.last_loss, self.steps_per_s, self.faults_per_step, self.allocs_per_step, self.peak_rss
        )
    }

    fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("SUMMARY "))?;
        let field = |name: &str| -> Option<f64> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))?
                .parse()
                .ok()
        };
        Some(Self {
            first_loss: field("first_loss")? as f32,
            last_loss: field("last_loss")? as f32,
            steps_per_s: field("steps_per_s")?,
            faults_per_step: field("faults_per_step")?,
            allocs_per_step: field("allocs_per_step")?,
            peak_rss: field("peak_rss")? as u64,
        })
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Runs the training; `on_step` sees (step, loss, seconds so far).
fn train<B: Backend>(
    backend: &B,
    args: &Args,
    mut on_step: impl FnMut(usize, f32),
) -> Result<Summary, String> {
    let mut trainer = Trainer::new(backend, args);
    // Steady state: the second half of the run (the first half warms the caches up).
    let warmup = (args.steps / 2).min(args.steps.saturating_sub(1));
    let mut summary = Summary::default();
    let (mut faults, mut allocs, mut started) = (0, 0, Instant::now());
    for step in 0..args.steps {
        if step == warmup {
            faults = minor_faults();
            allocs = SYSTEM_ALLOCS.load(Ordering::Relaxed);
            started = Instant::now();
        }
        let loss = trainer.step(args.batch)?;
        if step == 0 {
            summary.first_loss = loss;
        }
        summary.last_loss = loss;
        on_step(step, loss);
    }
    let measured = (args.steps - warmup).max(1) as f64;
    summary.steps_per_s = measured / started.elapsed().as_secs_f64();
    summary.faults_per_step = (minor_faults() - faults) as f64 / measured;
    summary.allocs_per_step = (SYSTEM_ALLOCS.load(Ordering::Relaxed) - allocs) as f64 / measured;
    summary.peak_rss = peak_rss();
    Ok(summary)
}

fn run(args: &Args) -> Result<(), String> {
    if args.compare {
        return compare(args);
    }
    if args.backend == "vec" {
        let summary = train(&VecBackend, args, |_, _| {})?;
        println!("{}", summary.line());
        return Ok(());
    }
    let tracing = args.trace.is_some() || args.plot.is_some();
    let pool = BufferPool::with_config(PoolConfig {
        budget: args.budget,
        trace_capacity: if tracing { 1 << 22 } else { 0 },
        ..PoolConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let backend = PoolBackend { pool: pool.clone() };
    let quiet = args.summary_only;
    if !quiet {
        println!(
            "ferropool train_replay: MLP {INPUT} -> {} x {} -> {CLASSES}, batch {}, checkpoint every {} layer(s), {} replay thread(s), {} steps",
            args.layers,
            args.hidden,
            args.batch,
            args.checkpoint_every.max(1),
            args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            args.steps
        );
    }
    let tty = std::io::stderr().is_terminal();
    let bar = (tty && !quiet).then(|| {
        let bar = indicatif::ProgressBar::new(args.steps as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} steps  {per_sec}  loss {msg}",
            )
            .expect("valid template"),
        );
        bar
    });
    let mut boundaries = Vec::new();
    let started = Instant::now();
    let summary = train(&backend, args, |step, loss| {
        boundaries.extend(pool.trace_now_ns());
        let rate = (step + 1) as f64 / started.elapsed().as_secs_f64();
        match &bar {
            Some(bar) => {
                bar.set_message(format!("{loss:.4}"));
                bar.inc(1);
            }
            None if !quiet && (step % 5 == 0 || step + 1 == args.steps) => {
                println!("step {:>4}  loss {loss:.4}  {rate:.2} steps/s", step + 1);
            }
            None => {}
        }
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let stats = pool.stats();
    if quiet {
        println!("{}", summary.line());
        return Ok(());
    }
    println!(
        "loss {:.4} -> {:.4} ({}), {:.2} steps/s",
        summary.first_loss,
        summary.last_loss,
        if summary.last_loss < summary.first_loss {
            "falling"
        } else {
            "NOT falling"
        },
        summary.steps_per_s
    );
    println!();
    println!("| memory (pool)                      | value |");
    println!("|------------------------------------|-------|");
    println!(
        "| peak live bytes                    | {} |",
        mib(stats.peak_in_use_bytes)
    );
    println!(
        "| peak reserved bytes                | {} |",
        mib(stats.peak_reserved_bytes)
    );
    println!(
        "| rounding waste (now, of in use)    | {} |",
        mib(stats.rounding_waste_bytes())
    );
    println!(
        "| cache hit rate                     | {:.1}% |",
        stats.cache_hit_rate() * 100.0
    );
    println!(
        "| system allocations per step        | {:.1} |",
        summary.allocs_per_step
    );
    println!(
        "| minor page faults per step         | {:.1} |",
        summary.faults_per_step
    );
    println!(
        "| peak RSS                           | {} |",
        mib(summary.peak_rss)
    );
    println!(
        "(steady state after warm-up; allocations count every call to the system allocator, the pool's and everyone else's)"
    );
    if let Some(path) = &args.trace {
        std::fs::write(path, pool.trace_json()).map_err(|e| format!("{}: {e}", path.display()))?;
        println!(
            "trace: {} events -> {}",
            pool.trace_events().len(),
            path.display()
        );
    }
    if let Some(path) = &args.plot {
        plot(&pool, &boundaries, path)?;
        println!("memory timeline -> {}", path.display());
    }
    Ok(())
}

fn compare(args: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let run_child = |backend: &str| -> Result<Summary, String> {
        let mut command = std::process::Command::new(&exe);
        command.args([
            "--backend",
            backend,
            "--summary-only",
            "--steps",
            &args.steps.to_string(),
            "--batch",
            &args.batch.to_string(),
            "--hidden",
            &args.hidden.to_string(),
            "--layers",
            &args.layers.to_string(),
            "--checkpoint-every",
            &args.checkpoint_every.to_string(),
            "--lr",
            &args.lr.to_string(),
            "--seed",
            &args.seed.to_string(),
        ]);
        if let Some(threads) = args.threads {
            command.args(["--threads", &threads.to_string()]);
        }
        if let Some(budget) = args.budget {
            command.args(["--budget", &budget.to_string()]);
        }
        let output = command.output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        Summary::parse(&text).ok_or_else(|| {
            format!(
                "the {backend} run failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )
        })
    };
    println!("running the same training on ferropool and on Vec<f32> (system allocator)...");
    let pool = run_child("pool")?;
    let plain = run_child("vec")?;
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}x", a / b)
        } else {
            "-".into()
        }
    };
    println!();
    println!("|                          | ferropool | Vec<f32> (glibc) | ratio |");
    println!("|--------------------------|-----------|------------------|-------|");
    println!(
        "| steps/s                  | {:.2} | {:.2} | {} |",
        pool.steps_per_s,
        plain.steps_per_s,
        ratio(pool.steps_per_s, plain.steps_per_s)
    );
    println!(
        "| minor faults per step    | {:.1} | {:.1} | {} |",
        pool.faults_per_step,
        plain.faults_per_step,
        ratio(plain.faults_per_step, pool.faults_per_step)
    );
    println!(
        "| system allocs per step   | {:.1} | {:.1} | {} |",
        pool.allocs_per_step,
        plain.allocs_per_step,
        ratio(plain.allocs_per_step, pool.allocs_per_step)
    );
    println!(
        "| peak RSS                 | {} | {} | {} |",
        mib(pool.peak_rss),
        mib(plain.peak_rss),
        ratio(pool.peak_rss as f64, plain.peak_rss as f64)
    );
    println!(
        "| loss (first -> last)     | {:.4} -> {:.4} | {:.4} -> {:.4} | |",
        pool.first_loss, pool.last_loss, plain.first_loss, plain.last_loss
    );
    Ok(())
}

/// Draws bytes in use, cached and reserved over time from the pool's trace.
fn plot(pool: &BufferPool, boundaries: &[u64], path: &PathBuf) -> Result<(), String> {
    use plotters::prelude::*;
    let events = pool.trace_events();
    let (mut in_use, mut reserved) = (0i64, 0i64);
    let mut points: Vec<(f64, f64, f64)> = Vec::with_capacity(events.len());
    for e in &events {
        match e.kind {
            PoolEventKind::Alloc => in_use += e.bytes as i64,
            PoolEventKind::Free => in_use -= e.bytes as i64,
            PoolEventKind::SystemAlloc => reserved += e.bytes as i64,
            PoolEventKind::SystemFree => reserved -= e.bytes as i64,
            _ => continue,
        }
        points.push((
            e.at_ns as f64 / 1e6,
            in_use as f64 / (1 << 20) as f64,
            reserved as f64 / (1 << 20) as f64,
        ));
    }
    let end_ms = points.last().map_or(1.0, |p| p.0).max(1.0);
    let top = points.iter().map(|p| p.2).fold(1.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
    let error = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ferropool memory timeline (train_replay)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end_ms, 0.0..top)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("time (ms)")
        .y_desc("MiB")
        .draw()
        .map_err(|e| error(&e))?;
    for (i, &ns) in boundaries.iter().enumerate() {
        let x = ns as f64 / 1e6;
        let style = ShapeStyle::from(&RGBColor(150, 80, 200).mix(0.6)).stroke_width(1);
        let series = chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, top)],
                style,
            )))
            .map_err(|e| error(&e))?;
        if i == 0 {
            series.label("step boundary").legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(150, 80, 200))
            });
        }
    }
    // A point is (time, in use, reserved); each series picks its y from it.
    type Pick = fn(&(f64, f64, f64)) -> f64;
    let series: [(&str, RGBColor, u32, Pick); 3] = [
        ("reserved from the system", RED, 2, |p| p.2),
        ("cached (reserved - in use)", GREEN, 1, |p| p.2 - p.1),
        ("in use (live tensors)", BLUE, 1, |p| p.1),
    ];
    for (label, color, width, y) in series {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, y(p))),
                color.stroke_width(width),
            ))
            .map_err(|e| error(&e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| error(&e))?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}
