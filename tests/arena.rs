//! Integration tests of `SlotArena`'s invariants, through the public API only.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{scaled, DropLedger};
use ferropool::{ArenaConfig, ArenaError, Collector, SlotArena, SlotPhase};

fn small(collector: &Collector, first_page_len: u32, removal_batch: u32) -> ArenaConfig {
    ArenaConfig {
        first_page_len,
        removal_batch,
        collector: Some(collector.clone()),
        ..ArenaConfig::default()
    }
}

/// [`small`], capped at `max_slots` slot indices, with `shards` shards.
fn capped(
    collector: &Collector,
    max_slots: u32,
    shards: usize,
    first_page_len: u32,
    removal_batch: u32,
) -> SlotArena<u32> {
    SlotArena::with_config(ArenaConfig {
        max_slots,
        shards: Some(shards),
        ..small(collector, first_page_len, removal_batch)
    })
    .unwrap()
}

#[test]
fn arena_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SlotArena<String>>();
    assert_send_sync::<ferropool::Key>();
}

#[test]
fn insert_get_remove_round_trip() {
    let arena = SlotArena::new();
    let a = arena.insert("a".to_string()).unwrap();
    let b = arena.insert("b".to_string()).unwrap();
    assert_ne!(a, b);
    let guard = arena.pin();
    assert_eq!(arena.get(a, &guard).unwrap(), "a");
    assert_eq!(arena.get(b, &guard).unwrap(), "b");
    assert_eq!(arena.len(), 2);
    assert_eq!(arena.remove(a, &guard).unwrap(), "a");
    assert!(!arena.contains(a));
    assert!(arena.contains(b));
    assert_eq!(arena.len(), 1);
    assert_eq!(arena.with(b, |s| s.len()).unwrap(), 1);
}

#[test]
fn removed_key_is_stale_and_says_why() {
    let arena = SlotArena::new();
    let key = arena.insert(7u32).unwrap();
    let guard = arena.pin();
    arena.remove(key, &guard).unwrap();
    let err = arena.get(key, &guard).unwrap_err();
    assert_eq!(
        err,
        ArenaError::Stale {
            index: key.index(),
            generation: key.generation(),
            current_generation: key.generation() + 1,
            phase: SlotPhase::Removed,
        }
    );
    assert!(err.to_string().contains("not present"), "{err}");
    // Removing twice is the same typed error, not a double free.
    assert!(matches!(
        arena.remove(key, &guard),
        Err(ArenaError::Stale { .. })
    ));
}

/// `discard` removes without a pin: the key is stale at once, a second discard (or a
/// `remove`) says so, foreign and out-of-range keys are typed errors, and every discarded
/// value is dropped exactly once, after a flush or when the arena drops.
#[test]
fn discard_removes_without_a_pin_and_drops_once() {
    let collector = Collector::new();
    let ledger = DropLedger::new(10);
    let arena = SlotArena::with_config(small(&collector, 4, 4)).unwrap();
    let keys: Vec<_> = (0..10)
        .map(|id| arena.insert(ledger.record(id)).unwrap())
        .collect();
    for &key in &keys[..9] {
        arena.discard(key).unwrap();
    }
    let guard = arena.pin();
    assert!(matches!(
        arena.get(keys[0], &guard),
        Err(ArenaError::Stale {
            phase: SlotPhase::Removed,
            ..
        })
    ));
    assert!(matches!(
        arena.discard(keys[0]),
        Err(ArenaError::Stale { .. })
    ));
    assert!(matches!(
        arena.remove(keys[1], &guard),
        Err(ArenaError::Stale { .. })
    ));
    drop(guard);
    let other = SlotArena::<u8>::new();
    let foreign = other.insert(1).unwrap();
    assert!(matches!(
        arena.discard(foreign),
        Err(ArenaError::ForeignKey { .. })
    ));
    assert!(other.contains(foreign), "a foreign key's value stays");
    // A key into a page that was released since.
    let mut shrinking = SlotArena::with_config(small(&collector, 1, 1)).unwrap();
    let far: Vec<_> = (0..8u8).map(|i| shrinking.insert(i).unwrap()).collect();
    for &key in &far[1..] {
        shrinking.take(key).unwrap();
    }
    assert!(shrinking.shrink() > 0);
    assert!(matches!(
        shrinking.discard(far[7]),
        Err(ArenaError::OutOfRange { index: 7, .. })
    ));
    assert_eq!(shrinking.len(), 1);
    assert_eq!(arena.len(), 1);
    // Two full batches went to the collector; the ninth waits in this thread's batch.
    for _ in 0..10 {
        arena.flush(&arena.pin()).unwrap();
        collector.register().pin().flush();
    }
    assert_eq!(ledger.total(), 9, "each discarded value dropped once");
    drop(arena);
    assert_eq!(ledger.total(), 10);
}

/// A `discard` from a thread-local destructor that runs after its thread gave its index
/// back (so no thread cache: it pins and removes instead) removes the value, which is then
/// dropped exactly once.
#[test]
fn discard_from_a_late_thread_local_destructor() {
    type Results = std::sync::mpsc::Sender<[Result<(), ArenaError>; 2]>;
    struct DiscardOnExit(Arc<SlotArena<common::Tracked>>, ferropool::Key, Results);
    impl Drop for DiscardOnExit {
        fn drop(&mut self) {
            let results = [self.0.discard(self.1), self.0.discard(self.1)];
            let _ = self.2.send(results);
        }
    }
    let collector = Collector::new();
    let ledger = DropLedger::new(2);
    let arena = Arc::new(SlotArena::with_config(small(&collector, 4, 4)).unwrap());
    let key = arena.insert(ledger.record(0)).unwrap();
    let (worker, kept) = (Arc::clone(&arena), ledger.record(1));
    let (results, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Held before the thread's first arena use (which claims its index), so dropped
        // after the index is given back.
        common::drop_at_thread_exit(DiscardOnExit(Arc::clone(&worker), key, results));
        worker.insert(kept).unwrap();
    })
    .join()
    .unwrap();
    let [first, second] = received.recv().unwrap();
    assert_eq!(first, Ok(()));
    assert!(
        matches!(second, Err(ArenaError::Stale { .. })),
        "{second:?}"
    );
    assert!(!arena.contains(key));
    for _ in 0..10 {
        arena.flush(&arena.pin()).unwrap();
        collector.register().pin().flush();
    }
    assert_eq!(ledger.total(), 1, "the discarded value dropped once");
}

#[test]
fn reused_slot_never_resolves_for_a_stale_key() {
    let collector = Collector::new();
    let handle = collector.register();
    let arena = SlotArena::with_config(small(&collector, 1, 1)).unwrap();
    let first = arena.insert(1u64).unwrap();
    {
        let guard = handle.pin();
        arena.remove(first, &guard).unwrap();
    }
    // Drive the collector until the slot is back on the free list and reused.
    let mut reused = None;
    for _ in 0..1000 {
        handle.pin().flush();
        let key = arena.insert(2u64).unwrap();
        if key.index() == first.index() {
            reused = Some(key);
            break;
        }
    }
    let second = reused.expect("slot 0 was reclaimed and reused");
    assert_eq!(second.generation(), first.generation() + 1);
    let guard = handle.pin();
    assert_eq!(*arena.get(second, &guard).unwrap(), 2);
    assert!(matches!(
        arena.get(first, &guard),
        Err(ArenaError::Stale { current_generation, phase: SlotPhase::Occupied, .. })
            if current_generation == second.generation()
    ));
    assert!(!arena.contains(first));
}

#[test]
fn foreign_keys_and_guards_are_rejected() {
    let a: SlotArena<u8> = SlotArena::new();
    let b: SlotArena<u8> = SlotArena::new();
    let key = a.insert(1).unwrap();
    let _ = b.insert(2).unwrap();
    let guard = b.pin();
    assert_eq!(
        b.get(key, &guard).unwrap_err(),
        ArenaError::ForeignKey {
            key_arena: a.id(),
            arena: b.id()
        }
    );
    assert!(!b.contains(key));

    // SAFETY: (test) the unprotected guard is only handed to the arena, which must refuse it.
    let unprotected = unsafe { crossbeam_epoch::unprotected() };
    assert_eq!(
        a.get(key, unprotected).unwrap_err(),
        ArenaError::ForeignGuard
    );
    let other = Collector::new();
    let other_handle = other.register();
    assert_eq!(
        a.remove(key, &other_handle.pin()).unwrap_err(),
        ArenaError::ForeignGuard
    );
    assert!(
        a.contains(key),
        "a refused remove leaves the arena unchanged"
    );
}

#[test]
fn pages_grow_by_doubling() {
    let collector = Collector::new();
    let arena = SlotArena::with_config(small(&collector, 4, 8)).unwrap();
    assert_eq!(arena.capacity(), 0);
    let keys: Vec<_> = (0..29u32).map(|i| arena.insert(i).unwrap()).collect();
    // 4 + 8 + 16 = 28 < 29 -> a fourth page of 32.
    assert_eq!(arena.capacity(), 4 + 8 + 16 + 32);
    let indices: HashSet<u32> = keys.iter().map(|k| k.index()).collect();
    assert_eq!(indices.len(), 29);
    let handle = collector.register();
    let guard = handle.pin();
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(*arena.get(*key, &guard).unwrap(), i as u32);
    }
}

#[test]
fn out_of_range_key_is_typed() {
    let collector = Collector::new();
    let big = SlotArena::with_config(small(&collector, 1, 1)).unwrap();
    let keys: Vec<_> = (0..100u8).map(|i| big.insert(i).unwrap()).collect();
    let mut small_arena = SlotArena::with_config(small(&collector, 1, 1)).unwrap();
    small_arena.insert(0u8).unwrap();
    // A key for index 99 of an arena with one slot: forge it by taking from the big arena is
    // not possible, so check the big arena after shrinking it instead.
    let mut big = big;
    for key in &keys[1..] {
        big.take(*key).unwrap();
    }
    assert!(big.shrink() > 0);
    let handle = collector.register();
    let guard = handle.pin();
    assert!(matches!(
        big.get(keys[99], &guard),
        Err(ArenaError::OutOfRange { index: 99, .. })
    ));
    assert_eq!(*big.get(keys[0], &guard).unwrap(), 0);
    drop(guard);
    assert_eq!(
        small_arena.take(keys[0]).unwrap_err(),
        ArenaError::ForeignKey {
            key_arena: big.id(),
            arena: small_arena.id(),
        }
    );
}

#[test]
fn removed_value_stays_readable_until_the_guard_drops() {
    let collector = Collector::new();
    let handle = collector.register();
    let ledger = DropLedger::new(1);
    let arena = SlotArena::with_config(small(&collector, 2, 1)).unwrap();
    let key = arena.insert(ledger.record(0)).unwrap();
    let reader = handle.pin();
    let seen = arena.get(key, &reader).unwrap();
    {
        let other = collector.register();
        let guard = other.pin();
        arena.remove(key, &guard).unwrap();
    }
    // Another thread flushes hard while our reader is pinned: the record must survive.
    let c2 = collector.clone();
    std::thread::spawn(move || {
        let h = c2.register();
        for _ in 0..scaled(200) {
            h.pin().flush();
        }
    })
    .join()
    .unwrap();
    assert_eq!(seen.id, 0);
    assert_eq!(ledger.drops(0), 0, "dropped while a reader was pinned");
    drop(reader);
    // Once the grace period has passed, the next flush recycles the batch.
    for _ in 0..scaled(200) {
        arena.flush(&handle.pin()).unwrap();
        if ledger.drops(0) == 1 {
            break;
        }
    }
    assert_eq!(ledger.drops(0), 1);
}

#[test]
fn dropping_the_arena_drops_every_record_exactly_once() {
    let ledger = DropLedger::new(100);
    let collector = Collector::new();
    let handle = collector.register();
    let arena = SlotArena::with_config(small(&collector, 2, 16)).unwrap();
    let keys: Vec<_> = (0..100)
        .map(|i| arena.insert(ledger.record(i)).unwrap())
        .collect();
    {
        let guard = handle.pin();
        for key in keys.iter().step_by(3) {
            arena.remove(*key, &guard).unwrap();
        }
    }
    drop(arena);
    drop(handle);
    drop(collector); // runs every batch still queued in the collector
    ledger.assert_exactly_once(0..100);
}

/// A thread's removal batch fills, is taken and starts again, over and over, with partial
/// batches flushed between: every removed value is dropped exactly once, and no slot comes
/// back twice (two live keys never share an index).
#[test]
fn full_and_partial_batches_recycle_each_slot_once() {
    const VALUES: usize = 40;
    let ledger = DropLedger::new(2 * VALUES);
    let collector = Collector::new();
    let arena = SlotArena::with_config(small(&collector, 4, 3)).unwrap();
    let mut keys: Vec<_> = (0..VALUES)
        .map(|i| arena.insert(ledger.record(i)).unwrap())
        .collect();
    for (n, key) in keys.drain(..).enumerate() {
        if n % 2 == 0 {
            arena.discard(key).unwrap();
        } else {
            arena.remove(key, &arena.pin()).unwrap();
        }
        if n % 7 == 6 {
            arena.flush(&arena.pin()).unwrap(); // a partial batch, now and then
        }
    }
    for _ in 0..1000 {
        if ledger.total() == VALUES {
            break;
        }
        arena.flush(&arena.pin()).unwrap();
    }
    ledger.assert_exactly_once(0..VALUES);
    let again: Vec<_> = (VALUES..2 * VALUES)
        .map(|i| arena.insert(ledger.record(i)).unwrap())
        .collect();
    let indices: HashSet<u32> = again.iter().map(|key| key.index()).collect();
    assert_eq!(indices.len(), VALUES, "a slot was handed out twice");
    drop(arena);
    ledger.assert_exactly_once(0..2 * VALUES);
}

/// While a reader stays pinned, no grace period ends, and the removals of a busy thread pile
/// up in the collector's queue (a batch of 1: one deferred function per removal, a bag per 8).
/// Once the reader unpins, a few flushes drop them all: a flush collects again while that
/// moves this arena's batches, instead of running one collection's 8 bags. The reader's
/// thread stays alive through the flushes: crossbeam-epoch pins an exiting thread's handle
/// once more to hand its last bag over, and a flush meanwhile cannot end a grace period
/// (with other tests running beside it, 3 runs of the suite in 60 failed that way).
#[test]
fn a_few_flushes_drop_a_backlog_built_while_a_reader_was_pinned() {
    let values = scaled(4000);
    let ledger = DropLedger::new(values);
    let collector = Collector::new();
    let arena = SlotArena::with_config(small(&collector, 64, 1)).unwrap();
    let [pinned, unpin, unpinned, flushed] = [(); 4].map(|()| std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            let guard = arena.pin();
            pinned.wait();
            unpin.wait();
            drop(guard);
            unpinned.wait();
            flushed.wait();
        });
        pinned.wait();
        for i in 0..values {
            let key = arena.insert(ledger.record(i)).unwrap();
            arena.remove(key, &arena.pin()).unwrap();
        }
        let early = ledger.total();
        unpin.wait();
        unpinned.wait();
        for _ in 0..4 {
            arena.flush(&arena.pin()).unwrap();
        }
        // Checked after the scope, so that a failure does not leave the reader waiting.
        flushed.wait();
        assert_eq!(early, 0, "dropped while a reader was pinned");
    });
    ledger.assert_exactly_once(0..values);
}

#[test]
fn take_returns_the_value_and_frees_the_slot_at_once() {
    let mut arena = SlotArena::new();
    let key = arena.insert(vec![1, 2, 3]).unwrap();
    assert_eq!(arena.take(key).unwrap(), vec![1, 2, 3]);
    assert!(matches!(
        arena.take(key),
        Err(ArenaError::Stale {
            phase: SlotPhase::Vacant,
            ..
        })
    ));
    let again = arena.insert(vec![4]).unwrap();
    assert_eq!(again.index(), key.index());
    assert_eq!(again.generation(), key.generation() + 1);
}

#[test]
fn shrink_releases_free_trailing_pages_and_keeps_keys_stale() {
    let collector = Collector::new();
    let handle = collector.register();
    let mut arena = SlotArena::with_config(small(&collector, 4, 4)).unwrap();
    let keys: Vec<_> = (0..60u32).map(|i| arena.insert(i).unwrap()).collect();
    let before = arena.capacity();
    assert_eq!(before, 4 + 8 + 16 + 32);
    {
        let guard = handle.pin();
        for key in &keys[4..] {
            arena.remove(*key, &guard).unwrap();
        }
    }
    // Let the collector reclaim every batch, then shrink.
    for _ in 0..scaled(100) {
        handle.pin().flush();
    }
    let released = arena.shrink();
    assert_eq!(released, 8 + 16 + 32, "all but the first page go back");
    assert_eq!(arena.capacity(), 4);
    let guard = handle.pin();
    for (i, key) in keys.iter().enumerate().take(4) {
        assert_eq!(*arena.get(*key, &guard).unwrap(), i as u32);
    }
    drop(guard);
    // New values reuse the released indices with fresh generations: old keys stay stale.
    let fresh: Vec<_> = (0..56u32)
        .map(|i| arena.insert(1000 + i).unwrap())
        .collect();
    let guard = handle.pin();
    for old in &keys[4..] {
        assert!(
            arena.get(*old, &guard).is_err(),
            "{old:?} resolved after shrink"
        );
    }
    for (i, key) in fresh.iter().enumerate() {
        assert_eq!(*arena.get(*key, &guard).unwrap(), 1000 + i as u32);
    }
}

#[test]
fn for_each_visits_every_live_value_once() {
    let arena = SlotArena::new();
    let keys: Vec<_> = (0..50u32).map(|i| arena.insert(i).unwrap()).collect();
    let guard = arena.pin();
    for key in keys.iter().skip(1).step_by(2) {
        arena.remove(*key, &guard).unwrap();
    }
    let mut seen = Vec::new();
    arena
        .for_each(&guard, |key, value| {
            assert_eq!(key, keys[*value as usize]);
            seen.push(*value);
        })
        .unwrap();
    seen.sort_unstable();
    assert_eq!(seen, (0..50).step_by(2).collect::<Vec<_>>());
    assert_eq!(arena.len(), 25);
}

#[test]
fn invalid_configs_are_typed_errors() {
    let bad_page = SlotArena::<u8>::with_config(ArenaConfig {
        first_page_len: 3,
        ..ArenaConfig::default()
    });
    assert!(matches!(
        bad_page,
        Err(ArenaError::InvalidConfig {
            field: "first_page_len",
            value: 3,
            ..
        })
    ));
    let bad_batch = SlotArena::<u8>::with_config(ArenaConfig {
        removal_batch: 0,
        ..ArenaConfig::default()
    });
    assert!(matches!(
        bad_batch,
        Err(ArenaError::InvalidConfig {
            field: "removal_batch",
            ..
        })
    ));
    let no_slots = SlotArena::<u8>::with_config(ArenaConfig {
        max_slots: 0,
        ..ArenaConfig::default()
    });
    assert!(matches!(
        no_slots,
        Err(ArenaError::InvalidConfig {
            field: "max_slots",
            value: 0,
            ..
        })
    ));
}

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

#[test]
fn works_from_a_thread_local_destructor() {
    struct UsesArenaOnExit(Arc<SlotArena<u64>>, std::sync::mpsc::Sender<bool>);
    impl Drop for UsesArenaOnExit {
        fn drop(&mut self) {
            // Runs while this thread's thread-locals (crossbeam's handle among them) are
            // being destroyed.
            let key = self.0.insert(5).unwrap();
            let ok = self.0.with(key, |v| *v == 5).unwrap();
            let guard = self.0.pin();
            let removed = self.0.remove(key, &guard).map(|v| *v == 5).unwrap();
            drop(guard);
            let key = self.0.insert(6).unwrap();
            let discarded = self.0.discard(key).is_ok() && !self.0.contains(key);
            self.1.send(ok && removed && discarded).unwrap();
        }
    }
    thread_local! {
        static ON_EXIT: std::cell::RefCell<Option<UsesArenaOnExit>> =
            const { std::cell::RefCell::new(None) };
    }
    let arena = Arc::new(SlotArena::new());
    let (tx, rx) = std::sync::mpsc::channel();
    let a = Arc::clone(&arena);
    std::thread::spawn(move || {
        // Touch crossbeam's thread-local first so that it is destroyed before ours... or
        // after: either order must work.
        drop(a.pin());
        ON_EXIT.with(|slot| *slot.borrow_mut() = Some(UsesArenaOnExit(a, tx)));
    })
    .join()
    .unwrap();
    assert!(rx.recv().unwrap());
}

#[test]
fn many_threads_no_fixed_limit() {
    let arena = Arc::new(SlotArena::new());
    let threads = if cfg!(miri) { 4 } else { 64 };
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let arena = Arc::clone(&arena);
            std::thread::spawn(move || {
                let key = arena.insert(t).unwrap();
                assert_eq!(arena.with(key, |v| *v).unwrap(), t);
                key
            })
        })
        .collect();
    let keys: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(arena.len(), threads);
    let guard = arena.pin();
    for (t, key) in keys.iter().enumerate() {
        assert_eq!(*arena.get(*key, &guard).unwrap(), t);
    }
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

/// One thread only inserts, another only removes (and inserts one key of its own per round,
/// so that its shard recycles the removed slots onto its own free list). The inserting
/// thread's shard is dry every round while the other shard holds vacant slots: it claims
/// fresh slots up to `growth_before_stealing`, then takes the other shard's, so the arena
/// stays bounded however long this goes on.
#[test]
fn a_dry_shard_grows_only_within_its_bound() {
    const ROUND: usize = 256;
    let rounds = scaled(200);
    let collector = Collector::new();
    let arena: SlotArena<u64> = SlotArena::with_config(ArenaConfig {
        growth_before_stealing: 8 << 10,
        shards: Some(2), // the two threads on two shards, on every machine
        ..small(&collector, 64, 8)
    })
    .unwrap();
    let (to_remover, keys) = std::sync::mpsc::sync_channel::<Vec<ferropool::Key>>(1);
    let (to_inserter, done) = std::sync::mpsc::sync_channel::<()>(1);
    std::thread::scope(|s| {
        s.spawn(|| {
            for batch in keys {
                let guard = arena.pin();
                for key in batch {
                    arena.remove(key, &guard).unwrap();
                }
                drop(guard);
                let own = arena.insert(0).unwrap();
                arena.remove(own, &arena.pin()).unwrap();
                arena.flush(&arena.pin()).unwrap();
                to_inserter.send(()).unwrap();
            }
        });
        for round in 0..rounds {
            let batch = (0..ROUND).map(|i| arena.insert((round * ROUND + i) as u64).unwrap());
            to_remover.send(batch.collect()).unwrap();
            done.recv().unwrap();
        }
        drop(to_remover);
    });
    // Live keys never exceed one round; what the grace periods hold, the shards' partial
    // batches and the bound (512 slots of 16 bytes per shard) come on top. Unbounded, the
    // inserting shard would claim a round's worth of fresh slots every round.
    let capacity = arena.capacity();
    assert!(
        capacity <= 16 * ROUND as u64,
        "{capacity} slots for at most {ROUND} live keys after {rounds} rounds"
    );
}

/// A thread that removes values and then idles leaves at most 7 full removal batches in its
/// epoch bag, where no other thread can reach them (checked after each of 24 batches); when
/// it exits, they are reclaimed too.
#[test]
fn an_idle_thread_holds_back_at_most_seven_batches() {
    const BATCH: usize = 64;
    const BATCHES: usize = 24;
    let collector = Collector::new();
    let ledger = DropLedger::new(BATCH * BATCHES);
    let arena = SlotArena::with_config(small(&collector, 64, BATCH as u32)).unwrap();
    let keys: Vec<_> = (0..BATCH * BATCHES)
        .map(|id| arena.insert(ledger.record(id)).unwrap())
        .collect();
    let (removed, idle) = std::sync::mpsc::sync_channel::<()>(0);
    let (wake, woken) = std::sync::mpsc::sync_channel::<()>(0);
    std::thread::scope(|s| {
        let arena = &arena;
        s.spawn(move || {
            for batch in keys.chunks(BATCH) {
                for &key in batch {
                    arena.remove(key, &arena.pin()).unwrap();
                }
                removed.send(()).unwrap();
                if woken.recv().is_err() {
                    return; // the test failed
                }
            }
        });
        let wake = wake; // dropped if an assertion fails, so that the remover wakes up
        for batches in 1..=BATCHES {
            idle.recv().unwrap();
            let reachable = BATCH * batches.saturating_sub(7);
            for _ in 0..1000 {
                if ledger.total() >= reachable {
                    break;
                }
                arena.flush(&arena.pin()).unwrap();
                std::thread::yield_now();
            }
            assert!(
                ledger.total() >= reachable,
                "{} values dropped after {batches} full batches, with the remover idle",
                ledger.total()
            );
            wake.send(()).unwrap();
        }
    });
    for _ in 0..1000 {
        if ledger.total() == BATCH * BATCHES {
            break;
        }
        arena.flush(&arena.pin()).unwrap();
    }
    ledger.assert_exactly_once(0..BATCH * BATCHES);
}

/// A claim counts what it allocates: when the next chunk would start a new page (as large as
/// all earlier pages together), a dry shard within a small bound takes another shard's
/// vacant slot instead of doubling the arena for one value.
#[test]
fn a_dry_shard_never_allocates_a_page_past_its_bound() {
    let collector = Collector::new();
    let mut arena: SlotArena<u64> = SlotArena::with_config(ArenaConfig {
        growth_before_stealing: 16 << 10, // the next page would be 4,096 slots: 64 KiB
        shards: Some(2),                  // shards to steal from, on every machine
        ..small(&collector, 64, 8)
    })
    .unwrap();
    let keys: Vec<_> = (0..4032).map(|i| arena.insert(i).unwrap()).collect();
    for key in keys {
        arena.take(key).unwrap(); // vacant at once, on this thread's shard
    }
    assert_eq!(arena.capacity(), 4032);
    // Eight threads alive at once have distinct thread indices, so some work on a shard
    // other than this thread's, where the vacant slots are.
    let arena = &arena;
    let all_alive = std::sync::Barrier::new(8);
    let keys: Vec<_> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    all_alive.wait();
                    arena.insert(7).unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for key in keys {
        assert!(
            key.index() < 4032,
            "a fresh page for one value: slot {}",
            key.index()
        );
    }
    assert_eq!(arena.capacity(), 4032);
}

/// The batches a thread holds back are counted per thread, whatever the arenas: removing 7
/// batches from each of 9 arenas on one collector, then idling, leaves at most 7 in its bag.
#[test]
fn an_idle_thread_holds_back_at_most_seven_batches_across_arenas() {
    const BATCH: usize = 64;
    const ARENAS: usize = 9;
    let collector = Collector::new();
    let ledger = DropLedger::new(BATCH * 7 * ARENAS);
    let arenas: Vec<_> = (0..ARENAS)
        .map(|_| SlotArena::with_config(small(&collector, 64, BATCH as u32)).unwrap())
        .collect();
    let keys: Vec<Vec<_>> = arenas
        .iter()
        .enumerate()
        .map(|(a, arena)| {
            (0..BATCH * 7)
                .map(|i| arena.insert(ledger.record(a * BATCH * 7 + i)).unwrap())
                .collect()
        })
        .collect();
    let (removed, idle) = std::sync::mpsc::sync_channel::<()>(0);
    let (wake, woken) = std::sync::mpsc::sync_channel::<()>(0);
    std::thread::scope(|s| {
        let arenas = &arenas;
        s.spawn(move || {
            for (arena, keys) in arenas.iter().zip(keys) {
                for key in keys {
                    arena.remove(key, &arena.pin()).unwrap();
                }
            }
            removed.send(()).unwrap();
            let _ = woken.recv(); // idle until the main thread has counted
        });
        let wake = wake; // dropped if an assertion fails, so that the remover wakes up
        idle.recv().unwrap();
        let reachable = BATCH * (7 * ARENAS - 7);
        for _ in 0..1000 {
            if ledger.total() >= reachable {
                break;
            }
            for arena in arenas {
                arena.flush(&arena.pin()).unwrap();
            }
            std::thread::yield_now();
        }
        assert!(
            ledger.total() >= reachable,
            "{} of {} values dropped with the remover idle",
            ledger.total(),
            BATCH * 7 * ARENAS
        );
        wake.send(()).unwrap();
    });
}

/// Two threads insert and remove values with nothing to record, never flushing, until
/// `ledger` has counted `dropped` drops (or a million rounds each).
fn churn_until_dropped(
    arena: &SlotArena<Option<common::Tracked>>,
    ledger: &DropLedger,
    dropped: usize,
) {
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..1_000_000 {
                    if ledger.total() == dropped {
                        break;
                    }
                    let key = arena.insert(None).unwrap();
                    arena.remove(key, &arena.pin()).unwrap();
                }
            });
        }
    });
}

/// Values removed by threads that then exit wait in those threads' removal batches; other
/// threads that keep using the arena take those batches (a sweep of idle threads' lanes)
/// without anyone calling `flush`, so the values are dropped.
#[test]
#[cfg_attr(
    miri,
    ignore = "a sweep comes after thousands of operations per thread"
)]
fn values_removed_by_exited_threads_are_dropped_without_a_flush() {
    const THREADS: usize = 16;
    let arena = SlotArena::new();
    let ledger = DropLedger::new(THREADS);
    // Alive at once, so each holds a thread index of its own (and a lane of its own).
    let all_alive = std::sync::Barrier::new(THREADS);
    std::thread::scope(|s| {
        for id in 0..THREADS {
            let (arena, ledger, all_alive) = (&arena, &ledger, &all_alive);
            s.spawn(move || {
                all_alive.wait();
                let key = arena.insert(Some(ledger.record(id))).unwrap();
                arena.remove(key, &arena.pin()).unwrap();
                all_alive.wait();
            });
        }
    });
    churn_until_dropped(&arena, &ledger, THREADS);
    ledger.assert_exactly_once(0..THREADS);
}

/// An idle thread holds at most a chunk of vacant slots in its hand, whatever the removal
/// batch: a thread whose recycled batch of 4,096 slots went whole into its hand made another
/// thread's 4,096 inserts claim 4,096 fresh slots, even with stealing before growing.
#[test]
fn an_idle_thread_holds_at_most_a_chunk_of_vacant_slots() {
    const BATCH: u32 = 4096;
    let ledger = DropLedger::new(BATCH as usize);
    let arena = SlotArena::with_config(ArenaConfig {
        removal_batch: BATCH,
        growth_before_stealing: 0,
        ..ArenaConfig::default()
    })
    .unwrap();
    let (ready, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            let keys: Vec<_> = (0..BATCH as usize)
                .map(|id| arena.insert(Some(ledger.record(id))).unwrap())
                .collect();
            let guard = arena.pin();
            for key in keys {
                arena.remove(key, &guard).unwrap(); // one full batch
            }
            drop(guard);
            for _ in 0..10_000 {
                if ledger.total() == BATCH as usize {
                    break;
                }
                arena.flush(&arena.pin()).unwrap(); // recycled onto this thread's shard
            }
            ledger.assert_exactly_once(0..BATCH as usize);
            let _kept = arena.insert(None).unwrap(); // a chain into this thread's hand
            ready.wait();
            done.wait(); // idle, alive
        });
        ready.wait();
        let top = (0..BATCH)
            .map(|_| arena.insert(None).unwrap().index())
            .max()
            .unwrap();
        done.wait();
        assert!(
            top < BATCH + 2 * 64,
            "4,096 inserts beside 4,095 vacant slots reached slot {top}"
        );
    });
}

/// A thread that only inserts still takes what an exited thread removed: its sweeps hand
/// the batches they take to the collector's shared queue and advance the epoch, and recycle
/// every shard's ready batches (the remover's shard has no thread left to do it).
#[test]
#[cfg_attr(
    miri,
    ignore = "a sweep comes after thousands of operations per thread"
)]
fn an_inserting_only_thread_drops_what_an_exited_thread_removed() {
    const REMOVED: usize = 10;
    let arena = SlotArena::new();
    let ledger = DropLedger::new(REMOVED);
    let removed = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        // The producer holds its own thread index (and lane) before the remover starts, so
        // the remover's index, and likely its shard, differ from the producer's.
        s.spawn(|| {
            arena.insert(None).unwrap();
            removed.wait();
            for _ in 0..1_000_000 {
                if ledger.total() == REMOVED {
                    break;
                }
                arena.insert(None).unwrap();
            }
        });
        std::thread::scope(|s| {
            s.spawn(|| {
                let keys: Vec<_> = (0..REMOVED)
                    .map(|id| arena.insert(Some(ledger.record(id))).unwrap())
                    .collect();
                let guard = arena.pin();
                for key in keys {
                    arena.remove(key, &guard).unwrap();
                }
            });
        });
        removed.wait();
    });
    ledger.assert_exactly_once(0..REMOVED);
}

/// A thread that only removes (keys another thread inserted) leaves a batch and no hand in
/// its cache when it exits; the sweeps of a thread that only inserts take that batch, seeing
/// that it did not change since they last looked, and its values are dropped without a flush.
#[test]
#[cfg_attr(
    miri,
    ignore = "a sweep comes after thousands of operations per thread"
)]
fn a_batch_left_without_a_hand_is_swept() {
    const REMOVED: usize = 10;
    let arena = SlotArena::new();
    let ledger = DropLedger::new(REMOVED);
    let keys: Vec<_> = (0..REMOVED)
        .map(|id| arena.insert(Some(ledger.record(id))).unwrap())
        .collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            for key in keys {
                arena.discard(key).unwrap();
            }
        });
    });
    for _ in 0..1_000_000 {
        if ledger.total() == REMOVED {
            break;
        }
        arena.insert(None).unwrap();
    }
    ledger.assert_exactly_once(0..REMOVED);
}

/// Sweeps are counted per arena: a thread that works on two arenas in step sweeps both.
#[test]
#[cfg_attr(
    miri,
    ignore = "a sweep comes after thousands of operations per thread"
)]
fn a_thread_working_on_two_arenas_sweeps_both() {
    const REMOVED: usize = 10;
    let (first, second) = (
        SlotArena::new(),
        SlotArena::<Option<common::Tracked>>::new(),
    );
    let ledger = DropLedger::new(REMOVED);
    let (removed, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            let keys: Vec<_> = (0..REMOVED)
                .map(|id| first.insert(Some(ledger.record(id))).unwrap())
                .collect();
            let guard = first.pin();
            for key in keys {
                first.remove(key, &guard).unwrap();
            }
            drop(guard);
            removed.wait();
            done.wait(); // idle meanwhile (its lane is its own, not inherited)
        });
        s.spawn(|| {
            removed.wait();
            for _ in 0..1_000_000 {
                if ledger.total() == REMOVED {
                    break;
                }
                let keys = [first.insert(None).unwrap(), second.insert(None).unwrap()];
                let guard = first.pin();
                first.remove(keys[0], &guard).unwrap();
                second.remove(keys[1], &guard).unwrap();
            }
            done.wait();
        });
    });
    ledger.assert_exactly_once(0..REMOVED);
}

/// A value removed by a thread-local destructor that runs after the thread gave its thread
/// index back waits in its shard's shared batch (the thread has no lane any more); other
/// threads' sweeps take that batch once it stops changing, without a `flush`.
#[test]
#[cfg_attr(
    miri,
    ignore = "a sweep comes after thousands of operations per thread"
)]
fn a_removal_from_a_late_thread_local_destructor_is_swept() {
    const THREADS: usize = 4;
    struct RemoveOnExit(
        &'static SlotArena<Option<common::Tracked>>,
        Option<ferropool::Key>,
    );
    impl Drop for RemoveOnExit {
        fn drop(&mut self) {
            if let Some(key) = self.1.take() {
                self.0.remove(key, &self.0.pin()).unwrap();
            }
        }
    }
    thread_local! {
        static ON_EXIT: std::cell::RefCell<Option<RemoveOnExit>> =
            const { std::cell::RefCell::new(None) };
    }
    // Static (the destructors outlive the test's frame), and reachable, so that leak
    // checkers do not report it.
    static ARENA: std::sync::OnceLock<SlotArena<Option<common::Tracked>>> =
        std::sync::OnceLock::new();
    let arena = ARENA.get_or_init(SlotArena::new);
    let ledger = DropLedger::new(THREADS);
    for id in 0..THREADS {
        let ledger = ledger.clone();
        std::thread::spawn(move || {
            // Registered before the thread claims its index, so (destructors running in
            // reverse order) it runs after the index is given back.
            ON_EXIT.with(|slot| *slot.borrow_mut() = Some(RemoveOnExit(arena, None)));
            let key = arena.insert(Some(ledger.record(id))).unwrap();
            ON_EXIT.with(|slot| slot.borrow_mut().as_mut().unwrap().1 = Some(key));
        })
        .join()
        .unwrap();
    }
    churn_until_dropped(arena, &ledger, THREADS);
    ledger.assert_exactly_once(0..THREADS);
}

/// The slot an insert takes while this thread's own removed slots are on their way back
/// (their grace period not over: the main thread stays pinned) and another thread's batch
/// is ready on the other shard, with `growth_before_stealing` as given. Returns that slot,
/// the other thread's slots, and this thread's.
fn insert_while_awaiting_own(growth_before_stealing: usize) -> (u32, Vec<u32>, Vec<u32>) {
    let collector = Collector::new();
    let arena: SlotArena<u64> = SlotArena::with_config(ArenaConfig {
        shards: Some(2), // this thread's cache is the first (shard 0), the other's shard 1
        growth_before_stealing,
        ..small(&collector, 64, 4)
    })
    .unwrap();
    // A full chunk, so that this thread's hand is empty afterwards.
    let mine: Vec<_> = (0..64).map(|i| arena.insert(i).unwrap()).collect();
    let theirs: Vec<u32> = std::thread::scope(|s| {
        s.spawn(|| {
            let keys: Vec<_> = (0..4).map(|i| arena.insert(100 + i).unwrap()).collect();
            for &key in &keys {
                arena.remove(key, &arena.pin()).unwrap(); // a full batch of 4, deferred
            }
            keys.iter().map(|key| key.index()).collect()
        })
        .join()
        .unwrap()
    });
    // The other thread exited (its epoch bag went to the collector): collections on the
    // collector alone, not through the arena (which would recycle the batch), pass its
    // grace period and put it on the ready list of its shard.
    let handle = collector.register();
    for _ in 0..8 {
        handle.pin().flush();
    }
    let guard = arena.pin(); // held: this thread's own batch cannot come back
    for &key in &mine[..4] {
        arena.remove(key, &guard).unwrap();
    }
    let next = arena.insert(7).unwrap().index();
    drop(guard);
    (next, theirs, mine.iter().map(|key| key.index()).collect())
}

/// A thread whose own removed slots are on their way back claims a fresh chunk rather than
/// take another shard's recycled batch, while its shard may still grow: taking them would
/// move that shard's slots onto this thread's cache lines, and its own come back soon after.
#[test]
fn a_thread_awaiting_its_own_slots_grows_rather_than_takes_a_ready_batch() {
    let growth = ArenaConfig::default().growth_before_stealing;
    let (next, theirs, mine) = insert_while_awaiting_own(growth);
    assert!(
        !theirs.contains(&next),
        "slot {next} taken from the other shard's ready batch {theirs:?}"
    );
    assert!(
        !mine.contains(&next),
        "slot {next} reused during its grace period"
    );
}

/// The same thread, when no fresh chunk fits the growth bound (64 bytes: room for a slot
/// or more, so the bound is not yet reached, but less than a chunk of 64 slots costs), takes
/// the other shard's ready batch after all rather than grow past the bound.
#[test]
fn a_thread_awaiting_its_own_slots_takes_a_ready_batch_past_the_growth_bound() {
    let (next, theirs, mine) = insert_while_awaiting_own(64);
    assert!(
        theirs.contains(&next),
        "slot {next} is not from the other shard's ready batch {theirs:?}: grown past the bound"
    );
    assert!(
        !mine.contains(&next),
        "slot {next} reused during its grace period"
    );
}

/// A page the system refuses is a typed error that hands the value back, with nothing
/// claimed: the process used to abort on the failed allocation. (A first page of 65,536
/// slots of 4 MiB values asks for 256 GiB at once, which a system that does not overcommit
/// without limit refuses.)
#[cfg(not(any(miri, ferropool_sanitizer)))]
#[test]
fn a_page_the_system_refuses_is_a_typed_error() {
    let overcommits = std::fs::read_to_string("/proc/sys/vm/overcommit_memory")
        .is_ok_and(|mode| mode.trim() == "1");
    if overcommits {
        eprintln!("skipped: this system grants any allocation (vm.overcommit_memory = 1)");
        return;
    }
    std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(|| {
            let arena = SlotArena::with_config(ArenaConfig {
                first_page_len: 1 << 16,
                ..ArenaConfig::default()
            })
            .unwrap();
            let (error, value) = arena.try_insert([7u8; 4 << 20]).unwrap_err();
            assert!(
                matches!(error, ArenaError::OutOfMemory { slots: 65_536, .. }),
                "{error:?}"
            );
            assert_eq!(value[0], 7, "the value came back");
            assert_eq!((arena.len(), arena.capacity()), (0, 0));
            assert!(arena.insert([0u8; 4 << 20]).is_err(), "and again");
        })
        .unwrap()
        .join()
        .unwrap();
}
