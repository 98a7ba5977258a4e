//! Shards: a dry shard grows only within its bound, then takes another shard's vacant slots;
//! what an idle thread may hold in its hand.

use super::*;

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
