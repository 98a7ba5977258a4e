//! One arena, one value at a time: keys, stale keys, discards, pages, configuration and
//! errors, and thread-local destructors.

use super::*;

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
