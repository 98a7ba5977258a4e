//! ferropool with the rest of the Rust ecosystem: `half` elements, zero-copy views for any
//! tensor library (raw) and for `ndarray` (feature), collections in a pool through
//! `allocator-api2` (feature), `serde` (feature), and a trace in the Chrome Trace Event
//! format.

use std::sync::Arc;

use ferropool::half::{bf16, f16};
use ferropool::{
    AllocationGroup, BufferPool, CheckpointNode, DType, MemoryTag, PoolConfig, PoolError,
    PoolEventKind, RetainedInputMap, Tensor, TensorError,
};

#[test]
fn sixteen_bit_floats_round_to_nearest_even_and_keep_nan() {
    assert_eq!(bf16::from_f32(1.0058594).to_bits(), 0x3f81);
    assert!(bf16::from_bits(0x7F81).is_nan());
    assert!(f16::from_f32(f32::from_bits(0x7F80_0001)).is_nan());
    let t = Tensor::from_slice(&[f16::from_f32(0.5), f16::from_f32(65504.0)], &[2]).unwrap();
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.as_slice::<f16>().unwrap()[1].to_f32(), 65504.0);
    assert!(
        t.as_slice::<bf16>().is_err(),
        "a typed read checks the dtype"
    );
    let zeros = Tensor::zeros(DType::BF16, &[3]).unwrap();
    assert_eq!(zeros.as_slice::<bf16>().unwrap(), &[bf16::ZERO; 3]);
}

/// A 2x3x4 tensor viewed permuted and narrowed: the raw accessor (and ndarray, with the
/// feature) see exactly the elements `get` sees, without a copy.
#[test]
fn strided_views_are_handed_out_without_copying() {
    let values: Vec<i32> = (0..24).collect();
    let t = Tensor::from_slice(&values, &[2, 3, 4]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let permuted = group.permute(slots[0], &[2, 0, 1]).unwrap();
    let narrowed = group.narrow(permuted, 0, 1, 2).unwrap();
    for slot in [slots[0], permuted, narrowed] {
        let view = group.read_view(slot).unwrap();
        let raw = view.raw::<i32>().unwrap();
        let shape = raw.shape.to_vec();
        let mut index = vec![0; shape.len()];
        loop {
            let at = raw.offset
                + index
                    .iter()
                    .zip(raw.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            assert_eq!(raw.elements[at], view.get::<i32>(&index).unwrap());
            #[cfg(feature = "ndarray")]
            {
                let array = view.to_ndarray::<i32>().unwrap();
                assert_eq!(array.shape(), &shape[..]);
                assert_eq!(array[&index[..]], view.get::<i32>(&index).unwrap());
                // Zero-copy: the array's elements are the buffer's.
                assert!(std::ptr::eq(&array[&index[..]], &raw.elements[at]));
            }
            // Odometer.
            let mut k = shape.len();
            loop {
                if k == 0 {
                    break;
                }
                k -= 1;
                index[k] += 1;
                if index[k] < shape[k] {
                    break;
                }
                index[k] = 0;
            }
            if index.iter().all(|&i| i == 0) {
                break;
            }
        }
    }
    let view = group.read_view(narrowed).unwrap();
    assert!(matches!(
        view.raw::<f32>(),
        Err(TensorError::DTypeMismatch { .. })
    ));
}

#[cfg(feature = "ndarray")]
#[test]
fn an_empty_view_is_an_empty_array() {
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let empty = group.narrow(slots[0], 1, 2, 0).unwrap();
    let array = group.read_view(empty).unwrap().to_ndarray::<f32>().unwrap();
    assert_eq!(array.shape(), &[2, 0]);
    assert_eq!(array.len(), 0);
}

#[cfg(feature = "allocator-api2")]
#[test]
fn collections_live_in_a_pool_under_its_budget() {
    use allocator_api2::vec::Vec;
    let pool = BufferPool::with_config(PoolConfig {
        budget: Some(4 << 20),
        ..PoolConfig::default()
    })
    .unwrap();
    let mut v: Vec<f32, &BufferPool> = Vec::new_in(&pool);
    for i in 0..100_000 {
        v.push(i as f32);
    }
    assert_eq!(v[99_999], 99_999.0);
    assert!(pool.stats().in_use_bytes >= 400_000);
    let mut map: hashbrown::HashMap<u64, u64, _, &BufferPool> =
        hashbrown::HashMap::with_hasher_in(hashbrown::DefaultHashBuilder::default(), &pool);
    for i in 0..10_000 {
        map.insert(i, i * 2);
    }
    assert_eq!(map[&777], 1554);
    // Over the budget: refused with an error, not an abort, and counted.
    let mut huge: Vec<u8, &BufferPool> = Vec::new_in(&pool);
    assert!(huge.try_reserve(8 << 20).is_err());
    assert_eq!(pool.stats().budget_failures, 1);
    // Owned handles work too, and zero-sized types need no memory.
    let mut owned: Vec<u16, BufferPool> = Vec::with_capacity_in(10, pool.clone());
    owned.extend([1, 2, 3]);
    let units: Vec<(), &BufferPool> = Vec::with_capacity_in(1_000_000, &pool);
    assert_eq!(units.capacity(), usize::MAX);
    drop((v, map, owned, units));
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[cfg(feature = "serde")]
#[test]
fn config_stats_events_and_snapshots_serialize() {
    let config = PoolConfig {
        budget: Some(1 << 30),
        trace_capacity: 16,
        ..PoolConfig::default()
    };
    let json = serde_json::to_string(&config).unwrap();
    let back: PoolConfig = serde_json::from_str(&json).unwrap();
    assert_eq!(back, config);
    let pool = BufferPool::with_config(config).unwrap();
    let tag = MemoryTag::new("weights");
    let held = {
        let _scope = tag.enter();
        pool.alloc(4096).unwrap()
    };
    let stats = pool.stats();
    let back: ferropool::PoolStats =
        serde_json::from_str(&serde_json::to_string(&stats).unwrap()).unwrap();
    assert_eq!(back, stats);
    let snapshot = serde_json::to_value(pool.snapshot()).unwrap();
    assert_eq!(snapshot[0]["tag"], "weights");
    assert_eq!(snapshot[0]["block_bytes"], 4096);
    let events = serde_json::to_value(pool.trace_events()).unwrap();
    assert_eq!(events[0]["kind"], "SystemAlloc");
    drop(held);
}

/// `memory_by_tag` serializes as a JSON object from each tag's name to its bytes, untagged
/// memory under `"untagged"`: no repeated key (tags made twice with one name are one tag),
/// and no error for untagged memory (a map keyed by `Option<MemoryTag>` failed with "key
/// must be a string"). It reads back as what was written.
#[cfg(feature = "serde")]
#[test]
fn memory_by_tag_is_a_json_object_keyed_by_name() {
    let pool = BufferPool::new();
    let weights = MemoryTag::new("by-tag weights");
    let tagged = {
        let _scope = weights.enter();
        [pool.alloc(4096).unwrap(), pool.alloc(1000).unwrap()]
    };
    // Made again after those buffers: the same tag, the same key.
    let again = {
        let _scope = MemoryTag::new("by-tag weights").enter();
        pool.alloc(64).unwrap()
    };
    let untagged = pool.alloc(128).unwrap();
    let by_tag = pool.memory_by_tag();
    let json = serde_json::to_string(&by_tag).expect("serializes with untagged memory");
    assert_eq!(
        json.matches("\"by-tag weights\"").count(),
        1,
        "no repeated key: {json}"
    );
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let object = value.as_object().expect("a JSON object");
    assert_eq!(object.len(), 2, "{json}");
    assert_eq!(object["by-tag weights"], 4096 + 1024 + 64, "{json}");
    assert_eq!(object["untagged"], 128, "{json}");
    let back = serde_json::from_str(&json).unwrap();
    assert_eq!(by_tag, back);
    assert_eq!((by_tag[&Some(weights)], by_tag[&None]), (5184, 128));
    // A tag named like the untagged key shares its entry (keys never repeat).
    let clash = {
        let _scope = MemoryTag::new("untagged").enter();
        pool.alloc(64).unwrap()
    };
    let value = serde_json::to_value(pool.memory_by_tag()).unwrap();
    assert_eq!(value["untagged"], 128 + 64, "{value}");
    assert_eq!(value.as_object().unwrap().len(), 2, "{value}");
    drop((tagged, again, untagged, clash));
    assert_eq!(serde_json::to_string(&pool.memory_by_tag()).unwrap(), "{}");
}

/// The trace parses as JSON and follows the Chrome Trace Event format: every event has a
/// name, a phase, a timestamp and a process; metadata names the process and the threads;
/// instant events carry the bytes, class and tag on their thread's track; counter events
/// the bytes in use, cached and reserved.
#[test]
fn the_trace_is_chrome_trace_event_json() {
    let pool = BufferPool::with_config(PoolConfig {
        trace_capacity: 64,
        ..PoolConfig::default()
    })
    .unwrap();
    let tag = MemoryTag::new("activations \"quoted\"");
    {
        let _scope = tag.enter();
        drop(pool.alloc(10_000).unwrap());
    }
    pool.trace_mark(7);
    let json: serde_json::Value = serde_json::from_str(&pool.trace_json()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let mut instants = 0;
    let mut counters = 0;
    for event in events {
        assert!(
            event["name"].is_string() && event["ph"].is_string(),
            "{event}"
        );
        assert_eq!(event["pid"], pool.id());
        match event["ph"].as_str().unwrap() {
            "M" => assert!(
                ["process_name", "thread_name"].contains(&event["name"].as_str().unwrap()),
                "{event}"
            ),
            "i" => {
                instants += 1;
                assert!(
                    event["ts"].is_number() && event["tid"].is_number(),
                    "{event}"
                );
                assert!(event["args"]["bytes"].is_u64(), "{event}");
                if event["name"] == "alloc" {
                    assert_eq!(event["args"]["tag"], "activations \"quoted\"");
                    assert_eq!(event["args"]["bytes"], 10_240);
                }
            }
            "C" => {
                counters += 1;
                let args = &event["args"];
                assert!(
                    args["in_use"].is_u64() && args["cached"].is_u64() && args["reserved"].is_u64()
                );
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    let kinds: Vec<_> = pool.trace_events().iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            PoolEventKind::SystemAlloc,
            PoolEventKind::Alloc,
            PoolEventKind::Free,
            PoolEventKind::Mark
        ]
    );
    assert_eq!((instants, counters), (4, 4));
}

#[test]
fn newcomer_conveniences() {
    let pool = BufferPool::new();
    let t = Tensor::from_vec_in(&pool, vec![1u8, 2, 3], &[3]).unwrap();
    assert_eq!(t.as_slice::<u8>().unwrap(), &[1, 2, 3]);
    let copied = Tensor::uninit_in::<f64>(&pool, &[2])
        .unwrap()
        .copy_from(&[0.5, 1.5])
        .unwrap();
    assert_eq!(copied.as_slice::<f64>().unwrap(), &[0.5, 1.5]);
    assert!(matches!(
        Tensor::uninit_in::<f64>(&pool, &[2])
            .unwrap()
            .copy_from(&[1.0]),
        Err(TensorError::ShapeMismatch { .. })
    ));
    let mut manual = Tensor::uninit_in::<i32>(&pool, &[3]).unwrap();
    for (i, e) in manual.as_uninit_mut().iter_mut().enumerate() {
        e.write(i as i32 * 10);
    }
    // SAFETY: (test) every element was written just above.
    let manual = unsafe { manual.assume_init() };
    assert_eq!(manual.as_slice::<i32>().unwrap(), &[0, 10, 20]);
    let chain = CheckpointNode::push(None, Arc::new(0), 'a', 1, Arc::new(RetainedInputMap::new()));
    let chain = CheckpointNode::push(
        Some(chain),
        Arc::new(1),
        'a',
        2,
        Arc::new(RetainedInputMap::new()),
    );
    assert_eq!(chain.lookup_alias(&'a'), Some(&1), "the oldest entry wins");
    // The global pool is in use by now: configuring it is refused.
    drop(Tensor::from_slice(&[1.0f32], &[1]).unwrap());
    assert_eq!(
        BufferPool::configure_global(PoolConfig::default()),
        Err(PoolError::AlreadyInitialized)
    );
    // A shared group's error says who else may hold it.
    let t = Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let _saved = ferropool::RetainedValue::from_group(&group, slots[0]).unwrap();
    let message = group.reshape(slots[0], &[1, 2]).unwrap_err().to_string();
    assert!(message.contains("RetainedValue"), "{message}");
}

/// A zeroed block is zeroed over all of its length, also when it is a reused block whose
/// earlier user wrote more than it now asks for.
#[cfg(feature = "allocator-api2")]
#[test]
fn allocate_zeroed_zeroes_all_it_returns() {
    use allocator_api2::alloc::Allocator;
    use std::alloc::Layout;
    let pool = BufferPool::new();
    let layout = Layout::from_size_align(100, 8).unwrap();
    let first = pool.allocate(layout).unwrap();
    // SAFETY: `first` holds `first.len()` bytes, ours until deallocated.
    unsafe { first.cast::<u8>().as_ptr().write_bytes(0xAB, first.len()) };
    // SAFETY: allocated above with `layout`.
    unsafe { pool.deallocate(first.cast(), layout) };
    let zeroed = pool.allocate_zeroed(layout).unwrap();
    // SAFETY: `zeroed` holds `zeroed.len()` bytes, said to be zero.
    let bytes = unsafe { std::slice::from_raw_parts(zeroed.cast::<u8>().as_ptr(), zeroed.len()) };
    assert!(bytes.len() >= 100);
    assert!(bytes.iter().all(|&b| b == 0));
    // SAFETY: allocated above with `layout`.
    unsafe { pool.deallocate(zeroed.cast(), layout) };
}

#[cfg(feature = "allocator-api2")]
#[test]
fn a_collection_shrinks_in_place_at_its_budget() {
    use allocator_api2::vec::Vec;
    // Shrinking asked the pool for a new, smaller block first, which a pool at its budget
    // refused: the vector then aborted the process ("memory allocation failed").
    let pool = BufferPool::with_config(PoolConfig {
        budget: Some(655_360),
        ..PoolConfig::default()
    })
    .unwrap();
    let mut bytes: Vec<u8, &BufferPool> = Vec::with_capacity_in(600_000, &pool);
    bytes.extend(std::iter::repeat_n(1u8, 600_000));
    let asked = pool.stats().requested_bytes;
    bytes.truncate(10);
    bytes.shrink_to(1000);
    assert_eq!(bytes.as_slice(), &[1u8; 10]);
    assert!(bytes.capacity() >= 1000);
    assert_eq!(pool.stats().system_allocations, 1, "kept in place");
    assert_eq!(pool.stats().requested_bytes, asked - 599_000);
    // Growing in place counts the new size too.
    bytes.reserve_exact(5000);
    assert_eq!(pool.stats().system_allocations, 1);
    drop(bytes);
    assert_eq!(pool.stats().requested_bytes, 0);
}

#[cfg(feature = "allocator-api2")]
#[test]
fn an_in_place_resize_counts_what_an_allocation_of_the_new_size_counts() {
    use allocator_api2::alloc::Allocator;
    use std::alloc::Layout;
    let pool = BufferPool::new();
    let (old, small) = (
        Layout::from_size_align(4096, 64).unwrap(),
        Layout::from_size_align(2048, 64).unwrap(),
    );
    let fresh = pool.allocate(small).unwrap();
    let counted = pool.stats().requested_bytes;
    // SAFETY: allocated above with `small`.
    unsafe { pool.deallocate(fresh.cast(), small) };
    // The same size reached by growing to all the block returned, then shrinking: the count
    // once depended on the earlier length, clamped at the block's end.
    let block = pool.allocate(old).unwrap();
    let full = Layout::from_size_align(block.len(), 64).unwrap();
    // SAFETY: `block` came from `allocate` with `old`; `full` is no smaller.
    let grown = unsafe { pool.grow(block.cast(), old, full) }.unwrap();
    // SAFETY: `grown` holds `full`; `small` is no larger.
    let shrunk = unsafe { pool.shrink(grown.cast(), full, small) }.unwrap();
    assert_eq!(pool.stats().requested_bytes, counted);
    // SAFETY: the block now has layout `small`.
    unsafe { pool.deallocate(shrunk.cast(), small) };
    assert_eq!(pool.stats().requested_bytes, 0);
}
