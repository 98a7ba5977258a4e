//! Retained reads against `Arc<[f32]>`, and checkpoint-chain collectors and merge against the
//! runtime's reference algorithms (re-implemented here exactly as the runtime has them).
#![allow(missing_docs)] // criterion's macros generate undocumented items

use std::collections::HashMap;
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use common::run_threads;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use ferropool::{CheckpointNode, RetainedInputMap, RetainedValue, Tensor};

type Node = CheckpointNode<u64, u32, u64>;

fn retained_reads(c: &mut Criterion) {
    let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let retained = RetainedValue::from_tensor(Tensor::from_slice(&data, &[16]).unwrap());
    let arc: Arc<[f32]> = data.clone().into();
    // 16 threads on a machine with fewer cores show oversubscription, not scaling.
    for threads in [1usize, 2, 16] {
        let mut group = c.benchmark_group(format!("retained_read_{threads}t"));
        group.bench_function(BenchmarkId::from_parameter("ferropool"), |b| {
            b.iter_custom(|iters| {
                run_threads(threads, iters, &|_, n| {
                    for _ in 0..n {
                        let handle = black_box(&retained).clone();
                        let read = handle.tensor_read().unwrap();
                        let sum: f32 = read.as_slice::<f32>().unwrap().iter().sum();
                        black_box(sum);
                    }
                })
            })
        });
        group.bench_function(BenchmarkId::from_parameter("arc_slice"), |b| {
            b.iter_custom(|iters| {
                run_threads(threads, iters, &|_, n| {
                    for _ in 0..n {
                        let handle = Arc::clone(black_box(&arc));
                        let sum: f32 = handle.iter().sum();
                        black_box(sum);
                    }
                })
            })
        });
        group.finish();
    }
}

/// A chain of `depth` nodes; keys repeat every 7 nodes, each node retains 4 inputs.
fn chain(depth: usize, values: &[Arc<RetainedValue>]) -> Arc<Node> {
    let mut head: Option<Arc<Node>> = None;
    for i in 0..depth {
        let inputs: RetainedInputMap<u32> = (0..4u32)
            .map(|k| ((i as u32 * 4 + k) % 64, Arc::clone(&values[k as usize])))
            .collect();
        head = Some(Arc::new(CheckpointNode {
            graph: Arc::new(i as u64),
            alias_key: (i % 7) as u32,
            alias_target: i as u64,
            old_inputs: Arc::new(inputs),
            prev: head,
        }));
    }
    head.unwrap()
}

// ---- the reference algorithms, verbatim in behaviour ----------------------------------------

fn reference_collect_aliases(head: &Node) -> HashMap<u32, u64> {
    let mut aliases = HashMap::new();
    let mut current: Option<&Node> = Some(head);
    while let Some(node) = current {
        aliases.insert(node.alias_key, node.alias_target);
        current = node.prev.as_deref();
    }
    aliases
}

fn reference_collect_graphs(head: &Node) -> Vec<Arc<u64>> {
    let mut graphs = Vec::new();
    let mut current: Option<&Node> = Some(head);
    while let Some(node) = current {
        graphs.push(node.graph.clone());
        current = node.prev.as_deref();
    }
    graphs
}

fn reference_collect_inputs(head: &Node) -> RetainedInputMap<u32> {
    let mut inputs = HashMap::new();
    let mut current: Option<&Node> = Some(head);
    while let Some(node) = current {
        inputs.extend(node.old_inputs.iter().map(|(k, v)| (*k, v.clone())));
        current = node.prev.as_deref();
    }
    inputs
}

fn reference_merge(lhs: Option<Arc<Node>>, rhs: Option<Arc<Node>>) -> Option<Arc<Node>> {
    match (lhs, rhs) {
        (None, rhs) => rhs,
        (lhs, None) => lhs,
        (Some(lhs_head), Some(rhs_head)) => {
            let mut nodes: Vec<&Node> = Vec::new();
            let mut current: Option<&Node> = Some(&lhs_head);
            while let Some(node) = current {
                nodes.push(node);
                current = node.prev.as_deref();
            }
            let mut prev = Some(rhs_head);
            for node in nodes.into_iter().rev() {
                prev = Some(Arc::new(CheckpointNode {
                    graph: node.graph.clone(),
                    alias_key: node.alias_key,
                    alias_target: node.alias_target,
                    old_inputs: Arc::clone(&node.old_inputs),
                    prev,
                }));
            }
            prev
        }
    }
}

fn checkpoint_chains(c: &mut Criterion) {
    let values: Vec<Arc<RetainedValue>> = (0..4)
        .map(|i| {
            Arc::new(RetainedValue::from_tensor(
                Tensor::from_slice(&[i as f32], &[1]).unwrap(),
            ))
        })
        .collect();
    for depth in [10usize, 1000, 100_000] {
        let head = chain(depth, &values);
        // Same results, or the comparison is meaningless.
        assert_eq!(head.collect_aliases(), reference_collect_aliases(&head));
        assert_eq!(
            head.collect_inputs().len(),
            reference_collect_inputs(&head).len()
        );
        let mut group = c.benchmark_group(format!("chain_{depth}"));
        if depth >= 100_000 {
            group.sample_size(10);
        }
        group.bench_function("collect_aliases/ferropool", |b| {
            b.iter(|| black_box(head.collect_aliases()))
        });
        group.bench_function("collect_aliases/reference", |b| {
            b.iter(|| black_box(reference_collect_aliases(&head)))
        });
        group.bench_function("lookup_alias/ferropool", |b| {
            b.iter(|| black_box(head.lookup_alias(&3).copied()))
        });
        group.bench_function("lookup_alias/reference_collect_then_get", |b| {
            b.iter(|| black_box(reference_collect_aliases(&head).get(&3).copied()))
        });
        group.bench_function("collect_graphs/ferropool", |b| {
            b.iter(|| black_box(head.collect_graphs()))
        });
        group.bench_function("collect_graphs/reference", |b| {
            b.iter(|| black_box(reference_collect_graphs(&head)))
        });
        group.bench_function("collect_inputs/ferropool", |b| {
            b.iter(|| black_box(head.collect_inputs()))
        });
        group.bench_function("collect_inputs/reference", |b| {
            b.iter(|| black_box(reference_collect_inputs(&head)))
        });
        let rhs = chain(depth, &values);
        group.bench_function("merge_unique_lhs/ferropool", |b| {
            b.iter_batched(
                || chain(depth, &values),
                |lhs| Node::merge_chains(Some(lhs), Some(Arc::clone(&rhs))),
                BatchSize::PerIteration,
            )
        });
        group.bench_function("merge_unique_lhs/reference", |b| {
            b.iter_batched(
                || chain(depth, &values),
                |lhs| reference_merge(Some(lhs), Some(Arc::clone(&rhs))),
                BatchSize::PerIteration,
            )
        });
        group.bench_function("merge_shared_lhs/ferropool", |b| {
            b.iter(|| Node::merge_chains(Some(Arc::clone(&head)), Some(Arc::clone(&rhs))))
        });
        group.bench_function("merge_shared_lhs/reference", |b| {
            b.iter(|| reference_merge(Some(Arc::clone(&head)), Some(Arc::clone(&rhs))))
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = retained_reads, checkpoint_chains
}
criterion_main!(benches);
