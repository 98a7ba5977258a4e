//! The surface the training runtime codes against (retained values, retention containers,
//! retained input maps and checkpoint chains, and what they use), tested through the public
//! API only, with the names the runtime uses.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use common::scaled;
use ferropool::{
    AllocationGroup, BufferPool, CheckpointNode, DType, ExternalPayload, GroupError, Layout,
    RetainedInputMap, RetainedValue, RetentionContainer, Tensor, TensorError, TensorValue,
};

/// A caller-owned scalar type whose drops are counted: it must go back to its owner (be
/// dropped) exactly once, and never enter a pool.
#[derive(Debug)]
struct Opaque {
    shape: Vec<usize>,
    label: &'static str,
    returned: Arc<AtomicUsize>,
}

impl ExternalPayload for Opaque {
    fn tag(&self) -> u32 {
        7
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

impl Drop for Opaque {
    fn drop(&mut self) {
        self.returned.fetch_add(1, Ordering::SeqCst);
    }
}

fn private_pool() -> BufferPool {
    BufferPool::new()
}

#[test]
fn pooled_values_are_retained_without_copies() {
    let pool = private_pool();
    let tensor = Tensor::from_slice_in(&pool, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let bytes_before = pool.stats().in_use_bytes;
    let retained = RetainedValue::from_tensor(tensor);
    assert_eq!(retained.dtype(), DType::F32);
    assert_eq!(retained.shape(), &[2, 3]);
    assert!(matches!(
        retained.container(),
        RetentionContainer::Pooled { .. }
    ));
    let clones: Vec<_> = (0..10).map(|_| retained.clone()).collect();
    assert_eq!(
        pool.stats().in_use_bytes,
        bytes_before,
        "clones copy no bytes"
    );
    {
        let read = clones[3].tensor_read().unwrap();
        assert_eq!(
            read.as_slice::<f32>().unwrap(),
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
    }
    let debug = format!("{retained:?}");
    assert!(
        debug.starts_with("RetainedValue { container: Pooled"),
        "{debug}"
    );
    assert!(
        debug.contains("dtype: F32") && debug.contains("shape: [2, 3]"),
        "{debug}"
    );
    drop((clones, retained));
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "the buffer went back to the pool");
    assert_eq!(
        pool.trim(),
        stats.cached_bytes,
        "a trim releases what is cached"
    );
    assert_eq!(pool.stats().reserved_bytes, 0);
}

#[test]
fn caller_owned_values_are_retained_as_is_and_returned() {
    let returned = Arc::new(AtomicUsize::new(0));
    let payload = Opaque {
        shape: vec![3],
        label: "tokenizer state",
        returned: Arc::clone(&returned),
    };
    let value = TensorValue::from_tensor(Tensor::external(payload).unwrap());
    let retained = RetainedValue::from_tensor_value(value).unwrap();
    assert_eq!(retained.dtype(), DType::External(7));
    assert_eq!(retained.shape(), &[3]);
    assert!(matches!(
        retained.container(),
        RetentionContainer::CallerOwned { .. }
    ));
    let copy = retained.clone();
    let read = copy.tensor_read().unwrap();
    assert_eq!(read.external::<Opaque>().unwrap().label, "tokenizer state");
    assert!(
        read.as_slice::<f32>().is_err(),
        "no typed slice of a payload"
    );
    drop(retained);
    assert_eq!(
        returned.load(Ordering::SeqCst),
        0,
        "a handle still holds it"
    );
    drop(copy);
    assert_eq!(
        returned.load(Ordering::SeqCst),
        1,
        "back to its owner exactly once"
    );
}

#[test]
fn try_into_group_parts_hands_a_payload_back_unchanged() {
    let returned = Arc::new(AtomicUsize::new(0));
    let value = TensorValue::from_tensor(
        Tensor::external(Opaque {
            shape: vec![1],
            label: "kept",
            returned: Arc::clone(&returned),
        })
        .unwrap(),
    );
    let back = value.try_into_group_parts().unwrap_err();
    let tensor = back.into_tensor().unwrap();
    assert_eq!(tensor.external_payload::<Opaque>().unwrap().label, "kept");
    assert_eq!(returned.load(Ordering::SeqCst), 0);
}

#[test]
fn many_threads_read_while_others_clone_and_drop() {
    let pool = private_pool();
    let values: Vec<RetainedValue> = (0..16)
        .map(|i| {
            let data: Vec<f32> = (0..64).map(|j| (i * 64 + j) as f32).collect();
            RetainedValue::from_tensor(Tensor::from_slice_in(&pool, &data, &[8, 8]).unwrap())
        })
        .collect();
    let values = Arc::new(values);
    let rounds = scaled(2_000);
    let start = Arc::new(Barrier::new(10));
    let readers: Vec<_> = (0..8)
        .map(|t| {
            let (values, start) = (Arc::clone(&values), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for r in 0..rounds {
                    let i = (r + t) % values.len();
                    let read = values[i].tensor_read().unwrap();
                    let slice = read.as_slice::<f32>().unwrap();
                    let expected: f32 = (0..64).map(|j| (i * 64 + j) as f32).sum();
                    assert_eq!(slice.iter().sum::<f32>(), expected);
                }
            })
        })
        .collect();
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let (values, start) = (Arc::clone(&values), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for r in 0..rounds {
                    let held: Vec<_> = values.iter().skip(r % 4).step_by(3).cloned().collect();
                    assert!(held.iter().all(|v| v.shape() == [8, 8]));
                }
            })
        })
        .collect();
    for thread in readers.into_iter().chain(churners) {
        thread.join().unwrap();
    }
    drop(values);
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0, "every buffer is back: {stats:?}");
    assert_eq!(stats.allocations, 16);
    assert_eq!(stats.frees, 16);
}

#[test]
fn several_descriptors_of_one_shared_group_are_retained_together() {
    let pool = private_pool();
    let weights = Tensor::from_slice_in(&pool, &[1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([weights]).unwrap();
    let row1 = group.narrow(slots[0], 0, 1, 1).unwrap();
    let transposed = group.permute(slots[0], &[1, 0]).unwrap();
    let a = RetainedValue::from_group(&group, row1).unwrap();
    let b = RetainedValue::from_group(&group, transposed).unwrap();
    assert_eq!(group.handles(), 3);
    // The group is shared now: changes are refused, reads are not.
    assert!(matches!(
        group.remove(row1),
        Err(GroupError::Shared { handles: 3 })
    ));
    assert_eq!(
        a.tensor_read().unwrap().to_vec::<i32>().unwrap(),
        vec![4, 5, 6]
    );
    assert_eq!(
        b.tensor_read().unwrap().to_vec::<i32>().unwrap(),
        vec![1, 4, 2, 5, 3, 6]
    );
    assert_eq!(b.tensor_read().unwrap().get::<i32>(&[2, 1]).unwrap(), 6);
    drop(group);
    drop(a);
    assert_eq!(
        pool.stats().in_use_bytes,
        24,
        "b still holds the 6 x i32 buffer"
    );
    drop(b);
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn group_operations_and_their_typed_errors() {
    let pool = private_pool();
    let t = Tensor::from_slice_in(&pool, &[1.0f64, 2.0, 3.0, 4.0], &[4]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let whole = slots[0];
    let square = group.reshape(whole, &[2, 2]).unwrap();
    // A view that reaches past the buffer is refused and changes nothing.
    let too_far = Layout::new(&[3], &[2], 0).unwrap();
    assert!(matches!(
        group.add_view(whole, too_far),
        Err(GroupError::Tensor(TensorError::OutOfBounds {
            needed: 5,
            available: 4
        }))
    ));
    assert_eq!(group.len(), 2);
    // Aliased: cannot extract while `square` views the same buffer.
    assert!(matches!(
        group.try_extract(whole),
        Err(GroupError::Aliased { aliases: 1 })
    ));
    // Writes go through the only handle.
    group
        .write_view(square)
        .unwrap()
        .set::<f64>(&[1, 1], 40.0)
        .unwrap();
    assert_eq!(
        group.read_view(whole).unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 2.0, 3.0, 40.0]
    );
    assert!(matches!(
        group.read_view(whole).unwrap().as_slice::<f32>(),
        Err(TensorError::DTypeMismatch {
            expected: DType::F32,
            found: DType::F64
        })
    ));
    group.remove(square).unwrap();
    assert!(
        matches!(group.read_view(square), Err(GroupError::Removed { .. })),
        "removed slot"
    );
    let extracted = group.try_extract(whole).unwrap();
    assert_eq!(extracted.as_slice::<f64>().unwrap(), &[1.0, 2.0, 3.0, 40.0]);
    assert!(group.is_empty());
    // A slot of another group is rejected.
    let (other, other_slots) =
        AllocationGroup::from_tensors([Tensor::from_slice_in(&pool, &[1u8], &[1]).unwrap()])
            .unwrap();
    assert!(matches!(
        group.read_view(other_slots[0]),
        Err(GroupError::ForeignSlot { .. })
    ));
    // A caller-owned payload cannot join a group.
    let returned = Arc::new(AtomicUsize::new(0));
    let payload = Tensor::external(Opaque {
        shape: vec![],
        label: "no",
        returned: Arc::clone(&returned),
    })
    .unwrap();
    assert!(matches!(
        group.append_tensor(payload),
        Err(GroupError::ExternalPayload {
            dtype: DType::External(7)
        })
    ));
    assert_eq!(
        returned.load(Ordering::SeqCst),
        1,
        "the payload went back to its owner"
    );
    drop((other, group, extracted));
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn into_tensor_copies_a_strided_view() {
    let pool = private_pool();
    let t = Tensor::from_slice_in(&pool, &[1u8, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let columns = group.permute(slots[0], &[1, 0]).unwrap();
    let copy = group.into_tensor(columns).unwrap();
    assert_eq!(copy.shape(), &[3, 2]);
    assert_eq!(copy.as_slice::<u8>().unwrap(), &[1, 4, 2, 5, 3, 6]);
    assert_eq!(group.len(), 1, "the view's descriptor was consumed");
}

#[test]
fn tensor_bad_input_is_typed() {
    let pool = private_pool();
    assert!(matches!(
        Tensor::from_slice_in(&pool, &[1.0f32; 5], &[2, 3]),
        Err(TensorError::ShapeMismatch {
            expected_elements: 6,
            found_elements: 5,
            ..
        })
    ));
    assert!(matches!(
        Tensor::zeros_in(&pool, DType::External(1), &[2]),
        Err(TensorError::ExternalDType { .. })
    ));
    assert!(matches!(
        Tensor::from_iter_in(&pool, 0..5i64, &[2, 2]),
        Err(TensorError::TooManyElements {
            expected_elements: 4,
            ..
        })
    ));
    let zeros = Tensor::zeros_in(&pool, DType::Bool, &[3]).unwrap();
    assert_eq!(zeros.as_slice::<bool>().unwrap(), &[false; 3]);
    let counted = Tensor::from_iter_in(&pool, 0..6i64, &[2, 3]).unwrap();
    assert_eq!(counted.as_slice::<i64>().unwrap()[5], 5);
    assert!(Layout::contiguous(&[usize::MAX, 2]).is_err());
    assert!(Layout::contiguous(&[2, 2])
        .unwrap()
        .permute(&[0, 0])
        .is_err());
    drop((zeros, counted));
    assert_eq!(
        pool.stats().in_use_bytes,
        0,
        "failed constructions leaked nothing"
    );
}

#[test]
fn a_retained_value_keeps_its_group_alive() {
    let t = Tensor::from_slice(&[1.0f32], &[1]).unwrap();
    let (group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let retained = RetainedValue::from_group(&group, slots[0]).unwrap();
    drop(group);
    // Still readable: the retained handle holds the group.
    assert_eq!(
        retained.tensor_read().unwrap().as_slice::<f32>().unwrap(),
        &[1.0]
    );
}

// ---- checkpoint chains --------------------------------------------------------------------

type Graph = String;
type Node = CheckpointNode<Graph, &'static str, u32>;

fn inputs(pairs: &[(&'static str, f32)]) -> Arc<RetainedInputMap<&'static str>> {
    Arc::new(
        pairs
            .iter()
            .map(|&(k, v)| {
                (
                    k,
                    Arc::new(RetainedValue::from_tensor(
                        Tensor::from_slice(&[v], &[1]).unwrap(),
                    )),
                )
            })
            .collect(),
    )
}

fn node(
    graph: &str,
    key: &'static str,
    target: u32,
    ins: &[(&'static str, f32)],
    prev: Option<Arc<Node>>,
) -> Arc<Node> {
    Arc::new(CheckpointNode {
        graph: Arc::new(graph.to_string()),
        alias_key: key,
        alias_target: target,
        old_inputs: inputs(ins),
        prev,
    })
}

fn value_of(v: &Arc<RetainedValue>) -> f32 {
    v.tensor_read().unwrap().as_slice::<f32>().unwrap()[0]
}

#[test]
fn collectors_walk_head_to_oldest_and_the_oldest_entry_wins() {
    // oldest -> newest: n1, n2, n3; keys "x" and "a" repeat.
    let n1 = node("g1", "x", 1, &[("a", 1.0), ("b", 1.0)], None);
    let n2 = node("g2", "y", 2, &[("a", 2.0)], Some(n1));
    let head = node("g3", "x", 3, &[("a", 3.0), ("c", 3.0)], Some(n2));

    let graphs: Vec<String> = head
        .collect_graphs()
        .iter()
        .map(|g| g.to_string())
        .collect();
    assert_eq!(graphs, ["g3", "g2", "g1"], "head first");

    let aliases = head.collect_aliases();
    assert_eq!(
        aliases,
        HashMap::from([("x", 1), ("y", 2)]),
        "oldest alias of x wins"
    );
    assert_eq!(head.lookup_alias(&"x"), Some(&1));
    assert_eq!(head.lookup_alias(&"z"), None);

    let collected = head.collect_inputs();
    let values: HashMap<_, _> = collected.iter().map(|(k, v)| (*k, value_of(v))).collect();
    assert_eq!(
        values,
        HashMap::from([("a", 1.0), ("b", 1.0), ("c", 3.0)]),
        "oldest a wins"
    );
    assert_eq!(head.lookup_input(&"a").map(value_of), Some(1.0));
    assert_eq!(head.depth(), 3);
    let debug = format!("{head:?}");
    assert!(
        debug.contains("old_inputs_len: 2") && debug.contains("has_prev: true"),
        "{debug}"
    );
}

#[test]
fn merge_puts_lhs_on_top_of_rhs_whether_or_not_lhs_is_shared() {
    let build = || {
        let r1 = node("r1", "k", 10, &[("a", 10.0)], None);
        let rhs = node("r2", "m", 20, &[], Some(r1));
        let l1 = node("l1", "k", 1, &[("a", 1.0)], None);
        let lhs = node("l2", "n", 2, &[], Some(l1));
        (lhs, rhs)
    };
    // Unique lhs: relinked in place.
    let (lhs, rhs) = build();
    let merged = Node::merge_chains(Some(lhs), Some(rhs)).unwrap();
    let graphs: Vec<String> = merged
        .collect_graphs()
        .iter()
        .map(|g| g.to_string())
        .collect();
    assert_eq!(graphs, ["l2", "l1", "r2", "r1"]);
    assert_eq!(
        merged.collect_aliases()["k"],
        10,
        "rhs is older: its k wins"
    );
    assert_eq!(value_of(&merged.collect_inputs()["a"]), 10.0);

    // Shared lhs: copied, and the original lhs chain is untouched.
    let (lhs, rhs) = build();
    let keep = Arc::clone(&lhs);
    let merged = Node::merge_chains(Some(lhs), Some(rhs)).unwrap();
    let graphs: Vec<String> = merged
        .collect_graphs()
        .iter()
        .map(|g| g.to_string())
        .collect();
    assert_eq!(graphs, ["l2", "l1", "r2", "r1"]);
    assert_eq!(keep.depth(), 2, "the shared lhs still ends at l1");
    assert_eq!(keep.collect_aliases()["k"], 1);

    // Empty sides.
    let (lhs, rhs) = build();
    assert!(Arc::ptr_eq(
        &Node::merge_chains(None, Some(Arc::clone(&rhs))).unwrap(),
        &rhs
    ));
    assert!(Arc::ptr_eq(
        &Node::merge_chains(Some(Arc::clone(&lhs)), None).unwrap(),
        &lhs
    ));
    assert!(Node::merge_chains(None, None).is_none());
}

#[test]
fn dropping_a_million_node_chain_does_not_recurse() {
    let depth = if cfg!(miri) { 1_000 } else { 1_000_000 };
    let empty = Arc::new(RetainedInputMap::new());
    let graph = Arc::new(String::from("g"));
    let mut head: Option<Arc<Node>> = None;
    for i in 0..depth {
        head = Some(Arc::new(CheckpointNode {
            graph: Arc::clone(&graph),
            alias_key: "k",
            alias_target: i as u32,
            old_inputs: Arc::clone(&empty),
            prev: head,
        }));
    }
    let head = head.unwrap();
    assert_eq!(head.depth(), depth);
    assert_eq!(head.lookup_alias(&"k"), Some(&0));
    // Run the drop on a thread with a small stack: a recursive drop would overflow it.
    std::thread::Builder::new()
        .stack_size(64 << 10)
        .spawn(move || drop(head))
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(Arc::strong_count(&graph), 1, "every node was dropped");
}

#[test]
fn layouts_of_any_rank_view_the_right_elements() {
    // Rank 5 keeps its dimensions on the heap, rank <= 4 inline; both must behave alike.
    let data: Vec<i32> = (0..2 * 3 * 2 * 2 * 2).collect();
    let t = Tensor::from_slice(&data, &[2, 3, 2, 2, 2]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let permuted = group.permute(slots[0], &[4, 3, 2, 1, 0]).unwrap();
    let view = group.read_view(permuted).unwrap();
    assert_eq!(view.shape(), &[2, 2, 2, 3, 2]);
    assert_eq!(view.strides(), &[1, 2, 4, 8, 24]);
    assert_eq!(
        view.get::<i32>(&[1, 0, 1, 2, 1]).unwrap(),
        24 + 2 * 8 + 4 + 1
    );
    let narrowed = group.narrow(permuted, 3, 1, 2).unwrap();
    let values = group.read_view(narrowed).unwrap().to_vec::<i32>().unwrap();
    assert_eq!(values.len(), 2 * 2 * 2 * 2 * 2);
    assert_eq!(values[0], 8);
    let flat = group.reshape(slots[0], &[48]).unwrap();
    assert_eq!(
        group.read_view(flat).unwrap().as_slice::<i32>().unwrap(),
        &data[..]
    );
    assert!(matches!(
        group.reshape(permuted, &[48]),
        Err(GroupError::Tensor(TensorError::NotContiguous { .. }))
    ));
}

/// A strided view copied out of a group goes into the group's own pool, under its budget
/// and in its statistics (it used to go to the global pool).
#[test]
fn into_tensor_copies_into_the_groups_own_pool() {
    let pool = private_pool();
    let t = Tensor::from_slice_in(&pool, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let transposed = group.permute(slots[0], &[1, 0]).unwrap();
    let copy = group.into_tensor(transposed).unwrap();
    assert_eq!(
        copy.as_slice::<f32>().unwrap(),
        &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    let stats = pool.stats();
    assert_eq!(stats.allocations, 2, "the copy came from the group's pool");
    assert_eq!(stats.in_use_bytes, 48);
    drop((group, copy));
    assert_eq!(pool.stats().in_use_bytes, 0);
}

/// Thousands of views of one buffer: each removal is O(1), aliases are counted exactly, and
/// the buffer goes back with its last view. Removed slots stay removed even after their
/// view index is reused.
#[test]
fn many_views_come_and_go() {
    let pool = private_pool();
    let t = Tensor::from_slice_in(&pool, &[1i32, 2, 3, 4], &[4]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let views: Vec<_> = (0..scaled(5_000))
        .map(|i| group.narrow(slots[0], 0, i % 4, 1).unwrap())
        .collect();
    assert_eq!(group.len(), views.len() + 1);
    assert!(matches!(
        group.try_extract(slots[0]),
        Err(GroupError::Aliased { aliases }) if aliases == views.len()
    ));
    for (i, &view) in views.iter().enumerate().rev() {
        assert_eq!(
            group.read_view(view).unwrap().get::<i32>(&[0]).unwrap(),
            (i % 4) as i32 + 1
        );
        group.remove(view).unwrap();
        assert!(matches!(
            group.read_view(view),
            Err(GroupError::Removed { .. })
        ));
    }
    let reused = group.narrow(slots[0], 0, 0, 2).unwrap();
    assert!(matches!(
        group.read_view(views[0]),
        Err(GroupError::Removed { .. })
    ));
    group.remove(reused).unwrap();
    let whole = group.try_extract(slots[0]).unwrap();
    assert_eq!(whole.as_slice::<i32>().unwrap(), &[1, 2, 3, 4]);
    assert!(group.is_empty());
    drop(whole);
    assert_eq!(pool.stats().in_use_bytes, 0);
}
