//! Property test: random operation sequences on `SlotArena` agree with a `HashMap` model.

use std::collections::HashMap;

use ferropool::{ArenaConfig, ArenaError, Collector, Key, SlotArena};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Insert(u32),
    Get(usize),
    Remove(usize),
    Take(usize),
    Flush,
    Shrink,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u32>().prop_map(Op::Insert),
        3 => any::<usize>().prop_map(Op::Get),
        3 => any::<usize>().prop_map(Op::Remove),
        1 => any::<usize>().prop_map(Op::Take),
        1 => Just(Op::Flush),
        1 => Just(Op::Shrink),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn arena_matches_hashmap_model(
        ops in proptest::collection::vec(op(), 1..200),
        first_page_len in prop_oneof![Just(1u32), Just(2), Just(8)],
        removal_batch in 1u32..5,
    ) {
        let collector = Collector::new();
        let handle = collector.register();
        let mut arena = SlotArena::with_config(ArenaConfig {
            first_page_len,
            removal_batch,
            collector: Some(collector.clone()),
            ..ArenaConfig::default()
        }).unwrap();
        let mut model: HashMap<Key, u32> = HashMap::new();
        // Every key ever issued, live or not, so that stale keys get exercised.
        let mut issued: Vec<Key> = Vec::new();
        for op in ops {
            match op {
                Op::Insert(v) => {
                    let key = arena.insert(v).unwrap();
                    prop_assert!(!model.contains_key(&key), "key {:?} issued twice", key);
                    model.insert(key, v);
                    issued.push(key);
                }
                Op::Get(i) if !issued.is_empty() => {
                    let key = issued[i % issued.len()];
                    let guard = handle.pin();
                    match (arena.get(key, &guard), model.get(&key)) {
                        (Ok(got), Some(want)) => prop_assert_eq!(got, want),
                        (Err(ArenaError::Stale { .. } | ArenaError::OutOfRange { .. }), None) => {}
                        (got, want) => prop_assert!(false, "get {:?}: {:?} vs model {:?}", key, got, want),
                    }
                    prop_assert_eq!(arena.contains(key), model.contains_key(&key));
                }
                Op::Remove(i) if !issued.is_empty() => {
                    let key = issued[i % issued.len()];
                    let guard = handle.pin();
                    match (arena.remove(key, &guard), model.remove(&key)) {
                        (Ok(got), Some(want)) => prop_assert_eq!(*got, want),
                        (Err(_), None) => {}
                        (got, want) => prop_assert!(false, "remove {:?}: {:?} vs {:?}", key, got, want),
                    }
                }
                Op::Take(i) if !issued.is_empty() => {
                    let key = issued[i % issued.len()];
                    match (arena.take(key), model.remove(&key)) {
                        (Ok(got), Some(want)) => prop_assert_eq!(got, want),
                        (Err(_), None) => {}
                        (got, want) => prop_assert!(false, "take {:?}: {:?} vs {:?}", key, got, want),
                    }
                }
                Op::Flush => {
                    let guard = handle.pin();
                    arena.flush(&guard).unwrap();
                    drop(guard);
                    handle.pin().flush();
                }
                Op::Shrink => {
                    arena.shrink();
                }
                _ => {}
            }
            prop_assert_eq!(arena.len(), model.len());
        }
        let guard = handle.pin();
        let mut seen = HashMap::new();
        arena.for_each(&guard, |k, v| { seen.insert(k, *v); }).unwrap();
        prop_assert_eq!(seen, model);
    }
}
