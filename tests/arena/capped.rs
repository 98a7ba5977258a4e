//! Arenas capped at a number of slots: they fill to their cap whoever holds the vacant
//! slots, and `trim` runs beside every operation.

use super::*;

/// A capped arena whose vacant slots sit in another thread's hand (that thread inserted once,
/// taking a chunk of 64 into its hand, and stays alive): inserts elsewhere fill the arena to
/// its cap before `Full`, instead of failing with 63 vacant slots in that hand.
#[test]
fn a_capped_arena_fills_to_its_cap_past_an_idle_threads_hand() {
    for (cap, first_page_len) in [(64u32, 64u32), (100, 64), (2, 4), (65, 64)] {
        let collector = Collector::new();
        let arena = capped(&collector, cap, 1, first_page_len, 64);
        let inserted = std::sync::Barrier::new(2);
        let done = std::sync::Barrier::new(2);
        let (refused, last) = std::thread::scope(|s| {
            s.spawn(|| {
                arena.insert(0u32).unwrap();
                inserted.wait();
                done.wait(); // alive, idle, its hand full
            });
            inserted.wait();
            let refused = (1..cap).find_map(|i| arena.insert(i).err().map(|error| (i, error)));
            let last = arena.insert(cap);
            done.wait();
            (refused, last)
        });
        assert_eq!(
            refused, None,
            "cap {cap}: refused with that many slots in use"
        );
        assert!(
            matches!(last, Err(ArenaError::Full { .. })),
            "cap {cap}: {last:?}"
        );
        assert_eq!(arena.len(), cap as usize);
    }
}

/// A capped arena with 63 vacant slots on its free lists, one thread trimming in a loop and
/// another inserting 62 values: a trim holds the free lists while it runs, and an insert at
/// the cap must wait for them instead of failing with `Full`.
#[test]
fn a_capped_arena_inserts_at_its_cap_while_another_thread_trims() {
    for shards in [1, 2] {
        for round in 0..scaled(2000) {
            let collector = Collector::new();
            let mut arena = capped(&collector, 64, shards, 64, 64);
            let keys: Vec<_> = (0..64u32).map(|i| arena.insert(i).unwrap()).collect();
            for &key in &keys[1..] {
                arena.take(key).unwrap(); // one live value keeps the page
            }
            let stop = std::sync::atomic::AtomicBool::new(false);
            let refusals = std::thread::scope(|s| {
                s.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        arena.trim();
                    }
                });
                // Every refusal, then stop the trimmer (before any assertion: a panic here
                // would leave it trimming, and the scope waiting for it).
                let refusals: Vec<ArenaError> =
                    (0..62).filter_map(|i| arena.insert(i).err()).collect();
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                refusals
            });
            assert_eq!(
                refusals,
                [],
                "shards {shards}, round {round}: refused with vacant slots"
            );
            assert_eq!(arena.len(), 63);
        }
    }
}

/// A capped arena, full, one value removed by the only thread there is: the next insert gets
/// its slot. The removal's grace period has passed once the thread unpins, though its own
/// pin, while it looked, held the epoch back after one step of the two it needs.
#[test]
fn a_capped_arena_reuses_a_removed_slot_at_its_cap() {
    for cap in [1u32, 2, 64, 100] {
        let collector = Collector::new();
        let arena = capped(&collector, cap, 1, 64, 64);
        let keys: Vec<_> = (0..cap).map(|i| arena.insert(i).unwrap()).collect();
        assert_eq!(arena.remove(keys[0], &arena.pin()), Ok(&0));
        assert!(arena.insert(cap).is_ok(), "cap {cap}");
        assert!(matches!(
            arena.insert(cap + 1),
            Err(ArenaError::Full { .. })
        ));
    }
}

/// A capped arena whose removals wait in full batches of an idle thread: that thread's epoch
/// bag must not keep them from an insert at the cap (a capped arena hands every full batch
/// to the collector at once).
#[test]
fn a_capped_arena_reuses_slots_an_idle_thread_removed() {
    let collector = Collector::new();
    let cap = 256;
    let arena = capped(&collector, cap, 1, 64, 8);
    let removed = std::sync::Barrier::new(2);
    let done = std::sync::Barrier::new(2);
    let refused = std::thread::scope(|s| {
        s.spawn(|| {
            // Three full batches of 8, then idle, alive.
            let keys: Vec<_> = (0..24u32).map(|i| arena.insert(i).unwrap()).collect();
            for key in keys {
                arena.discard(key).unwrap();
            }
            removed.wait();
            done.wait();
        });
        removed.wait();
        let refused = (0..cap).find_map(|i| arena.insert(i).err().map(|error| (i, error)));
        done.wait();
        refused
    });
    assert_eq!(refused, None, "refused with that many of {cap} in use");
}

/// An arena capped at 100 slots, pages of 64 and 128, chunks of 64: its second chunk stops at
/// the cap and leaves the frontier at 128, past the last index. Emptied, it still releases
/// its pages (a frontier past the last index once made every `trim` give up for ever), and
/// then fills to the cap again.
#[test]
fn a_capped_arena_refuses_past_its_cap_and_releases_its_pages_when_emptied() {
    let collector = Collector::new();
    let mut arena = capped(&collector, 100, 1, 64, 8);
    for round in 0..3 {
        let keys: Vec<_> = (0..100u32).map(|i| arena.insert(i).unwrap()).collect();
        assert!(
            matches!(arena.insert(100), Err(ArenaError::Full { capacity: 100 })),
            "round {round}"
        );
        let indices: HashSet<u32> = keys.iter().map(|key| key.index()).collect();
        assert_eq!(indices.len(), 100);
        assert!(indices.iter().all(|&index| index < 100), "round {round}");
        for (i, key) in keys.into_iter().enumerate() {
            assert_eq!(arena.take(key).unwrap(), i as u32);
        }
        assert_eq!(arena.shrink(), 64 + 128, "round {round}");
        assert_eq!(arena.capacity(), 0);
    }
    // The same through `trim`, from removals waiting out their grace period.
    let keys: Vec<_> = (0..100u32).map(|i| arena.insert(i).unwrap()).collect();
    for key in keys {
        arena.discard(key).unwrap();
    }
    let mut released = 0;
    for _ in 0..100 {
        released += arena.trim();
        if arena.capacity() == 0 {
            break;
        }
    }
    assert_eq!(released, 64 + 128);
}

/// `trim` releases vacant trailing pages while other threads insert, read and remove (with
/// `remove` or `discard`, and discard stale keys into pages that may be released meanwhile):
/// every record is dropped exactly once, reads never see a wrong value, and keys into a
/// released page stay stale after the page is allocated again. (A stale discard's read of a
/// page freed under it would go unseen here without a sanitizer: the loom model
/// `a_discard_racing_a_trim` is what checks that `trim` waits for it.)
#[test]
fn trim_runs_concurrently_with_every_operation() {
    let collector = Collector::new();
    let rounds = scaled(300);
    let ledger = DropLedger::new(4 * rounds * 16);
    let arena = SlotArena::with_config(small(&collector, 4, 4)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..3)
            .map(|t| {
                let (arena, ledger, collector) = (&arena, &ledger, collector.clone());
                scope.spawn(move || {
                    let handle = collector.register();
                    let mut stale = Vec::new();
                    for round in 0..rounds {
                        let ids: Vec<usize> =
                            (0..16).map(|i| (t * rounds + round) * 16 + i).collect();
                        let keys: Vec<_> = ids
                            .iter()
                            .map(|&id| arena.insert(ledger.record(id)).unwrap())
                            .collect();
                        let guard = handle.pin();
                        for (&key, &id) in keys.iter().zip(&ids) {
                            assert_eq!(arena.get(key, &guard).unwrap().id, id);
                            if id % 2 == 0 {
                                arena.remove(key, &guard).unwrap();
                            } else {
                                arena.discard(key).unwrap();
                            }
                            assert!(arena.get(key, &guard).is_err());
                        }
                        drop(guard);
                        // Keys of the round before, discarded again without a pin: their
                        // pages may be released (and allocated again) meanwhile.
                        for &key in &stale {
                            assert!(arena.discard(key).is_err());
                        }
                        stale = keys;
                    }
                })
            })
            .collect();
        let trimmer = scope.spawn(|| {
            let mut released = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                released += arena.trim();
            }
            released
        });
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for result in results {
            result.unwrap();
        }
        trimmer.join().unwrap();
    });
    let stale = {
        let key = arena.insert(ledger.record(3 * rounds * 16)).unwrap();
        arena.remove(key, &arena.pin()).unwrap();
        key
    };
    // Everything removed: after the grace periods, trimming releases every page.
    for _ in 0..100 {
        collector.register().pin().flush();
        arena.trim();
        if arena.capacity() == 0 {
            break;
        }
    }
    assert_eq!(arena.capacity(), 0, "every page released");
    // Pages come back with generations past every key issued before.
    let fresh: Vec<_> = (0..64)
        .map(|i| {
            arena
                .insert(ledger.record(3 * rounds * 16 + 1 + i % 8))
                .unwrap()
        })
        .collect();
    assert!(!arena.contains(stale));
    assert!(fresh.iter().all(|&key| key != stale));
    drop(arena);
    drop(collector);
    assert_eq!(ledger.total(), 3 * rounds * 16 + 1 + 64);
}
