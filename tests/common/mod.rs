//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Checks a pool's counters against each other: requested bytes fit in the blocks in use,
/// blocks in use fit in what is reserved, and bytes are in use exactly when some allocation
/// has not been freed. (`cached_bytes` is `reserved - in_use` by definition; tests check it
/// against what a trim actually releases.)
pub(crate) fn assert_pool_consistent(stats: &ferropool::PoolStats) {
    assert!(stats.requested_bytes <= stats.in_use_bytes, "{stats:#?}");
    assert!(stats.in_use_bytes <= stats.reserved_bytes, "{stats:#?}");
    assert_eq!(
        stats.in_use_bytes == 0,
        stats.allocations == stats.frees,
        "{stats:#?}"
    );
}

/// Scales an iteration count down under Miri, where every step is thousands of times slower.
pub(crate) fn scaled(n: usize) -> usize {
    if cfg!(miri) {
        (n / 100).max(4)
    } else {
        n
    }
}

/// Per-id drop counters: proves each record is dropped exactly once.
#[derive(Clone, Debug)]
pub(crate) struct DropLedger(Arc<Vec<AtomicUsize>>);

impl DropLedger {
    pub(crate) fn new(ids: usize) -> Self {
        Self(Arc::new((0..ids).map(|_| AtomicUsize::new(0)).collect()))
    }

    pub(crate) fn record(&self, id: usize) -> Tracked {
        Tracked {
            id,
            ledger: self.clone(),
        }
    }

    pub(crate) fn drops(&self, id: usize) -> usize {
        self.0[id].load(Ordering::SeqCst)
    }

    /// Forgets the drops of `id` (for a value dropped on purpose before its real use).
    pub(crate) fn reset(&self, id: usize) {
        self.0[id].store(0, Ordering::SeqCst);
    }

    pub(crate) fn total(&self) -> usize {
        self.0.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }

    /// Panics unless every id in `ids` was dropped exactly once and no other id was dropped.
    pub(crate) fn assert_exactly_once(&self, ids: impl IntoIterator<Item = usize>) {
        let mut expected = vec![0usize; self.0.len()];
        for id in ids {
            expected[id] += 1;
        }
        for (id, want) in expected.iter().enumerate() {
            assert_eq!(
                self.drops(id),
                *want,
                "record {id} dropped {} times",
                self.drops(id)
            );
        }
    }
}

/// A record that counts its drop in a [`DropLedger`].
#[derive(Debug)]
pub(crate) struct Tracked {
    pub id: usize,
    ledger: DropLedger,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.ledger.0[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

/// Keeps `value` in a thread-local of the calling thread, so that it is dropped when the
/// thread's thread-locals are destroyed. Thread-locals are destroyed in the reverse order of
/// their first use on the thread: call this before the thread first uses a pool (or arena)
/// for a drop that runs after the thread's index is given back, after it for one that runs
/// before.
pub(crate) fn drop_at_thread_exit(value: impl std::any::Any) {
    thread_local! {
        static HELD: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    HELD.with(|held| held.borrow_mut().push(Box::new(value)));
}
