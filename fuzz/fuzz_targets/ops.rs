//! Drives arena, group and retain operations from fuzzer bytes and checks every result
//! against a plain model; feeds layouts and tensors extreme sizes, shapes and strides; and
//! fills a second arena with values whose drops panic or re-enter it. Run:
//! `cargo +nightly fuzz run ops` (see fuzz/README.md).
#![no_main]

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use ferropool::{
    AllocationGroup, ArenaConfig, BufferPool, Collector, DescriptorSlot, Layout, RetainedValue,
    SlotArena, Tensor,
};
use libfuzzer_sys::fuzz_target;

/// Sizes at the edges: byte `b` picks one.
fn extreme(b: u8) -> usize {
    match b % 12 {
        0 => 0,
        1 => 1,
        2 => 2,
        3 => 3,
        4 => usize::MAX,
        5 => usize::MAX - 1,
        6 => usize::MAX / 2,
        7 => 1 << 32,
        8 => (1 << 62) + 1,
        9 => 1 << 31,
        10 => usize::MAX / 3,
        _ => usize::from(b),
    }
}

thread_local! {
    /// Whether a `Hostile` drop may re-enter its arena (once per value, at most).
    static REENTER: Cell<bool> = const { Cell::new(true) };
}

/// A value whose drop counts itself, may panic, and may insert into and remove from its own
/// arena (reached through a weak handle, so the arena and its values form no cycle).
struct Hostile {
    counts: Arc<Counts>,
    panics: bool,
    arena: Option<Weak<SlotArena<Hostile>>>,
}

/// Values made and values dropped.
#[derive(Default)]
struct Counts {
    made: AtomicUsize,
    dropped: AtomicUsize,
}

impl Hostile {
    fn new(counts: &Arc<Counts>, panics: bool, arena: Option<Weak<SlotArena<Hostile>>>) -> Self {
        counts.made.fetch_add(1, Ordering::SeqCst);
        Self { counts: Arc::clone(counts), panics, arena }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.counts.dropped.fetch_add(1, Ordering::SeqCst);
        if let Some(arena) = self.arena.take().and_then(|weak| weak.upgrade()) {
            if REENTER.with(|r| r.replace(false)) {
                if let Ok(key) = arena.insert(Hostile::new(&self.counts, false, None)) {
                    let guard = arena.pin();
                    let _ = arena.remove(key, &guard);
                }
                REENTER.with(|r| r.set(true));
            }
        }
        if self.panics {
            panic!("hostile drop");
        }
    }
}

/// A group with the reference contents of each of its live slots.
struct ModelGroup {
    group: AllocationGroup,
    slots: Vec<(DescriptorSlot, Vec<i32>)>,
}

/// libFuzzer's panic hook aborts on every panic. The panics of `Hostile` drops are expected
/// (and caught): let those unwind, abort on any other.
fn expect_hostile_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let fuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&"hostile drop") {
                fuzzer_hook(info);
            }
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    expect_hostile_panics();
    let collector = Collector::new();
    let handle = collector.register();
    let mut arena = SlotArena::with_config(ArenaConfig {
        first_page_len: 2,
        removal_batch: 2,
        collector: Some(collector.clone()),
        ..ArenaConfig::default()
    })
    .unwrap();
    let mut model: HashMap<ferropool::Key, u64> = HashMap::new();
    let mut keys = Vec::new();
    let mut groups: Vec<ModelGroup> = Vec::new();
    let mut retained: Vec<(RetainedValue, Vec<i32>)> = Vec::new();

    let hostile_collector = Collector::new();
    let hostile = Arc::new(
        SlotArena::with_config(ArenaConfig {
            first_page_len: 2,
            removal_batch: 2,
            collector: Some(hostile_collector.clone()),
            ..ArenaConfig::default()
        })
        .unwrap(),
    );
    let counts = Arc::new(Counts::default());
    let mut hostile_keys = Vec::new();
    // A budget keeps valid but huge shapes (tens of GiB) from reaching the system allocator,
    // which AddressSanitizer would answer by aborting instead of returning null.
    let pool = BufferPool::with_config(ferropool::PoolConfig {
        budget: Some(256 << 20),
        ..ferropool::PoolConfig::default()
    })
    .unwrap();

    let mut bytes = data.iter().copied();
    while let (Some(op), Some(raw)) = (bytes.next(), bytes.next()) {
        let arg = usize::from(raw);
        match op % 14 {
            0 => {
                let key = arena.insert(arg as u64).unwrap();
                assert!(model.insert(key, arg as u64).is_none());
                keys.push(key);
            }
            1 if !keys.is_empty() => {
                let key = keys[arg % keys.len()];
                let guard = handle.pin();
                assert_eq!(arena.get(key, &guard).ok().copied(), model.get(&key).copied());
            }
            2 if !keys.is_empty() => {
                let key = keys[arg % keys.len()];
                let guard = handle.pin();
                assert_eq!(arena.remove(key, &guard).ok().copied(), model.remove(&key));
            }
            3 if !keys.is_empty() => {
                let key = keys[arg % keys.len()];
                assert_eq!(arena.take(key).ok(), model.remove(&key));
            }
            4 => {
                let n = 1 + arg % 12;
                let values: Vec<i32> = (0..n as i32).map(|v| v * 3 + arg as i32).collect();
                let tensor = Tensor::from_slice(&values, &[n]).unwrap();
                let (group, slots) = AllocationGroup::from_tensors([tensor]).unwrap();
                groups.push(ModelGroup { group, slots: vec![(slots[0], values)] });
            }
            5 if !groups.is_empty() => {
                // A narrowed view of a random slot of a random group (if it is not shared).
                let count = groups.len();
                let g = &mut groups[arg % count];
                let (slot, values) = g.slots[arg % g.slots.len()].clone();
                let start = arg % values.len();
                let len = 1 + (arg / 7) % (values.len() - start);
                match g.group.narrow(slot, 0, start, len) {
                    Ok(view) => g.slots.push((view, values[start..start + len].to_vec())),
                    Err(ferropool::GroupError::Shared { .. }) => assert!(g.group.handles() > 1),
                    Err(other) => panic!("narrow failed: {other}"),
                }
            }
            6 if !groups.is_empty() => {
                let g = &groups[arg % groups.len()];
                let (slot, values) = g.slots[arg % g.slots.len()].clone();
                retained.push((RetainedValue::from_group(&g.group, slot).unwrap(), values));
            }
            7 if !retained.is_empty() => {
                let (value, expected) = &retained[arg % retained.len()];
                let read = value.tensor_read().unwrap();
                assert_eq!(&read.to_vec::<i32>().unwrap(), expected);
            }
            8 if !retained.is_empty() => {
                let k = arg % retained.len();
                retained.swap_remove(k);
            }
            9 if !groups.is_empty() => {
                // Dropping a group handle: retained values keep reading it.
                let k = arg % groups.len();
                groups.swap_remove(k);
            }
            10 => {
                // Layouts from extreme dimensions, strides and offsets: typed errors or valid
                // layouts whose every element lies within the extent they report.
                let (a, b, c) = (extreme(raw), extreme(op), extreme(raw.rotate_left(3)));
                if let Ok(layout) = Layout::new(&[a, b], &[c, a], b) {
                    let _ = layout.narrow(arg % 2, c, a);
                    let _ = layout.reshape(&[c, b]);
                    let _ = layout.element_offset(&[a.saturating_sub(1), b.saturating_sub(1)]);
                    if let Ok(p) = layout.permute(&[1, 0]) {
                        assert_eq!(p.numel(), layout.numel());
                    }
                }
                let _ = Layout::contiguous(&[a, b, c]);
            }
            11 => {
                // Tensors of extreme shapes from short, exact, long and endless iterators.
                let shape = [extreme(raw), extreme(op.wrapping_add(raw))];
                let n = shape[0].checked_mul(shape[1]);
                let yielded = arg % 4;
                let result = match yielded {
                    // An endless iterator fills a valid shape: keep that shape small.
                    0 if n.is_some_and(|n| n > 1 << 16) => continue,
                    0 => Tensor::from_iter_in(&pool, std::iter::repeat(1u8), &shape),
                    1 => Tensor::from_iter_in(&pool, (0..arg).map(|v| v as u8), &shape),
                    _ => Tensor::from_iter_in(&pool, std::iter::from_fn(|| Some(0i32)).take(arg), &shape),
                };
                if let Ok(tensor) = result {
                    assert_eq!(Some(tensor.numel()), n);
                }
                let _ = Tensor::zeros_in(&pool, ferropool::DType::F64, &shape);
            }
            12 => {
                // A value that may panic when dropped and may re-enter its arena.
                let value = Hostile::new(
                    &counts,
                    arg % 3 == 0,
                    (arg % 2 == 0).then(|| Arc::downgrade(&hostile)),
                );
                match catch_unwind(AssertUnwindSafe(|| hostile.insert(value))) {
                    Ok(Ok(key)) => hostile_keys.push(key),
                    Ok(Err(_)) | Err(_) => {}
                }
            }
            13 if !hostile_keys.is_empty() => {
                let key = hostile_keys.swap_remove(arg % hostile_keys.len());
                let guard = hostile.pin();
                let _ = hostile.remove(key, &guard);
                drop(guard);
                let _ = catch_unwind(AssertUnwindSafe(|| hostile.flush(&hostile.pin())));
            }
            _ => {}
        }
    }
    // Every hostile value, and every child a drop made, is dropped exactly once by the time
    // its arena is gone.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(hostile)));
    drop(hostile_collector);
    assert_eq!(
        counts.dropped.load(Ordering::SeqCst),
        counts.made.load(Ordering::SeqCst),
        "a hostile value dropped other than once"
    );
    for (value, expected) in &retained {
        assert_eq!(&value.tensor_read().unwrap().to_vec::<i32>().unwrap(), expected);
    }
    let guard = handle.pin();
    let mut seen = HashMap::new();
    arena.for_each(&guard, |k, v| { seen.insert(k, *v); }).unwrap();
    assert_eq!(seen, model);
});
