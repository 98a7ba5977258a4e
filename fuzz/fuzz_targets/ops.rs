//! Drives arena, group and retain operations from fuzzer bytes and checks every result
//! against a plain model. Run: `cargo +nightly fuzz run ops` (see fuzz/README.md).
#![no_main]

use std::collections::HashMap;

use ferropool::{AllocationGroup, ArenaConfig, Collector, DescriptorSlot, RetainedValue, SlotArena, Tensor};
use libfuzzer_sys::fuzz_target;

/// A group with the reference contents of each of its live slots.
struct ModelGroup {
    group: AllocationGroup,
    slots: Vec<(DescriptorSlot, Vec<i32>)>,
}

fuzz_target!(|data: &[u8]| {
    let collector = Collector::new();
    let handle = collector.register();
    let mut arena = SlotArena::with_config(ArenaConfig {
        first_page_len: 2,
        retire_batch: 2,
        collector: Some(collector.clone()),
    })
    .unwrap();
    let mut model: HashMap<ferropool::Key, u64> = HashMap::new();
    let mut keys = Vec::new();
    let mut groups: Vec<ModelGroup> = Vec::new();
    let mut retained: Vec<(RetainedValue, Vec<i32>)> = Vec::new();

    let mut bytes = data.iter().copied();
    while let (Some(op), Some(arg)) = (bytes.next(), bytes.next()) {
        let arg = usize::from(arg);
        match op % 10 {
            0 => {
                let key = arena.insert(arg as u64).unwrap();
                assert!(model.insert(key, arg as u64).is_none());
                keys.push(key);
            }
            1 if !keys.is_empty() => {
                let key = keys[arg % keys.len()];
                let guard = handle.pin();
                assert_eq!(arena.get(key, &guard).ok().copied(), model.get(&key).copied());
            }
            2 if !keys.is_empty() => {
                let key = keys[arg % keys.len()];
                let guard = handle.pin();
                assert_eq!(arena.remove(key, &guard).ok().copied(), model.remove(&key));
            }
            3 if !keys.is_empty() => {
                let key = keys[arg % keys.len()];
                assert_eq!(arena.take(key).ok(), model.remove(&key));
            }
            4 => {
                let n = 1 + arg % 12;
                let values: Vec<i32> = (0..n as i32).map(|v| v * 3 + arg as i32).collect();
                let tensor = Tensor::from_slice(&values, &[n]).unwrap();
                let (group, slots) = AllocationGroup::from_tensors([tensor]).unwrap();
                groups.push(ModelGroup { group, slots: vec![(slots[0], values)] });
            }
            5 if !groups.is_empty() => {
                // A narrowed view of a random slot of a random group (if it is not shared).
                let count = groups.len();
                let g = &mut groups[arg % count];
                let (slot, values) = g.slots[arg % g.slots.len()].clone();
                let start = arg % values.len();
                let len = 1 + (arg / 7) % (values.len() - start);
                match g.group.narrow(slot, 0, start, len) {
                    Ok(view) => g.slots.push((view, values[start..start + len].to_vec())),
                    Err(ferropool::GroupError::Shared { .. }) => assert!(g.group.handles() > 1),
                    Err(other) => panic!("narrow failed: {other}"),
                }
            }
            6 if !groups.is_empty() => {
                let g = &groups[arg % groups.len()];
                let (slot, values) = g.slots[arg % g.slots.len()].clone();
                retained.push((RetainedValue::from_group(&g.group, slot).unwrap(), values));
            }
            7 if !retained.is_empty() => {
                let (value, expected) = &retained[arg % retained.len()];
                let read = value.tensor_read().unwrap();
                assert_eq!(&read.to_vec::<i32>().unwrap(), expected);
            }
            8 if !retained.is_empty() => {
                let k = arg % retained.len();
                retained.swap_remove(k);
            }
            9 if !groups.is_empty() => {
                // Dropping a group handle: retained values keep reading it.
                let k = arg % groups.len();
                groups.swap_remove(k);
            }
            _ => {}
        }
    }
    for (value, expected) in &retained {
        assert_eq!(&value.tensor_read().unwrap().to_vec::<i32>().unwrap(), expected);
    }
    let guard = handle.pin();
    let mut seen = HashMap::new();
    arena.for_each(&guard, |k, v| { seen.insert(k, *v); }).unwrap();
    assert_eq!(seen, model);
});
