//! Removed values come back: removal batches, grace periods, idle and exited threads, and
//! the sweeps that take what they left.

use super::*;

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
