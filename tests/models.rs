//! Property tests against reference models: the pool's counters, group views against a
//! reference copy, and checkpoint chains against the runtime's reference algorithms.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use ferropool::{
    AllocationGroup, BufferPool, CheckpointNode, PoolConfig, PoolError, RetainedValue, Tensor,
};
use proptest::prelude::*;

fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: if cfg!(miri) { 2 } else { n },
        ..ProptestConfig::default()
    }
}

// ---- the pool -----------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum PoolOp {
    Alloc(usize),
    Zeroed(usize),
    Free(usize),
    Trim,
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    prop_oneof![
        4 => (1usize..300_000).prop_map(PoolOp::Alloc),
        1 => (1usize..100_000).prop_map(PoolOp::Zeroed),
        4 => any::<usize>().prop_map(PoolOp::Free),
        1 => Just(PoolOp::Trim),
    ]
}

proptest! {
    #![proptest_config(cases(64))]

    /// After every operation: in use + cached == reserved, reserved never exceeds the budget,
    /// in-use bytes equal the model's live blocks, and zeroed buffers read zeros. At the end
    /// every buffer is returned and a trim releases everything.
    #[test]
    fn pool_counters_add_up(
        ops in proptest::collection::vec(pool_op(), 1..120),
        budget in prop_oneof![Just(None), (1u64 << 20..8 << 20).prop_map(Some)],
    ) {
        let pool = BufferPool::with_config(PoolConfig { budget, ..PoolConfig::default() }).unwrap();
        let mut live: Vec<ferropool::PoolBuffer> = Vec::new();
        for op in ops {
            match op {
                PoolOp::Alloc(size) | PoolOp::Zeroed(size) => {
                    let zeroed = matches!(op, PoolOp::Zeroed(_));
                    let result = if zeroed { pool.alloc_zeroed(size) } else { pool.alloc(size) };
                    match result {
                        Ok(mut buffer) => {
                            if zeroed {
                                prop_assert!(buffer.as_bytes().unwrap().iter().all(|&b| b == 0));
                            }
                            buffer.fill(0xA5);
                            live.push(buffer);
                        }
                        Err(PoolError::BudgetExceeded(report)) => prop_assert_eq!(report.budget, budget),
                        Err(other) => prop_assert!(false, "unexpected {other}"),
                    }
                }
                PoolOp::Free(i) if !live.is_empty() => {
                    let k = i % live.len();
                    live.swap_remove(k);
                }
                PoolOp::Trim => { pool.trim(); }
                PoolOp::Free(_) => {}
            }
            let stats = pool.stats();
            common::assert_pool_consistent(&stats);
            prop_assert_eq!(stats.in_use_bytes, live.iter().map(|b| b.capacity() as u64).sum::<u64>());
            prop_assert_eq!(stats.requested_bytes, live.iter().map(|b| b.len() as u64).sum::<u64>());
            if let Some(budget) = budget {
                prop_assert!(stats.peak_reserved_bytes <= budget);
            }
        }
        live.clear();
        let stats = pool.stats();
        prop_assert_eq!(stats.in_use_bytes, 0);
        prop_assert_eq!(stats.allocations, stats.frees);
        pool.trim();
        prop_assert_eq!(pool.stats().reserved_bytes, 0);
    }
}

// ---- group views --------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum ViewOp {
    Permute(Vec<usize>),
    Narrow {
        axis: usize,
        start: usize,
        len: usize,
    },
    Reshape,
}

fn view_ops() -> impl Strategy<Value = Vec<ViewOp>> {
    proptest::collection::vec(
        prop_oneof![
            Just(ViewOp::Permute(vec![1, 0, 2])),
            Just(ViewOp::Permute(vec![2, 1, 0])),
            Just(ViewOp::Permute(vec![0, 2, 1])),
            (0usize..3, 0usize..4, 1usize..4).prop_map(|(axis, start, len)| ViewOp::Narrow {
                axis,
                start,
                len
            }),
            Just(ViewOp::Reshape),
        ],
        1..6,
    )
}

/// The reference: a dense copy with explicit index arithmetic.
#[derive(Clone, Debug)]
struct Dense {
    shape: Vec<usize>,
    data: Vec<i64>,
}

impl Dense {
    fn at(&self, index: &[usize]) -> i64 {
        let mut offset = 0;
        for (i, d) in index.iter().zip(&self.shape) {
            offset = offset * d + i;
        }
        self.data[offset]
    }

    fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
        let mut all = vec![vec![]];
        for &d in shape {
            all = all
                .into_iter()
                .flat_map(|p| {
                    (0..d).map(move |i| {
                        let mut q = p.clone();
                        q.push(i);
                        q
                    })
                })
                .collect();
        }
        all
    }

    fn apply(&self, op: &ViewOp) -> Option<Dense> {
        match op {
            ViewOp::Permute(axes) => {
                let shape: Vec<usize> = axes.iter().map(|&a| self.shape[a]).collect();
                let data = Self::indices(&shape)
                    .iter()
                    .map(|idx| {
                        let mut src = vec![0; idx.len()];
                        for (k, &a) in axes.iter().enumerate() {
                            src[a] = idx[k];
                        }
                        self.at(&src)
                    })
                    .collect();
                Some(Dense { shape, data })
            }
            ViewOp::Narrow { axis, start, len } => {
                if start + len > self.shape[*axis] {
                    return None;
                }
                let mut shape = self.shape.clone();
                shape[*axis] = *len;
                let data = Self::indices(&shape)
                    .iter()
                    .map(|idx| {
                        let mut src = idx.clone();
                        src[*axis] += start;
                        self.at(&src)
                    })
                    .collect();
                Some(Dense { shape, data })
            }
            ViewOp::Reshape => Some(Dense {
                shape: vec![self.data.len()],
                data: self.data.clone(),
            }),
        }
    }
}

proptest! {
    #![proptest_config(cases(128))]

    /// A chain of views (permute, narrow, reshape) reads exactly what the same operations
    /// give on a dense reference copy; a reshape of a non-contiguous view is refused.
    #[test]
    fn group_views_read_like_a_reference_copy(ops in view_ops()) {
        let shape = [3usize, 4, 5];
        let data: Vec<i64> = (0..60).collect();
        let tensor = Tensor::from_slice(&data, &shape).unwrap();
        let (mut group, slots) = AllocationGroup::from_tensors([tensor]).unwrap();
        let mut slot = slots[0];
        let mut reference = Dense { shape: shape.to_vec(), data };
        for op in &ops {
            let rank = reference.shape.len();
            let result = match op {
                ViewOp::Permute(axes) if axes.len() == rank => group.permute(slot, axes),
                ViewOp::Narrow { axis, start, len } if *axis < rank => group.narrow(slot, *axis, *start, *len),
                ViewOp::Reshape => group.reshape(slot, &[reference.data.len()]),
                _ => continue,
            };
            let view = group.read_view(slot).unwrap();
            let contiguous = view.is_contiguous();
            match (result, reference.apply(op)) {
                (Ok(next), Some(expected)) => {
                    slot = next;
                    reference = expected;
                    let got = group.read_view(slot).unwrap();
                    prop_assert_eq!(got.shape(), &reference.shape[..]);
                    prop_assert_eq!(got.to_vec::<i64>().unwrap(), reference.data.clone());
                }
                (Err(_), None) => {}
                (Err(_), Some(_)) if matches!(op, ViewOp::Reshape) && !contiguous => {}
                (got, want) => prop_assert!(false, "{:?}: got {:?}, reference {:?}", op, got.map(|_| ()), want.map(|d| d.shape)),
            }
        }
    }
}

// ---- checkpoint chains against the reference ----------------------------------------------------

type Node = CheckpointNode<u32, u8, u32>;

fn reference_collect_aliases(head: &Node) -> HashMap<u8, u32> {
    let mut aliases = HashMap::new();
    let mut current = Some(head);
    while let Some(node) = current {
        aliases.insert(node.alias_key, node.alias_target);
        current = node.prev.as_deref();
    }
    aliases
}

fn reference_collect_inputs(head: &Node) -> HashMap<u8, usize> {
    let mut inputs = HashMap::new();
    let mut current = Some(head);
    while let Some(node) = current {
        inputs.extend(
            node.old_inputs
                .iter()
                .map(|(k, v)| (*k, Arc::as_ptr(v) as usize)),
        );
        current = node.prev.as_deref();
    }
    inputs
}

fn reference_graphs(head: &Node) -> Vec<u32> {
    let mut graphs = Vec::new();
    let mut current = Some(head);
    while let Some(node) = current {
        graphs.push(*node.graph);
        current = node.prev.as_deref();
    }
    graphs
}

/// Builds a chain from (graph, alias key, alias target, input keys), oldest first.
fn build(spec: &[(u32, u8, u32, Vec<u8>)], values: &[Arc<RetainedValue>]) -> Option<Arc<Node>> {
    let mut head = None;
    for (graph, key, target, inputs) in spec {
        head = Some(Arc::new(CheckpointNode {
            graph: Arc::new(*graph),
            alias_key: *key,
            alias_target: *target,
            old_inputs: Arc::new(
                inputs
                    .iter()
                    .map(|&k| (k, Arc::clone(&values[k as usize % values.len()])))
                    .collect(),
            ),
            prev: head,
        }));
    }
    head
}

fn chain_spec() -> impl Strategy<Value = Vec<(u32, u8, u32, Vec<u8>)>> {
    proptest::collection::vec(
        (
            any::<u32>(),
            0u8..6,
            any::<u32>(),
            proptest::collection::vec(0u8..8, 0..4),
        ),
        0..12,
    )
}

proptest! {
    #![proptest_config(cases(256))]

    /// Collectors and merge agree with the reference algorithms on random chains with repeated
    /// keys, whether the merged lhs is owned by the caller or shared.
    #[test]
    fn chains_agree_with_the_reference(lhs in chain_spec(), rhs in chain_spec(), share_lhs in any::<bool>()) {
        let values: Vec<Arc<RetainedValue>> = (0..8)
            .map(|i| Arc::new(RetainedValue::from_tensor(Tensor::from_slice(&[i as f32], &[1]).unwrap())))
            .collect();
        let l = build(&lhs, &values);
        let r = build(&rhs, &values);
        for head in l.iter().chain(r.iter()) {
            prop_assert_eq!(head.collect_aliases(), reference_collect_aliases(head));
            let ours: HashMap<u8, usize> = head.collect_inputs().iter().map(|(k, v)| (*k, Arc::as_ptr(v) as usize)).collect();
            prop_assert_eq!(ours, reference_collect_inputs(head));
            prop_assert_eq!(head.collect_graphs().iter().map(|g| **g).collect::<Vec<_>>(), reference_graphs(head));
            for key in 0u8..6 {
                prop_assert_eq!(head.lookup_alias(&key).copied(), reference_collect_aliases(head).get(&key).copied());
            }
        }
        // The reference merge result, computed on copies of the specs (lhs on top of rhs).
        let expected = build(&rhs.iter().chain(lhs.iter()).cloned().collect::<Vec<_>>(), &values);
        let keep = if share_lhs { l.clone() } else { None };
        let merged = Node::merge_chains(l, r);
        match (&merged, &expected) {
            (Some(m), Some(e)) => {
                prop_assert_eq!(reference_graphs(m), reference_graphs(e));
                prop_assert_eq!(reference_collect_aliases(m), reference_collect_aliases(e));
                prop_assert_eq!(reference_collect_inputs(m), reference_collect_inputs(e));
            }
            (None, None) => {}
            _ => prop_assert!(false, "merge emptiness differs"),
        }
        if let Some(kept) = keep {
            prop_assert_eq!(reference_graphs(&kept), lhs.iter().rev().map(|s| s.0).collect::<Vec<_>>(), "a shared lhs is left as it was");
        }
    }
}
