//! Loom model of checkpoint chains shared between threads.
//!
//! Two heads share the older part of a chain; each is read and dropped on its own thread.
//! The iterative drop must unlink exactly the nodes its thread owns alone and leave the shared
//! part to whoever drops it last: every node is dropped once, and the retained tensor's
//! buffer goes back to the pool exactly once. Thread caches are off (see `retain.rs`).
#![cfg(loom)]

mod common;

use loom::sync::Arc;
use loom::thread;

use ferropool::{BufferPool, CheckpointNode, PoolConfig, RetainedInputMap, RetainedValue, Tensor};

type Node = CheckpointNode<u32, u32, u32>;

fn node(graph: u32, prev: Option<Arc<Node>>, value: &Arc<RetainedValue>) -> Arc<Node> {
    let mut inputs = RetainedInputMap::new();
    inputs.insert(0, Arc::clone(value));
    Arc::new(CheckpointNode {
        graph: Arc::new(graph),
        alias_key: graph,
        alias_target: graph,
        old_inputs: Arc::new(inputs),
        prev,
    })
}

/// **shared chains dropped on two threads**: heads `left` and `right` share two older nodes;
/// one thread reads and drops `left` while the other drops `right`. The shared nodes are
/// dropped once, by whichever thread drops last, and the retained buffer returns once.
///
/// Planted bug caught: `chain_drop_leaks` (a drop that meets a shared node forgets its
/// reference instead of releasing it: the shared part, and its buffer, are never freed).
#[test]
fn shared_chains_dropped_on_two_threads() {
    common::model(20_000, || {
        let pool = BufferPool::with_config(PoolConfig {
            thread_cache_bytes: 0,
            ..PoolConfig::default()
        })
        .unwrap();
        let value = Arc::new(RetainedValue::from_tensor(
            Tensor::from_slice_in(&pool, &[1.0f32], &[1]).unwrap(),
        ));
        let base = node(0, Some(node(1, None, &value)), &value);
        let left = node(2, Some(Arc::clone(&base)), &value);
        let right = node(3, Some(base), &value);
        drop(value);
        let other = thread::spawn(move || {
            assert_eq!(left.depth(), 3);
            assert_eq!(left.collect_inputs().len(), 1);
            drop(left);
        });
        assert_eq!(right.lookup_alias(&1), Some(&1));
        drop(right);
        other.join().unwrap();
        let stats = pool.stats();
        assert_eq!(
            stats.frees, 1,
            "the retained buffer is returned exactly once"
        );
        assert_eq!(stats.in_use_bytes, 0);
    });
}
