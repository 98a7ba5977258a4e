//! Where a step's tensors live: pooled tensors, groups and retained values on a checkpoint
//! chain ([`PoolBackend`]), or plain `Vec<f32>` in a map ([`VecBackend`]), the baseline a user
//! would write.

use anyhow::anyhow;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Instant;

use ferropool::{
    BufferPool, CheckpointNode, DType, Error, OutOfMemory, PoolError, Recompute, RetainedInputMap,
    RetainedValue, SpanGuard, Tensor, TensorError, TensorValue,
};

use crate::recomputes::{self, Kind};
use crate::show::bytes;

/// A kernel as a recompute runs it: writes every element of its output from its inputs'
/// elements (one slice per input, in the order they were given).
#[derive(Clone)]
pub struct Kernel(Option<KernelFn>);

/// A kernel's function: its inputs' elements, and an output whose every element it writes.
type KernelFn = Arc<dyn Fn(&[&[f32]], &mut [MaybeUninit<f32>]) + Send + Sync>;

impl Kernel {
    /// The kernel `f`, which writes every element of its output.
    pub fn new(f: impl Fn(&[&[f32]], &mut [MaybeUninit<f32>]) + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(f)))
    }

    /// A dry run's kernel: its output is zeros, which a backend may take already zero.
    pub fn zeros() -> Self {
        Self(None)
    }

    /// Writes every element of `out` from `inputs`.
    pub fn run(&self, inputs: &[&[f32]], out: &mut [MaybeUninit<f32>]) {
        match &self.0 {
            Some(f) => f(inputs, out),
            None => out.fill(MaybeUninit::new(0.0)),
        }
    }

    /// Whether the output is zeros ([`Kernel::zeros`]).
    pub fn is_zeros(&self) -> bool {
        self.0.is_none()
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_zeros() {
            "Kernel(zeros)"
        } else {
            "Kernel"
        })
    }
}

/// Storage for one training step. Whatever can fail (an allocation, a read of a kept
/// buffer) returns an error for the step to pass up, never a panic.
pub trait Backend: Sync + 'static {
    /// An owned `rows x cols` f32 buffer.
    type Buf: Send + Sync + 'static;
    /// A retained (checkpointed) activation.
    type Saved: Clone + Send + Sync;
    /// The checkpoint chain of one step.
    type Chain: Default + Send + Sync;

    /// A buffer of zeros.
    fn zeros(&self, rows: usize, cols: usize) -> anyhow::Result<Self::Buf>;
    /// A buffer whose elements `init` writes (a kernel's output: no zeroing first).
    ///
    /// # Safety
    ///
    /// `init` writes every element of the slice it is given.
    unsafe fn written(
        &self,
        rows: usize,
        cols: usize,
        init: impl FnOnce(&mut [MaybeUninit<f32>]),
    ) -> anyhow::Result<Self::Buf>;
    /// The elements.
    fn slice(buf: &Self::Buf) -> &[f32];
    /// The elements, for writing.
    fn slice_mut(buf: &mut Self::Buf) -> &mut [f32];
    /// Keeps a buffer for the backward pass.
    fn save(&self, buf: Self::Buf) -> anyhow::Result<Self::Saved>;
    /// Keeps a kernel's output for the backward pass as a value the memory layer may evict
    /// under its budget and recompute from `inputs` with `kernel`, which costs `cost`; each
    /// recompute is counted under `kind` ([`recomputes`]). A backend
    /// without a memory layer keeps it as [`save`](Self::save) does.
    fn save_recomputable(
        &self,
        buf: Self::Buf,
        inputs: &[&Self::Saved],
        kind: Kind,
        cost: u64,
        kernel: Kernel,
    ) -> anyhow::Result<Self::Saved>;
    /// Reads a kept buffer.
    fn with_saved<R>(
        saved: &Self::Saved,
        f: impl FnOnce(&[f32]) -> anyhow::Result<R>,
    ) -> anyhow::Result<R>;
    /// Puts a node on the chain: the tensors kept for layer or block `node`, each under its
    /// key.
    fn push_checkpoint(
        &self,
        chain: &mut Self::Chain,
        node: usize,
        entries: impl IntoIterator<Item = (usize, Self::Saved)>,
    );
    /// The kept tensor under `key` (the newest, if nodes repeat it).
    fn checkpoint(chain: &Self::Chain, key: usize) -> anyhow::Result<Self::Saved>;
    /// Gives back the chain's newest node, that of `node`, once the backward pass is done
    /// with it.
    fn pop_checkpoint(chain: &mut Self::Chain, node: usize);
    /// A span of the step named `name` in the pool's trace, until the guard drops (`None`:
    /// a backend without a pool traces nothing).
    fn span(&self, _name: &'static str) -> Option<SpanGuard<'_>> {
        None
    }
}

/// Tensors from a pool (every one f32); checkpoints are `RetainedValue`s on a
/// `CheckpointNode` chain.
#[derive(Debug)]
pub struct PoolBackend {
    /// The pool.
    pub pool: BufferPool,
}

impl PoolBackend {
    /// The error of a `rows x cols` tensor the pool refused.
    fn refused(&self, error: TensorError, rows: usize, cols: usize) -> anyhow::Error {
        match &error {
            TensorError::Pool(PoolError::BudgetExceeded(oom)) => {
                anyhow::Error::new(OverBudget::new(oom, self.pool.budget(), rows, cols))
            }
            _ => anyhow::Error::new(error)
                .context(format!("a {rows} x {cols} f32 tensor from the pool")),
        }
    }
}

/// What a checkpoint node's graph is here: the layer or block whose tensors it keeps.
#[derive(Debug)]
pub struct Segment {
    /// The layer (MLP) or block (GPT).
    pub node: usize,
}

/// A step's checkpoint chain on the pool.
pub type Chain = Option<Arc<CheckpointNode<Segment, usize, usize>>>;

impl Backend for PoolBackend {
    type Buf = Tensor;
    type Saved = Arc<RetainedValue>;
    type Chain = Chain;

    fn span(&self, name: &'static str) -> Option<SpanGuard<'_>> {
        Some(self.pool.trace_span(name))
    }

    fn zeros(&self, rows: usize, cols: usize) -> anyhow::Result<Tensor> {
        Tensor::zeros_in(&self.pool, DType::F32, &[rows, cols])
            .map_err(|error| self.refused(error, rows, cols))
    }
    unsafe fn written(
        &self,
        rows: usize,
        cols: usize,
        init: impl FnOnce(&mut [MaybeUninit<f32>]),
    ) -> anyhow::Result<Tensor> {
        let mut tensor = Tensor::uninit_in::<f32>(&self.pool, &[rows, cols])
            .map_err(|error| self.refused(error, rows, cols))?;
        init(tensor.as_uninit_mut());
        // SAFETY: the caller's contract: `init` wrote every element.
        Ok(unsafe { tensor.assume_init() })
    }
    fn slice(buf: &Tensor) -> &[f32] {
        // Every tensor of this backend is f32 (`zeros`): a dtype mismatch is a bug here.
        buf.as_slice().expect("f32 tensor")
    }
    fn slice_mut(buf: &mut Tensor) -> &mut [f32] {
        buf.as_mut_slice().expect("f32 tensor")
    }
    fn save(&self, buf: Tensor) -> anyhow::Result<Arc<RetainedValue>> {
        RetainedValue::from_tensor_value(TensorValue::from_tensor(buf))
            .map(Arc::new)
            .map_err(|e| anyhow!("retaining a checkpoint: {e}"))
    }
    fn save_recomputable(
        &self,
        buf: Tensor,
        inputs: &[&Arc<RetainedValue>],
        kind: Kind,
        cost: u64,
        kernel: Kernel,
    ) -> anyhow::Result<Arc<RetainedValue>> {
        let shape = buf.shape().to_vec();
        let pool = self.pool.clone();
        let kept = inputs.iter().map(|input| (***input).clone());
        let recompute = Recompute::new(kept, move |inputs| {
            let inputs = inputs
                .iter()
                .map(|input| input.as_slice::<f32>())
                .collect::<Result<Vec<_>, _>>()?;
            if kernel.is_zeros() {
                // A dry run: zeros that the pool may have already, untouched.
                return Ok(Tensor::zeros_in(&pool, DType::F32, &shape)?);
            }
            let started = Instant::now();
            let mut out = Tensor::uninit_in::<f32>(&pool, &shape)?;
            kernel.run(&inputs, out.as_uninit_mut());
            // SAFETY: a layer's kernel writes every element of its output.
            let out = unsafe { out.assume_init() };
            let ns = started.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
            let bytes = out.numel() * std::mem::size_of::<f32>();
            recomputes::count(kind, bytes as u64, ns);
            Ok(out)
        })
        .with_cost(cost);
        RetainedValue::evictable(&self.pool, buf, recompute)
            .map(Arc::new)
            .map_err(|e| anyhow!("retaining a kernel's output: {e}"))
    }
    fn with_saved<R>(
        saved: &Arc<RetainedValue>,
        f: impl FnOnce(&[f32]) -> anyhow::Result<R>,
    ) -> anyhow::Result<R> {
        // A guard: an evictable value is pinned while `f` runs, and only then.
        let read = saved.read().map_err(|error| match error {
            // A recompute the budget refused: the pool's own error, typed for the caller.
            Error::Tensor(TensorError::Pool(PoolError::BudgetExceeded(oom))) => {
                anyhow::Error::new(OverBudget::new(&oom, oom.budget, 0, 0))
            }
            error => anyhow!("reading a checkpoint: {error}"),
        })?;
        f(read
            .tensor()
            .as_slice()
            .map_err(|e| anyhow!("reading a checkpoint: {e}"))?)
    }
    fn push_checkpoint(
        &self,
        chain: &mut Chain,
        node: usize,
        entries: impl IntoIterator<Item = (usize, Arc<RetainedValue>)>,
    ) {
        let mut inputs = RetainedInputMap::new();
        for (key, saved) in entries {
            inputs.insert(key, saved);
        }
        *chain = Some(CheckpointNode::push(
            chain.take(),
            Arc::new(Segment { node }),
            node,
            node,
            Arc::new(inputs),
        ));
    }
    fn checkpoint(chain: &Chain, key: usize) -> anyhow::Result<Arc<RetainedValue>> {
        let missing = || anyhow!("no tensor {key} on the step's chain");
        let head = chain.as_ref().ok_or_else(missing)?;
        head.lookup_input(&key).cloned().ok_or_else(missing)
    }
    fn pop_checkpoint(chain: &mut Chain, node: usize) {
        debug_assert!(chain.as_ref().is_some_and(|head| head.graph.node == node));
        *chain = chain.take().and_then(CheckpointNode::pop);
    }
}

/// A tensor the pool refused for its budget, with nothing left to evict: the budget, the
/// tensor, what was in use, and so what the run needed at least at that point.
#[derive(Debug, Clone)]
pub struct OverBudget {
    /// The budget.
    pub budget: u64,
    /// What the run needed at that point: the bytes in use and the block refused.
    pub needed: u64,
    /// The tensor refused, for messages.
    tensor: String,
    /// Its block's bytes, and what was in use then.
    block: u64,
    in_use: u64,
}

impl OverBudget {
    /// The refusal of a `rows x cols` tensor (0 x 0: one being recomputed) that `oom` reports.
    fn new(oom: &OutOfMemory, budget: Option<u64>, rows: usize, cols: usize) -> Self {
        let budget = oom.budget.or(budget).unwrap_or(u64::MAX);
        let needed = oom.in_use.saturating_add(oom.block_bytes as u64);
        let tensor = if rows == 0 {
            "recomputed".to_owned()
        } else {
            format!("{rows} x {cols} f32")
        };
        Self {
            budget,
            needed,
            tensor,
            block: oom.block_bytes as u64,
            in_use: oom.in_use,
        }
    }

    /// The message for a run whose `--budget` set `outside` bytes aside for what stays
    /// outside the training's pool (the pool got the rest: [`budget`](Self::budget)).
    pub fn message(&self, outside: u64) -> String {
        self.message_of(self.budget.saturating_add(outside), outside)
    }

    /// [`message`](Self::message) for a run of `--budget given` (the pool got `given -
    /// outside`, or nothing when `outside` is more).
    pub fn message_of(&self, given: u64, outside: u64) -> String {
        let share = match outside {
            0 => String::new(),
            _ => format!(
                " ({:.2} for the training's pool after {:.2} set aside for what stays outside \
                 it: the products' panel, the threads' tiles and scratch, small allocations)",
                bytes(self.budget),
                bytes(outside)
            ),
        };
        format!(
            "--budget {:.2}{share} cannot hold this run: a {:.2} tensor ({}) was refused with \
             {:.2} in use: the run needed at least {:.2} at that point. Raise --budget (a run \
             without it prints its peak reserved bytes), or lower --batch or the model's size.",
            bytes(given),
            bytes(self.block),
            self.tensor,
            bytes(self.in_use),
            bytes(self.needed.saturating_add(outside)),
        )
    }
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message(0))
    }
}

impl std::error::Error for OverBudget {}

/// Plain `Vec<f32>` from the global allocator; checkpoints in a map.
#[derive(Debug)]
pub struct VecBackend;

impl Backend for VecBackend {
    type Buf = Vec<f32>;
    type Saved = Arc<Vec<f32>>;
    type Chain = Vec<(usize, HashMap<usize, Arc<Vec<f32>>>)>;

    fn zeros(&self, rows: usize, cols: usize) -> anyhow::Result<Vec<f32>> {
        let (mut values, len) = empty_vec(rows, cols)?;
        values.resize(len, 0.0);
        Ok(values)
    }
    unsafe fn written(
        &self,
        rows: usize,
        cols: usize,
        init: impl FnOnce(&mut [MaybeUninit<f32>]),
    ) -> anyhow::Result<Vec<f32>> {
        let (mut values, len) = empty_vec(rows, cols)?;
        init(&mut values.spare_capacity_mut()[..len]);
        // SAFETY: the caller's contract: `init` wrote the first `len` elements.
        unsafe { values.set_len(len) };
        Ok(values)
    }
    fn slice(buf: &Vec<f32>) -> &[f32] {
        buf
    }
    fn slice_mut(buf: &mut Vec<f32>) -> &mut [f32] {
        buf
    }
    fn save(&self, buf: Vec<f32>) -> anyhow::Result<Arc<Vec<f32>>> {
        Ok(Arc::new(buf))
    }
    fn save_recomputable(
        &self,
        buf: Vec<f32>,
        _inputs: &[&Arc<Vec<f32>>],
        _kind: Kind,
        _cost: u64,
        _kernel: Kernel,
    ) -> anyhow::Result<Arc<Vec<f32>>> {
        self.save(buf)
    }
    fn with_saved<R>(
        saved: &Arc<Vec<f32>>,
        f: impl FnOnce(&[f32]) -> anyhow::Result<R>,
    ) -> anyhow::Result<R> {
        f(saved)
    }
    fn push_checkpoint(
        &self,
        chain: &mut Self::Chain,
        node: usize,
        entries: impl IntoIterator<Item = (usize, Arc<Vec<f32>>)>,
    ) {
        chain.push((node, entries.into_iter().collect()));
    }
    fn checkpoint(chain: &Self::Chain, key: usize) -> anyhow::Result<Arc<Vec<f32>>> {
        chain
            .iter()
            .rev()
            .find_map(|(_, entries)| entries.get(&key).cloned())
            .ok_or_else(|| anyhow!("no tensor {key} on the step's chain"))
    }
    fn pop_checkpoint(chain: &mut Self::Chain, node: usize) {
        debug_assert!(chain.last().is_some_and(|(last, _)| *last == node));
        chain.pop();
    }
}

/// An empty `Vec` with room for `rows x cols` elements, and that count; an error if the count
/// overflows or the allocator refuses.
fn empty_vec(rows: usize, cols: usize) -> anyhow::Result<(Vec<f32>, usize)> {
    let len = rows
        .checked_mul(cols)
        .ok_or_else(|| anyhow!("a {rows} x {cols} buffer overflows"))?;
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|e| anyhow!("a {rows} x {cols} f32 buffer: {e}"))?;
    Ok((values, len))
}

#[cfg(test)]
mod tests {
    use super::{Backend, VecBackend};

    #[test]
    fn vec_buffers_refuse_counts_that_overflow_or_cannot_be_held() {
        let backend = VecBackend;
        assert!(backend.zeros(usize::MAX, 2).is_err());
        assert!(backend.zeros(usize::MAX / 4, 1).is_err()); // more bytes than isize::MAX
                                                            // SAFETY: the closure is never called (the request is refused first).
        assert!(unsafe { backend.written(usize::MAX, 3, |_| unreachable!()) }.is_err());
        assert_eq!(backend.zeros(3, 2).unwrap(), vec![0.0; 6]);
    }
}
