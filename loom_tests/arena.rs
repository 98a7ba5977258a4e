//! Loom models of the `SlotArena` protocol.
//!
//! Run with `scripts/loom.sh` (bound 2, release, debug assertions on). crossbeam-epoch runs
//! inside the model (`--cfg crossbeam_loom` and its `loom` feature), so the grace period
//! itself is explored, not assumed. Every model uses a private `Collector`: a failing model
//! then fails cleanly instead of aborting the test binary in a destructor.
//!
//! Removed values are dropped when a later arena call recycles their batch (an insert that
//! needs a slot, `flush`, `shrink`) or when the arena drops; the models count drops to
//! check that every record is dropped exactly once, and never while a reader holds it.
//!
//! Each model names the property it checks and the bug it catches: a patch in
//! `loom_tests/planted/` that `scripts/loom.sh --planted` applies to a scratch copy of the
//! crate, where the model must fail.
#![cfg(loom)]

mod common;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use ferropool::{ArenaConfig, ArenaError, Collector, Key, SlotArena};

/// A record that counts its drops and whose reads check it has not been dropped.
struct Record {
    value: usize,
    drops: Arc<AtomicUsize>,
}

impl Record {
    fn new(value: usize, drops: &Arc<AtomicUsize>) -> Self {
        Self {
            value,
            drops: Arc::clone(drops),
        }
    }

    /// Reads the record as a reader would, failing if its destructor has already run.
    fn read(&self) -> usize {
        assert_eq!(
            self.drops.load(Ordering::SeqCst),
            0,
            "a reader saw a dropped record"
        );
        self.value
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs a model. An arena call makes many atomic accesses (the epoch pin, the thread's lane,
/// the shard's lists), so an execution may take more branches than loom's default of 1,000.
fn model(f: impl Fn() + Send + Sync + 'static) {
    common::model(10_000, f);
}

/// An arena whose every removal is a full batch. A dry shard takes other shards' vacant
/// slots before it claims fresh ones (`growth_before_stealing: 0`), so that the models cover
/// stealing; `arena_growing_first` keeps the default.
fn arena(collector: &Collector, first_page_len: u32) -> SlotArena<Record> {
    SlotArena::with_config(arena_config(collector, first_page_len)).unwrap()
}

/// The configuration of [`arena`].
fn arena_config(collector: &Collector, first_page_len: u32) -> ArenaConfig {
    ArenaConfig {
        first_page_len,
        removal_batch: 1,
        growth_before_stealing: 0,
        collector: Some(collector.clone()),
        ..ArenaConfig::default()
    }
}

/// As [`arena`], with a dry shard claiming fresh slots before it takes other shards'.
fn arena_growing_first(collector: &Collector, first_page_len: u32) -> SlotArena<Record> {
    SlotArena::with_config(ArenaConfig {
        first_page_len,
        removal_batch: 1,
        collector: Some(collector.clone()),
        ..ArenaConfig::default()
    })
    .unwrap()
}

/// Advances the collector: two rounds of register, pin and flush move the global epoch two
/// steps past a batch deferred before the call, so it is reclaimed unless another thread is
/// still pinned.
fn drive(collector: &Collector) {
    for _ in 0..2 {
        collector.register().pin().flush();
    }
}

/// Readies `arena` for a race between the main thread's insert and another thread's: one
/// record inserted (it claims slots 0 and 1 for the main thread's shard), removed, and
/// recycled, so slot 0 is vacant on the main shard's free list with slot 1 behind it, and the
/// other thread's shard is empty.
fn vacant_slots_on_the_main_shard(
    arena: &SlotArena<Record>,
    collector: &Collector,
    drops: &Arc<AtomicUsize>,
) {
    let key = arena.insert(Record::new(0, drops)).unwrap();
    arena.remove(key, &collector.register().pin()).unwrap();
    drive(collector);
    arena.flush(&collector.register().pin()).unwrap();
}

/// An arena (removal batches of 1) whose one used slot is vacant again, on the main
/// shard's free list: it holds one page, all vacant, which a `trim` releases (1 slot).
/// Returns it and the slot's stale key.
fn one_vacant_page(collector: &Collector) -> (Arc<SlotArena<Record>>, Key) {
    let mut arena = arena(collector, 1);
    let key = arena
        .insert(Record::new(0, &Arc::new(AtomicUsize::new(0))))
        .unwrap();
    drop(arena.take(key).unwrap());
    (Arc::new(arena), key)
}

/// The main thread inserts record 2 while another thread inserts record 1; returns the keys
/// (the main thread's first).
fn racing_inserts(
    arena: &Arc<SlotArena<Record>>,
    drops: &Arc<AtomicUsize>,
) -> (ferropool::Key, ferropool::Key) {
    let other = {
        let (arena, drops) = (Arc::clone(arena), Arc::clone(drops));
        thread::spawn(move || arena.insert(Record::new(1, &drops)).unwrap())
    };
    let mine = arena.insert(Record::new(2, drops)).unwrap();
    (mine, other.join().unwrap())
}

/// **get racing remove**: a reader pinned while another thread removes the value, drives the
/// collector and recycles what is ready reads either the live value or a typed error, never
/// a dropped record; the record is dropped exactly once.
///
/// Planted bug caught: `free_immediately` (a full batch goes straight to the ready list,
/// skipping the grace period, so the recycler drops the value under the reader).
#[test]
fn get_racing_remove() {
    get_racing_a_removal(|arena, key| {
        let handle = arena.collector().register();
        let guard = handle.pin();
        assert_eq!(arena.remove(key, &guard).unwrap().value, 7);
    });
}

/// **get racing discard**: as above, with the value removed by `discard`, which takes no
/// pin for the removal itself (only to defer the batch it filled): the grace period must
/// still wait for the reader, who pinned before the removal.
///
/// Planted bug caught: `free_immediately`, as above.
#[test]
fn get_racing_discard() {
    get_racing_a_removal(|arena, key| arena.discard(key).unwrap());
}

/// **get racing a discard that waits in a partial batch**: as above, with removal batches of
/// two, so the discarded slot stays in the main thread's cache until the `flush` after it
/// takes the cache and defers the partial batch. That flush pins after the reader did: the
/// grace period it starts must still wait for the reader.
///
/// Planted bug caught: `flush_without_grace` (a flush hands the partial batches it takes
/// from the caches straight to the ready lists, as if a batch that waited in a cache were
/// already past its grace period).
#[test]
fn get_racing_a_discard_flushed_from_a_partial_batch() {
    get_racing_a_removal_in(arena_batching_two, |arena, key| arena.discard(key).unwrap());
}

/// The body of the models above: `remove` runs on the main thread while another thread
/// reads the key under a pin.
fn get_racing_a_removal(remove: fn(&SlotArena<Record>, Key)) {
    get_racing_a_removal_in(|collector| arena(collector, 1), remove);
}

/// [`get_racing_a_removal`] on the arena that `build` makes.
fn get_racing_a_removal_in(
    build: fn(&Collector) -> SlotArena<Record>,
    remove: fn(&SlotArena<Record>, Key),
) {
    model(move || {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(build(&collector));
        let key = arena.insert(Record::new(7, &drops)).unwrap();

        let reader = {
            let (arena, collector) = (Arc::clone(&arena), collector.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                if let Ok(record) = arena.get(key, &guard) {
                    assert_eq!(record.read(), 7);
                }
            })
        };
        remove(&arena, key);
        drive(&collector);
        arena.flush(&collector.register().pin()).unwrap();
        reader.join().unwrap();
        drop(arena);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "dropped other than once");
    });
}

/// **remove racing reinsert**: after a remove, the slot may be recycled and reused by a new
/// insert; a reader holding the old key sees the old value or a typed "not present", never
/// the new value.
///
/// Planted bug caught: `unchecked_generation` (a read checks that the slot is occupied but
/// not the generation, so the old key resolves to the reused slot's new value).
#[test]
fn stale_key_never_sees_a_reinserted_value() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(arena(&collector, 1));
        let old = arena.insert(Record::new(1, &drops)).unwrap();

        let new_drops = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (arena, collector, drops) = (
                Arc::clone(&arena),
                collector.clone(),
                Arc::clone(&new_drops),
            );
            thread::spawn(move || {
                {
                    let handle = collector.register();
                    let guard = handle.pin();
                    arena.remove(old, &guard).unwrap();
                }
                drive(&collector);
                arena.insert(Record::new(2, &drops)).unwrap()
            })
        };
        {
            let handle = collector.register();
            let guard = handle.pin();
            match arena.get(old, &guard) {
                Ok(record) => assert_eq!(record.read(), 1, "stale key resolved to a new value"),
                Err(ArenaError::Stale { .. }) => {}
                Err(other) => panic!("unexpected error {other}"),
            }
        }
        let new = writer.join().unwrap();
        let handle = collector.register();
        let guard = handle.pin();
        assert_eq!(arena.get(new, &guard).unwrap().read(), 2);
        assert!(arena.get(old, &guard).is_err());
    });
}

/// **concurrent inserts grow a new page**: two threads insert into a full arena at once and
/// race to allocate the next page; both values are stored, in distinct slots, and both
/// resolve afterwards.
///
/// Planted bug caught: `page_overwrite` (page publication without compare-exchange, so one
/// thread's page replaces the other's and its value is lost).
#[test]
fn concurrent_inserts_grow_a_page() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(arena(&collector, 1));
        let first = arena.insert(Record::new(0, &drops)).unwrap(); // page 0 (one slot) is full

        let other = {
            let (arena, drops) = (Arc::clone(&arena), Arc::clone(&drops));
            thread::spawn(move || arena.insert(Record::new(1, &drops)).unwrap())
        };
        let mine = arena.insert(Record::new(2, &drops)).unwrap();
        let theirs = other.join().unwrap();
        assert_ne!(mine.index(), theirs.index());
        let handle = collector.register();
        let guard = handle.pin();
        assert_eq!(arena.get(first, &guard).unwrap().read(), 0);
        assert_eq!(arena.get(theirs, &guard).unwrap().read(), 1);
        assert_eq!(arena.get(mine, &guard).unwrap().read(), 2);
        assert_eq!(arena.capacity(), 3);
    });
}

/// **exactly-once drop**: two threads remove the same key at once; exactly one wins, and
/// when the arena is gone every record has been dropped exactly once.
///
/// Planted bug caught: `remove_without_cas` (check-then-store lets both removers win, so the
/// slot is put in two batches and recycled, and its record dropped, twice).
#[test]
fn racing_removes_drop_exactly_once() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(arena(&collector, 2));
        let key = arena.insert(Record::new(5, &drops)).unwrap();
        let bystander = arena.insert(Record::new(6, &drops)).unwrap();

        let other = {
            let (arena, collector) = (Arc::clone(&arena), collector.clone());
            thread::spawn(move || {
                let handle = collector.register();
                let guard = handle.pin();
                arena.remove(key, &guard).is_ok()
            })
        };
        let mine = {
            let handle = collector.register();
            let guard = handle.pin();
            arena.remove(key, &guard).is_ok()
        };
        let theirs = other.join().unwrap();
        assert!(
            mine ^ theirs,
            "exactly one remover wins (mine {mine}, theirs {theirs})"
        );
        assert!(arena.contains(bystander));
        drive(&collector);
        arena.flush(&collector.register().pin()).unwrap();
        drop(arena);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            2,
            "each of the two records dropped once"
        );
    });
}

/// **shrink racing the collector**: the owner shrinks the arena (exclusive access) while
/// another thread drives the collector, which may be moving a removed slot's batch onto the
/// ready list that the shrink is taking at that very moment (another batch is on it
/// already). Each batch is recycled by the shrink or by a later insert, never lost and never
/// recycled twice: the removed slots are reused, and every record is dropped exactly once.
///
/// Planted bug caught: `ready_take_store` (taking a ready list with a load and a store
/// instead of a swap, so a batch pushed in between is lost and its slot never reused).
#[test]
fn shrink_racing_the_collector() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let mut arena = arena(&collector, 1); // page 0: slot 0; page 1: slots 1 and 2
        let kept = arena.insert(Record::new(1, &drops)).unwrap();
        let first = arena.insert(Record::new(2, &drops)).unwrap();
        let second = arena.insert(Record::new(3, &drops)).unwrap();
        arena.remove(first, &collector.register().pin()).unwrap(); // a batch of one
        drive(&collector); // ... now on the ready list
                           // A reader pinned from before the second removal holds its batch in transit until
                           // it unpins, which happens while the driver runs.
        let reader = collector.register();
        let pinned = reader.pin();
        arena.remove(second, &collector.register().pin()).unwrap();
        let driver = {
            let collector = collector.clone();
            thread::spawn(move || drive(&collector))
        };
        drop(pinned);
        arena.shrink();
        driver.join().unwrap();
        drive(&collector); // whatever the driver could not move yet is ready now
        let fresh = [
            arena.insert(Record::new(4, &drops)).unwrap(),
            arena.insert(Record::new(5, &drops)).unwrap(),
        ];
        {
            let handle = collector.register();
            let guard = handle.pin();
            assert_eq!(arena.get(kept, &guard).unwrap().value, 1);
            assert_eq!(arena.get(fresh[0], &guard).unwrap().value, 4);
            assert_eq!(arena.get(fresh[1], &guard).unwrap().value, 5);
            assert!(arena.get(first, &guard).is_err());
            assert!(arena.get(second, &guard).is_err());
        }
        // Both removed slots were reused: slots 0 to 2, in pages of one and two.
        assert_eq!(arena.capacity(), 3, "a removed slot was never recycled");
        drop(arena);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            5,
            "each record dropped exactly once"
        );
    });
}

/// **an insert steals from another thread's shard**: a slot recycled for the main thread's
/// shard is wanted at once by the main thread's insert and by another thread's insert,
/// whose own shard is empty and which therefore takes it from the main shard. Exactly one of
/// them gets the slot (the other grows the arena), both values are stored in distinct slots,
/// and every record is dropped exactly once.
///
/// Planted bug caught: `stack_pop_store` (a pop that loads the head and stores the next link
/// without compare-exchange, so both inserts take the same slot).
#[test]
fn insert_steals_from_another_shard() {
    model(|| {
        let collector = Collector::new();
        let (old_drops, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let arena = Arc::new(arena(&collector, 2));
        vacant_slots_on_the_main_shard(&arena, &collector, &old_drops);
        let (mine, theirs) = racing_inserts(&arena, &drops);
        assert_ne!(mine.index(), theirs.index(), "two inserts took one slot");
        {
            let handle = collector.register();
            let guard = handle.pin();
            assert_eq!(arena.get(mine, &guard).unwrap().read(), 2);
            assert_eq!(arena.get(theirs, &guard).unwrap().read(), 1);
        }
        drop(arena);
        assert_eq!(
            old_drops.load(Ordering::SeqCst),
            1,
            "the removed record dropped once"
        );
        assert_eq!(
            drops.load(Ordering::SeqCst),
            2,
            "each record dropped exactly once"
        );
    });
}

/// **a dry shard grows before it steals**: as in `insert_steals_from_another_shard`, the
/// main thread's shard holds vacant slots 0 and 1 while another thread, whose shard is
/// empty, inserts at the same time as the main thread. With the default
/// `growth_before_stealing`, that thread claims a fresh chunk rather than taking the main
/// shard's slots: in every interleaving it gets slot 2 and the main thread slot 0.
///
/// Planted bug caught: `steal_before_growing` (the growth bound ignored, so the dry shard
/// takes the main shard's slot).
#[test]
fn a_dry_shard_grows_before_it_steals() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(arena_growing_first(&collector, 2));
        vacant_slots_on_the_main_shard(&arena, &collector, &drops);
        let (mine, theirs) = racing_inserts(&arena, &drops);
        assert_eq!(mine.index(), 0, "the main thread reuses its own slot");
        assert_eq!(theirs.index(), 2, "the dry shard took another shard's slot");
        drop(arena);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            3,
            "each record dropped exactly once"
        );
    });
}

/// Trims on this thread while another thread inserts record 1 and reads it back; then the
/// record still resolves here. Returns its key.
fn trim_beside_an_insert(arena: &Arc<SlotArena<Record>>, drops: &Arc<AtomicUsize>) -> Key {
    let inserter = {
        let (arena, drops) = (Arc::clone(arena), Arc::clone(drops));
        thread::spawn(move || {
            let key = arena.insert(Record::new(1, &drops)).unwrap();
            assert_eq!(arena.with(key, |r| r.read()).unwrap(), 1);
            key
        })
    };
    arena.trim();
    let key = inserter.join().unwrap();
    assert_eq!(arena.with(key, |r| r.read()).unwrap(), 1);
    key
}

/// **trim racing an insert**: one thread trims while another inserts into an arena whose
/// only page is vacant, so the insert pops the page's vacant slot or claims a fresh one at
/// the very moment the trim decides whether the page can go. The insert's value always
/// resolves afterwards (its page was kept, or released before and allocated again), and
/// every record is dropped exactly once.
///
/// Planted bug caught: `trim_unfrozen` (the trim releases pages without freezing the
/// frontier, so a concurrent claim can land in a page it then frees).
#[test]
fn trim_racing_an_insert() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let (arena, _) = one_vacant_page(&collector);
        trim_beside_an_insert(&arena, &drops);
        drop(arena);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the record dropped once");
    });
}

/// **an insert at the cap racing a trim**: an arena capped at 2 slots, both claimed; the
/// main thread holds record 0 and, in its hand, the other slot, vacant. Another thread
/// inserts, finds no list with a vacant slot and no fresh index, while the main thread trims.
/// The trim takes the main thread's hand back to the free lists and holds every list while
/// it decides what to release. The insert must still get the vacant slot, never `Full`:
/// before it says `Full` it takes every thread's hand itself, waits for a drainer holding
/// one, and looks through the lists with the frontier frozen, so that no trim holds them.
///
/// Planted bugs caught: `cap_pops_unfrozen` (the insert at the cap looks through the lists
/// without freezing the frontier), `cap_ignores_drainers` (it does not wait for a drainer
/// holding a hand), `hand_back_before_push` (a drainer ends its claim before the hand is on
/// the lists), `cap_takes_no_hands` (it leaves other threads' hands where they are).
#[test]
fn an_insert_at_the_cap_racing_a_trim() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(
            SlotArena::with_config(ArenaConfig {
                max_slots: 2,
                ..arena_config(&collector, 2)
            })
            .unwrap(),
        );
        let first = arena.insert(Record::new(0, &drops)).unwrap();
        let key = trim_beside_an_insert(&arena, &drops);
        assert_ne!(key.index(), first.index());
        assert!(matches!(
            arena.insert(Record::new(2, &drops)),
            Err(ferropool::ArenaError::Full { capacity: 2 })
        ));
        drop(arena);
        assert_eq!(drops.load(Ordering::SeqCst), 3, "each record dropped once");
    });
}

/// **a trim releases the page a claim allocated**: another thread inserts into an arena
/// whose only page is full, so it allocates the next page and then claims its first slots,
/// while the main thread trims. The trim finds that page past the frontier and releases it,
/// and unfreezes the frontier where it was: the claim, which expects that very frontier, can
/// still succeed, and must then allocate its page again rather than land in one no longer
/// there.
///
/// Planted bug caught: `claim_into_a_released_page` (a claim whose compare-exchange succeeds
/// takes its page to be there).
#[test]
fn a_trim_releases_the_page_a_claim_allocated() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(arena(&collector, 1));
        let first = arena.insert(Record::new(0, &drops)).unwrap();
        trim_beside_an_insert(&arena, &drops);
        assert_eq!(arena.with(first, |r| r.read()).unwrap(), 0);
        drop(arena);
        assert_eq!(drops.load(Ordering::SeqCst), 2, "each record dropped once");
    });
}

/// **a trim releases the page a lost claim allocated**: another thread inserts into an arena
/// whose only page is vacant (on the main shard's free list), claiming a fresh slot before it
/// takes another shard's, so it allocates the next page; the main thread trims meanwhile. A
/// trim that releases the vacant page lowers the frontier below the page the claim allocated,
/// and the claim then claims at the lowered frontier instead. Afterwards, with the record
/// taken out, a `shrink` releases every page: none stays allocated past the frontier with
/// nothing claimed in it.
///
/// Planted bug caught: `trim_keeps_a_lost_claims_page` (a trim keeps every page past the
/// frontier, as if a claim were always about to claim from it).
#[test]
fn a_trim_releases_the_page_a_lost_claim_allocated() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let mut arena = arena_growing_first(&collector, 1);
        let vacant = arena
            .insert(Record::new(0, &Arc::new(AtomicUsize::new(0))))
            .unwrap();
        drop(arena.take(vacant).unwrap());
        let arena = Arc::new(arena);
        let key = trim_beside_an_insert(&arena, &drops);
        let Ok(mut arena) = Arc::try_unwrap(arena) else {
            panic!("the inserting thread has ended")
        };
        drop(arena.take(key).unwrap());
        arena.shrink();
        assert_eq!(arena.capacity(), 0, "every page released");
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the record dropped once");
    });
}

/// **a claim whose frontier a trim brought back**: another thread inserts into an arena whose
/// only page is full, so it claims slot 1 at the frontier, while the main thread inserts a
/// record (claiming that slot first, when it wins), removes and recycles it, and trims: the
/// trim releases the page of slot 1 and lowers the frontier back to the value the other
/// thread's claim read. That claim's compare-exchange then succeeds with its page released
/// (or allocated again, by the claim itself racing the trim, with the generations from
/// before the release). Every record resolves afterwards, the removed record's key stays
/// stale, and every record is dropped exactly once.
///
/// Planted bugs caught: `claim_into_a_released_page` (the claim does not allocate its page
/// again when it is gone) and `claim_keeps_a_stale_floor` (the claim hands out the slots of a
/// page allocated with the generation floor from before the release).
#[test]
fn a_claim_whose_frontier_a_trim_brought_back() {
    model(|| {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(arena(&collector, 1));
        let first = arena.insert(Record::new(0, &drops)).unwrap();
        let inserter = {
            let (arena, drops) = (Arc::clone(&arena), Arc::clone(&drops));
            thread::spawn(move || arena.insert(Record::new(1, &drops)).unwrap())
        };
        // Its own drop count: `read` checks the others' stays 0.
        let removed_drops = Arc::new(AtomicUsize::new(0));
        let removed = arena.insert(Record::new(2, &removed_drops)).unwrap();
        arena.remove(removed, &arena.pin()).unwrap();
        drive(&collector);
        arena.trim();
        let inserted = inserter.join().unwrap();
        assert_eq!(arena.with(first, |r| r.read()).unwrap(), 0);
        assert_eq!(arena.with(inserted, |r| r.read()).unwrap(), 1);
        assert!(
            !arena.contains(removed),
            "a key from before the trim resolved"
        );
        drop(arena);
        assert_eq!(drops.load(Ordering::SeqCst), 2, "each record dropped once");
        assert_eq!(
            removed_drops.load(Ordering::SeqCst),
            1,
            "the removed one too"
        );
    });
}

/// **a discard racing a trim**: another thread discards a stale key (without a pin) into
/// the only page while the main thread trims, releasing that page, and then pins and flushes
/// until the page's grace period has passed and it is freed. The discard reports the key
/// stale or out of range, and the page is freed only after the discard's read of its slot
/// (freeing a slot is a write every earlier access must happen before, under loom).
///
/// Planted bug caught: `trim_without_waiting_out` (the trim frees released pages after the
/// grace period alone, which does not wait for an unpinned discard).
#[test]
fn a_discard_racing_a_trim() {
    model(|| {
        let collector = Collector::new();
        let (arena, key) = one_vacant_page(&collector);
        let discarder = {
            let arena = Arc::clone(&arena);
            thread::spawn(move || {
                let result = arena.discard(key);
                assert!(
                    matches!(
                        result,
                        Err(ArenaError::Stale { .. } | ArenaError::OutOfRange { .. })
                    ),
                    "a stale key resolved: {result:?}"
                );
            })
        };
        assert_eq!(arena.trim(), 1, "the vacant page is released");
        // Pin and flush until the page's grace period has passed and it is freed, while the
        // discard may still be running.
        for _ in 0..3 {
            arena.pin().flush();
        }
        discarder.join().unwrap();
    });
}

/// An arena whose removals wait in their thread's lane until two of them fill a batch.
fn arena_batching_two(collector: &Collector) -> SlotArena<Record> {
    SlotArena::with_config(ArenaConfig {
        first_page_len: 4,
        removal_batch: 2,
        growth_before_stealing: 0,
        collector: Some(collector.clone()),
        ..ArenaConfig::default()
    })
    .unwrap()
}

/// **a flush takes a lane its owner is using**: another thread removes two records, each
/// into its own lane's removal batch, while the main thread flushes, which takes every
/// lane's batch (and hand of vacant slots) whatever the lane's owner is doing. Each removed
/// slot ends in exactly one batch: every record is dropped exactly once, and every slot is
/// handed out once afterwards.
///
/// Planted bug caught: `lane_drain_unfenced` (the drain takes a lane without the handshake's
/// fence and wait, so an owner mid-removal links its slot to a batch the drainer just took,
/// and that batch is recycled twice).
#[test]
fn a_flush_takes_a_lane_its_owner_is_using() {
    flush_racing_a_lane_owner(|arena, first, second| {
        let handle = arena.collector().register();
        let guard = handle.pin();
        arena.remove(first, &guard).unwrap();
        arena.remove(second, &guard).unwrap();
    });
}

/// **a flush takes a lane its owner discards into**: as above, with the two removals made
/// by `discard`, which marks the slot and adds it to the lane's batch in one operation of
/// the lane's handshake, without a pin (and pins only to defer the batch it filled).
///
/// Planted bug caught: `lane_drain_unfenced`, as above.
#[test]
fn a_flush_takes_a_lane_its_owner_discards_into() {
    flush_racing_a_lane_owner(|arena, first, second| {
        arena.discard(first).unwrap();
        arena.discard(second).unwrap();
    });
}

/// The body of the two models above: `remove_both` runs on another thread while the main
/// thread flushes.
fn flush_racing_a_lane_owner(remove_both: fn(&SlotArena<Record>, Key, Key)) {
    model(move || {
        let collector = Collector::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let arena = Arc::new(arena_batching_two(&collector));
        let first = arena.insert(Record::new(1, &drops)).unwrap();
        let second = arena.insert(Record::new(2, &drops)).unwrap();
        let remover = {
            let arena = Arc::clone(&arena);
            thread::spawn(move || remove_both(&arena, first, second))
        };
        arena.flush(&collector.register().pin()).unwrap();
        remover.join().unwrap();
        // Whatever batch is still in the lane or in transit: deferred, past its grace period
        // and recycled now.
        arena.flush(&collector.register().pin()).unwrap();
        drive(&collector);
        arena.flush(&collector.register().pin()).unwrap();
        assert_eq!(
            drops.load(Ordering::SeqCst),
            2,
            "each removed record dropped once"
        );
        // The main thread's hand holds slots 2 and 3 (the rest of its chunk); the removed
        // slots 0 and 1 wait on the remover's shard. Four inserts fill the page, each slot
        // once: a slot listed twice would be handed out twice.
        let mut indices: Vec<u32> = (3..7)
            .map(|value| arena.insert(Record::new(value, &drops)).unwrap().index())
            .collect();
        indices.sort_unstable();
        assert_eq!(indices, [0, 1, 2, 3], "every slot handed out once");
        assert_eq!(arena.capacity(), 4);
        drop(arena);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            6,
            "each record dropped exactly once"
        );
    });
}
