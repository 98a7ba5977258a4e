//! The arena's unit tests that need its internals.

use super::*;

#[test]
#[cfg_attr(miri, ignore = "2,200 threads: too slow under Miri")]
fn one_thread_with_a_high_index_costs_an_arena_little() {
    crate::thread::on_a_high_index(2_200, || {
        let arena = SlotArena::new();
        let key = arena.insert(1u64).unwrap();
        assert!(
            arena.thread_state_bytes() <= 64 << 10,
            "{} bytes of thread caches for one thread",
            arena.thread_state_bytes()
        );
        let guard = arena.pin();
        assert!(arena.remove(key, &guard).is_ok());
        let fences = crate::sync::asymmetric::heavy_fences_here();
        arena.flush(&guard).unwrap();
        assert_eq!(
            crate::sync::asymmetric::heavy_fences_here() - fences,
            1,
            "one fence per flush"
        );
    });
}

/// `trim` gives the vacant slots it keeps back to the shards they came from, not to the
/// trimming thread's: a thread whose slots went elsewhere would find its shard dry and
/// claim fresh slots.
#[test]
fn trim_gives_vacant_slots_back_to_their_shards() {
    let arena: SlotArena<u32> = SlotArena::with_config(ArenaConfig {
        shards: Some(2), // two on every machine, one CPU included
        ..ArenaConfig::default()
    })
    .unwrap();
    let shards = arena.arena.shards.len();
    assert_eq!(shards, 2);
    let mine = arena.arena.my_shard();
    let other = (mine + 1) % shards;
    // A chunk for the other shard: one slot in hand (so the page stays), the rest listed.
    let _in_hand = arena.arena.claim_fresh(None, other).unwrap();
    assert_eq!(arena.trim(), 0);
    assert!(
        arena.arena.shards[mine].free.is_empty(),
        "moved to the trimming thread"
    );
    assert!(
        !arena.arena.shards[other].free.is_empty(),
        "lost from their shard"
    );
}

/// A slot whose generation would wrap is kept out of use for good: the key issued 2^32
/// generations earlier can never resolve again.
#[test]
fn generation_wrap_exhausts_the_slot() {
    let collector = Collector::new();
    let mut arena = SlotArena::with_config(ArenaConfig {
        first_page_len: 1,
        removal_batch: 2, // so the removal waits in its batch, which `shrink` recycles
        collector: Some(collector.clone()),
        ..ArenaConfig::default()
    })
    .unwrap();
    let first = arena.insert(1u32).unwrap();
    assert_eq!(first.generation(), 0);
    // Fast-forward the slot to its last generation, as 2^32 - 1 reuses would.
    let slot = arena.arena.slots.at(first.index());
    let last = u32::MAX;
    slot.state
        .store(slot::state(last, OCCUPIED), Ordering::SeqCst);
    let old = Key::new(arena.arena.shape.id, first.index(), last);
    arena.remove(old, &arena.pin()).unwrap();
    arena.shrink(); // exclusive: recycles the removal now
    let slot = arena.arena.slots.at(first.index());
    assert_eq!(
        slot::phase(slot.state.load(Ordering::SeqCst)),
        slot::EXHAUSTED
    );
    let next = arena.insert(2u32).unwrap();
    assert_ne!(
        next.index(),
        first.index(),
        "an exhausted slot is never reused"
    );
    let guard = arena.pin();
    assert!(arena.get(first, &guard).is_err());
    assert!(arena.get(old, &guard).is_err());
}
