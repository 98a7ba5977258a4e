//! Where a step's tensors live: pooled tensors, groups and retained values on a checkpoint
//! chain ([`PoolBackend`]), or plain `Vec<f32>` in a map ([`VecBackend`]), the baseline a user
//! would write.

use std::collections::HashMap;
use std::sync::Arc;

use ferropool::{BufferPool, CheckpointNode, DType, RetainedInputMap, RetainedValue, Tensor};

/// Storage for one training step.
pub trait Backend: Sync {
    /// An owned `rows x cols` f32 buffer.
    type Buf: Send + Sync;
    /// A retained (checkpointed) activation.
    type Saved: Clone + Send + Sync;
    /// The checkpoint chain of one step.
    type Chain: Default + Send + Sync;

    /// A buffer of zeros.
    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Buf, String>;
    /// The elements.
    fn slice(buf: &Self::Buf) -> &[f32];
    /// The elements, for writing.
    fn slice_mut(buf: &mut Self::Buf) -> &mut [f32];
    /// Keeps a buffer for the backward pass.
    fn save(&self, buf: Self::Buf) -> Self::Saved;
    /// Reads a kept buffer.
    fn with_saved<R>(saved: &Self::Saved, f: impl FnOnce(&[f32]) -> R) -> R;
    /// Puts a kept layer input on the chain.
    fn push_checkpoint(&self, chain: &mut Self::Chain, layer: usize, saved: Self::Saved);
    /// The kept input of `layer`.
    fn checkpoint(chain: &Self::Chain, layer: usize) -> Self::Saved;
}

/// Tensors from a pool; checkpoints are `RetainedValue`s on a `CheckpointNode` chain.
#[derive(Debug)]
pub struct PoolBackend {
    /// The pool.
    pub pool: &'static BufferPool,
}

/// What a checkpoint node's graph is here: the layer its retained input feeds.
#[derive(Debug)]
pub struct Segment {
    /// The first layer of the segment.
    pub first_layer: usize,
}

/// A step's checkpoint chain on the pool.
pub type Chain = Option<Arc<CheckpointNode<Segment, usize, usize>>>;

impl Backend for PoolBackend {
    type Buf = Tensor;
    type Saved = Arc<RetainedValue>;
    type Chain = Chain;

    fn zeros(&self, rows: usize, cols: usize) -> Result<Tensor, String> {
        Tensor::zeros_in(self.pool, DType::F32, &[rows, cols]).map_err(|e| e.to_string())
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
        *chain = Some(CheckpointNode::push(
            chain.take(),
            Arc::new(Segment { first_layer: layer }),
            layer,
            layer,
            Arc::new(inputs),
        ));
    }
    fn checkpoint(chain: &Chain, layer: usize) -> Arc<RetainedValue> {
        let head = chain.as_ref().expect("a chain");
        debug_assert!(head.iter().any(|node| node.graph.first_layer == layer));
        Arc::clone(head.lookup_input(&layer).expect("checkpointed layer"))
    }
}

/// Plain `Vec<f32>` from the global allocator; checkpoints in a map.
#[derive(Debug)]
pub struct VecBackend;

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
