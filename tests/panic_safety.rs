//! User code that panics or re-enters the crate: `Drop` implementations that panic, or that
//! insert into the arena they are being dropped from; iterators and closures that panic.
//! After each, every value has been dropped exactly once, no slot or block is stranded, and
//! the counters still add up.

mod common;

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use common::{assert_pool_consistent, DropLedger};
use ferropool::{
    AllocationGroup, ArenaConfig, BufferPool, CheckpointNode, Collector, RetainedInputMap,
    RetainedValue, SlotArena, Tensor,
};

/// A value that records its drops in a ledger and panics in its drop when told to.
#[derive(Debug)]
struct Bomb {
    id: usize,
    ledger: DropLedger,
    armed: bool,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        // Count first, as a real destructor that panics half-way would have run something.
        drop(self.ledger.record(self.id));
        if self.armed {
            panic!("bomb {} went off", self.id);
        }
    }
}

fn bomb(ledger: &DropLedger, id: usize, armed: bool) -> Bomb {
    Bomb {
        id,
        ledger: ledger.clone(),
        armed,
    }
}

fn quiet<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    catch_unwind(AssertUnwindSafe(f))
}

fn private(collector: &Collector, removal_batch: u32) -> SlotArena<Bomb> {
    SlotArena::with_config(ArenaConfig {
        first_page_len: 8,
        removal_batch,
        collector: Some(collector.clone()),
        ..ArenaConfig::default()
    })
    .unwrap()
}

/// Drives a private collector far enough that every deferred batch has passed its grace
/// period.
fn drive(collector: &Collector) {
    let handle = collector.register();
    for _ in 0..8 {
        handle.pin().flush();
    }
}

/// A removed value whose drop panics is dropped once, not again by the arena's drop (before
/// the fix the chain walk left its slot "awaiting reclamation" and the arena dropped it a
/// second time: with a `Box` field, a double free).
#[test]
fn a_panicking_drop_during_shrink_or_drop_runs_once() {
    for shrink in [false, true] {
        let ledger = DropLedger::new(2);
        let collector = Collector::new();
        let mut arena = private(&collector, 64);
        let key = arena.insert(bomb(&ledger, 0, true)).unwrap();
        arena.insert(bomb(&ledger, 1, false)).unwrap();
        {
            let guard = collector.register().pin();
            arena.remove(key, &guard).unwrap();
        }
        if shrink {
            assert!(
                quiet(|| arena.shrink()).is_err(),
                "the panic surfaces in shrink"
            );
            assert_eq!(ledger.drops(0), 1);
            assert!(quiet(move || drop(arena)).is_ok());
        } else {
            assert!(
                quiet(move || drop(arena)).is_err(),
                "the panic surfaces in drop"
            );
        }
        drop(collector);
        ledger.assert_exactly_once([0, 1]);
    }
}

/// A batch that passed its grace period holds one value whose drop panics: the other seven
/// are dropped too, every slot is reused (capacity stays 8 for 8 new inserts), and the
/// panic surfaces in the arena call that recycled the batch, never inside the epoch
/// collector (before the fix it surfaced in an unrelated guard's `flush`, one value of the
/// eight was dropped, and the other seven slots were stranded).
#[test]
fn a_panicking_drop_in_a_reclaimed_batch_strands_nothing() {
    let ledger = DropLedger::new(16);
    let collector = Collector::new();
    let arena = private(&collector, 8);
    let keys: Vec<_> = (0..8)
        .map(|id| arena.insert(bomb(&ledger, id, id == 3)).unwrap())
        .collect();
    assert_eq!(arena.capacity(), 8);
    {
        let guard = collector.register().pin();
        for &key in &keys {
            arena.remove(key, &guard).unwrap();
        }
    }
    // Collection by the epoch collector never runs user code, so it never panics.
    assert!(quiet(|| drive(&collector)).is_ok());
    let mut panics = 0;
    let mut inserted = 0;
    while inserted < 8 {
        match quiet(|| arena.insert(bomb(&ledger, 8 + inserted, false))) {
            Ok(key) => {
                key.unwrap();
                inserted += 1;
            }
            Err(_) => {
                panics += 1;
                // The value of the insert that surfaced the panic was dropped on the way out.
                assert_eq!(ledger.drops(8 + inserted), 1);
                ledger.reset(8 + inserted);
            }
        }
        assert!(panics <= 1, "the panic surfaces once");
    }
    assert_eq!(panics, 1);
    ledger.assert_exactly_once(0..8);
    assert_eq!(arena.capacity(), 8, "every reclaimed slot was reused");
    assert_eq!(arena.len(), 8);
    drop(arena);
    drop(collector);
    ledger.assert_exactly_once(0..16);
}

/// Two values of one batch panic: both are dropped once and the first panic surfaces; a
/// live value that panics surfaces in the arena's drop.
#[test]
fn two_panicking_drops_in_one_batch_are_both_dropped_once() {
    let ledger = DropLedger::new(4);
    let collector = Collector::new();
    let mut arena = private(&collector, 4);
    let keys: Vec<_> = (0..4)
        .map(|id| arena.insert(bomb(&ledger, id, id != 1)).unwrap())
        .collect();
    {
        let guard = collector.register().pin();
        for &key in &keys[..3] {
            arena.remove(key, &guard).unwrap();
        }
    }
    let payload = quiet(|| arena.shrink()).unwrap_err();
    let message = payload.downcast_ref::<String>().unwrap();
    assert!(
        message == "bomb 0 went off" || message == "bomb 2 went off",
        "{message}"
    );
    ledger.assert_exactly_once(0..3);
    let payload = quiet(move || drop(arena)).unwrap_err();
    assert_eq!(
        payload.downcast_ref::<String>().map(String::as_str),
        Some("bomb 3 went off")
    );
    drop(collector);
    ledger.assert_exactly_once(0..4);
}

static REENTRANT: OnceLock<SlotArena<Reentrant>> = OnceLock::new();
static BUDGET: AtomicUsize = AtomicUsize::new(0);
static DEEPEST: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// A value whose drop inserts a fresh value into the arena it came from and removes it
/// again, while a budget lasts.
struct Reentrant;

impl Drop for Reentrant {
    fn drop(&mut self) {
        let depth = DEPTH.with(|d| {
            d.set(d.get() + 1);
            d.get()
        });
        DEEPEST.fetch_max(depth, Ordering::Relaxed);
        if BUDGET
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
            .is_ok()
        {
            let arena = REENTRANT.get().unwrap();
            let key = arena.insert(Reentrant).unwrap();
            let guard = arena.pin();
            arena.remove(key, &guard).unwrap();
        }
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// A `Drop` that re-enters the arena never nests reclamation inside reclamation: the
/// nesting stays bounded (before the fix it reached 705 levels and overflowed the stack in
/// 1 of 8 to 4 of 10 runs).
#[test]
fn a_reentrant_drop_keeps_recursion_bounded() {
    let arena = REENTRANT.get_or_init(|| {
        SlotArena::with_config(ArenaConfig {
            first_page_len: 8,
            removal_batch: 8,
            collector: None,
            ..ArenaConfig::default()
        })
        .unwrap()
    });
    BUDGET.store(common::scaled(200_000), Ordering::Relaxed);
    // A small stack makes a runaway recursion fail fast instead of by chance.
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            while BUDGET.load(Ordering::Relaxed) > 0 {
                let key = arena.insert(Reentrant).unwrap();
                let guard = arena.pin();
                arena.remove(key, &guard).unwrap();
                drop(guard);
                arena.flush(&arena.pin()).unwrap();
            }
        })
        .unwrap()
        .join()
        .unwrap();
    let deepest = DEEPEST.load(Ordering::Relaxed);
    assert!(deepest >= 1, "the drops ran");
    assert!(deepest <= 2, "drops nested {deepest} deep");
}

/// An iterator that panics half-way through `from_iter_in`: the partly written buffer goes
/// back to the pool.
#[test]
fn a_panicking_iterator_returns_its_buffer() {
    let pool = BufferPool::new();
    let result = quiet(|| {
        Tensor::from_iter_in(
            &pool,
            (0..100).map(|i| {
                if i == 50 {
                    panic!("iterator")
                } else {
                    i as f32
                }
            }),
            &[100],
        )
    });
    assert!(result.is_err());
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.allocations, stats.frees);
    assert_pool_consistent(&stats);
}

/// A caller-owned payload whose drop panics, retained and released: it is dropped once,
/// and the pool's counters are untouched.
#[test]
fn a_panicking_payload_is_dropped_once() {
    #[derive(Debug)]
    struct Payload(DropLedger);
    impl ferropool::ExternalPayload for Payload {
        fn tag(&self) -> u32 {
            7
        }
        fn shape(&self) -> &[usize] {
            &[1]
        }
    }
    impl Drop for Payload {
        fn drop(&mut self) {
            drop(self.0.record(0));
            panic!("payload");
        }
    }
    let ledger = DropLedger::new(1);
    let tensor = Tensor::external(Payload(ledger.clone())).unwrap();
    let retained = RetainedValue::from_tensor(tensor);
    let clone = retained.clone();
    drop(retained);
    assert_eq!(ledger.drops(0), 0);
    assert!(quiet(move || drop(clone)).is_err());
    ledger.assert_exactly_once([0]);
}

/// A chain whose graphs panic when dropped: every node is still dropped exactly once.
#[test]
fn a_chain_with_panicking_graphs_drops_every_node_once() {
    struct Graph(#[allow(dead_code)] Bomb); // held for its drop
    let ledger = DropLedger::new(100);
    let mut chain: Option<Arc<CheckpointNode<Graph, u32, u32>>> = None;
    for id in 0..100 {
        chain = Some(Arc::new(CheckpointNode {
            graph: Arc::new(Graph(bomb(&ledger, id, id % 10 == 5))),
            alias_key: id as u32,
            alias_target: 0,
            old_inputs: Arc::new(RetainedInputMap::new()),
            prev: chain,
        }));
    }
    assert!(quiet(move || drop(chain)).is_err());
    ledger.assert_exactly_once(0..100);
}

/// Groups and retained values built under a budget that refuses half-way: nothing leaks.
#[test]
fn refused_allocations_leave_groups_and_pools_consistent() {
    let pool = BufferPool::with_config(ferropool::PoolConfig {
        budget: Some(64 << 10),
        ..ferropool::PoolConfig::default()
    })
    .unwrap();
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..64 {
        match Tensor::from_slice_in(&pool, &vec![i as f32; 1024], &[32, 32]) {
            Ok(t) => {
                let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
                let view = group.permute(slots[0], &[1, 0]).unwrap();
                held.push(RetainedValue::from_group(&group, view).unwrap());
            }
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 0);
    assert_pool_consistent(&pool.stats());
    drop(held);
    assert_eq!(pool.stats().in_use_bytes, 0);
}

/// Closures that panic inside `with` and `for_each`, and a merge whose chain's inputs panic
/// when read: the arena and the chain are unchanged and keep working.
#[test]
fn panicking_closures_leave_the_arena_as_it_was() {
    let ledger = DropLedger::new(8);
    let collector = Collector::new();
    let arena = private(&collector, 2);
    let keys: Vec<_> = (0..8)
        .map(|id| arena.insert(bomb(&ledger, id, false)).unwrap())
        .collect();
    assert!(quiet(|| arena.with(keys[0], |_| panic!("closure"))).is_err());
    let guard = arena.pin();
    let mut visited = 0;
    assert!(quiet(|| arena.for_each(&guard, |_, _| {
        visited += 1;
        if visited == 4 {
            panic!("closure");
        }
    }))
    .is_err());
    assert_eq!(arena.len(), 8);
    for (id, &key) in keys.iter().enumerate() {
        assert_eq!(arena.get(key, &guard).unwrap().id, id);
    }
    drop(guard);
    drop(arena);
    ledger.assert_exactly_once(0..8);
}

/// An insert recycles a batch whose value panics while dropping, and the value it was given
/// panics when dropped too: the insert drops it inside a catch before resuming the first
/// panic, so the process does not abort with two panics at once (found by the fuzzer).
#[test]
fn an_insert_that_resumes_a_panic_drops_its_own_panicking_value_safely() {
    let ledger = DropLedger::new(3);
    let collector = Collector::new();
    let arena = private(&collector, 1);
    let key = arena.insert(bomb(&ledger, 0, true)).unwrap();
    // Fill the shard's chunk so that the next insert must recycle.
    let fillers: Vec<_> = (0..7)
        .map(|_| arena.insert(bomb(&DropLedger::new(1), 0, false)).unwrap())
        .collect();
    arena.remove(key, &collector.register().pin()).unwrap(); // a batch of one, deferred
    drive(&collector);
    let result = quiet(|| arena.insert(bomb(&ledger, 1, true)));
    assert!(result.is_err(), "the recycled value's panic surfaced");
    assert_eq!(ledger.drops(0), 1);
    assert_eq!(
        ledger.drops(1),
        1,
        "the value given to the insert was dropped once"
    );
    // The slot came back: the next insert takes it without growing the arena.
    let capacity = arena.capacity();
    arena.insert(bomb(&ledger, 2, false)).unwrap();
    assert_eq!(arena.capacity(), capacity);
    drop((fillers, arena));
    ledger.assert_exactly_once(0..3);
}
