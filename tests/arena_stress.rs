//! Stress: 8 threads run a fixed number of mixed operations on one arena (on 2 cores), some
//! removing keys that other threads inserted. Every record is dropped exactly once: none is
//! lost, none dropped twice, and no reader ever sees a dropped record.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{scaled, DropLedger, Tracked};
use ferropool::{ArenaConfig, Collector, Key, SlotArena};

const THREADS: usize = 8;

#[test]
fn mixed_operations_drop_every_record_exactly_once() {
    let ops_per_thread = scaled(20_000);
    let ledger = DropLedger::new(THREADS * ops_per_thread);
    let collector = Collector::new();
    let arena: Arc<SlotArena<Tracked>> = Arc::new(
        SlotArena::with_config(ArenaConfig {
            first_page_len: 4,
            removal_batch: 8,
            collector: Some(collector.clone()),
            ..ArenaConfig::default()
        })
        .unwrap(),
    );
    // Keys any thread may read or remove; a cheap xorshift picks the operation.
    let shared_keys: Arc<Mutex<Vec<(Key, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    let removed = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (arena, ledger, collector, shared_keys, removed) = (
                Arc::clone(&arena),
                ledger.clone(),
                collector.clone(),
                Arc::clone(&shared_keys),
                Arc::clone(&removed),
            );
            std::thread::spawn(move || {
                let handle = collector.register();
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                let mut own: Vec<(Key, usize)> = Vec::new();
                for i in 0..ops_per_thread {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let guard = handle.pin();
                    match rng % 8 {
                        0..=2 => {
                            let id = t * ops_per_thread + i;
                            let key = arena.insert(ledger.record(id)).unwrap();
                            if rng.is_multiple_of(3) {
                                shared_keys.lock().unwrap().push((key, id));
                            } else {
                                own.push((key, id));
                            }
                        }
                        3 | 4 => {
                            if let Some(&(key, id)) = own.last() {
                                let value = arena.get(key, &guard).unwrap();
                                assert_eq!(value.id, id);
                                assert_eq!(ledger.drops(id), 0, "read a dropped record");
                            }
                        }
                        5 => {
                            if let Some((key, id)) = own.pop() {
                                assert_eq!(arena.remove(key, &guard).unwrap().id, id);
                                removed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        6 => {
                            // Read or remove a key another thread may remove concurrently.
                            let pick = {
                                let keys = shared_keys.lock().unwrap();
                                (!keys.is_empty()).then(|| keys[rng as usize % keys.len()])
                            };
                            if let Some((key, id)) = pick {
                                if let Ok(value) = arena.get(key, &guard) {
                                    assert_eq!(value.id, id, "a key resolved to another record");
                                    assert_eq!(ledger.drops(id), 0, "read a dropped record");
                                }
                            }
                        }
                        _ => {
                            let popped = shared_keys.lock().unwrap().pop();
                            if let Some((key, id)) = popped {
                                assert_eq!(arena.remove(key, &guard).unwrap().id, id);
                                removed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                own.len()
            })
        })
        .collect();
    let live_own: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let live = live_own + shared_keys.lock().unwrap().len();
    assert_eq!(arena.len(), live);
    // Every removed record is dropped once the collector has run, the rest with the arena.
    let inserted = {
        let mut ids = Vec::new();
        let guard = arena.pin();
        arena.for_each(&guard, |_, v| ids.push(v.id)).unwrap();
        ids.len()
    };
    assert_eq!(inserted, live);
    drop(arena);
    drop(collector);
    let total = ledger.total();
    assert_eq!(total as u64, removed.load(Ordering::Relaxed) + live as u64);
    // Exactly once: no counter above 1.
    for id in 0..THREADS * ops_per_thread {
        assert!(
            ledger.drops(id) <= 1,
            "record {id} dropped {} times",
            ledger.drops(id)
        );
    }
}
