//! Shards: each thread works on the lists of its own shard, so threads on different shards
//! share no list head. A thread's shard is its *thread index*: a small number, reused after
//! the thread exits, so that the live threads of a process spread over distinct shards.

use crossbeam_utils::CachePadded;

use crate::stack::TaggedStack;
use crate::sync::AtomicU64;

/// One shard's lists. Each head has a cache line of its own.
pub(super) struct Shard {
    /// Vacant slots, ready for `insert`.
    pub(super) free: TaggedStack,
    /// The removal batch being filled: `count << 32 | link` of slots removed but not yet
    /// handed to the epoch collector.
    pub(super) removed: CachePadded<AtomicU64>,
}

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            free: TaggedStack::new(),
            removed: CachePadded::new(AtomicU64::new(0)),
        }
    }
}

/// Shards per arena: the machine's parallelism rounded up to a power of two, at most 64.
/// Two under loom, so that models cover both a thread's own shard and stealing.
pub(super) fn shard_count() -> usize {
    if cfg!(loom) {
        return 2;
    }
    #[cfg(not(loom))]
    {
        static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *COUNT.get_or_init(|| {
            std::thread::available_parallelism()
                .map_or(1, usize::from)
                .next_power_of_two()
                .min(64)
        })
    }
    #[cfg(loom)]
    unreachable!()
}

#[cfg(not(loom))]
pub(crate) use std_index::thread_index;

/// Thread indices for real threads: a registry of free indices, refilled by each thread's
/// exit. Indices only spread contention; two threads may share one (for a moment, when a
/// thread-local is unavailable) without any harm to correctness.
#[cfg(not(loom))]
mod std_index {
    use std::cell::{Cell, RefCell};
    use std::sync::{Mutex, PoisonError};

    /// The next index never handed out, and the indices of exited threads.
    static REGISTRY: Mutex<(usize, Vec<usize>)> = Mutex::new((0, Vec::new()));

    thread_local! {
        /// This thread's index once claimed (`usize::MAX` before). No destructor, so it
        /// stays readable while thread-locals are being destroyed.
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
        /// Gives the index back when the thread exits.
        static OWNER: RefCell<Option<Owner>> = const { RefCell::new(None) };
    }

    struct Owner(usize);

    impl Drop for Owner {
        fn drop(&mut self) {
            let _ = INDEX.try_with(|index| index.set(usize::MAX));
            give_back(self.0);
        }
    }

    fn give_back(index: usize) {
        REGISTRY
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .push(index);
    }

    /// The calling thread's index.
    #[inline]
    pub(crate) fn thread_index() -> usize {
        match INDEX.try_with(Cell::get) {
            Ok(index) if index != usize::MAX => index,
            _ => claim(),
        }
    }

    #[cold]
    fn claim() -> usize {
        let index = {
            let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
            match registry.1.pop() {
                Some(index) => index,
                None => {
                    registry.0 += 1;
                    registry.0 - 1
                }
            }
        };
        let owned = OWNER
            .try_with(|owner| owner.try_borrow_mut().map(|mut o| *o = Some(Owner(index))))
            .is_ok_and(|set| set.is_ok());
        if owned {
            let _ = INDEX.try_with(|cell| cell.set(index));
        } else {
            // Thread-locals are being destroyed: use the index once and give it back.
            give_back(index);
        }
        index
    }
}

/// Under loom the numbering restarts with every execution (a per-execution `lazy_static`),
/// so that replaying a schedule replays the shards.
#[cfg(loom)]
pub(crate) fn thread_index() -> usize {
    use std::cell::Cell;
    loom::lazy_static! {
        static ref NEXT: crate::sync::Mutex<usize> = crate::sync::Mutex::new(0);
    }
    loom::thread_local! {
        static INDEX: Cell<usize> = Cell::new(usize::MAX);
    }
    INDEX.with(|index| {
        if index.get() == usize::MAX {
            let mut next = NEXT.lock().unwrap();
            index.set(*next);
            *next += 1;
        }
        index.get()
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_exited_threads_index_is_reused() {
        let here = thread_index();
        assert_eq!(thread_index(), here, "stable within a thread");
        // Threads run one after the other: each takes the index the one before gave back
        // (other tests' threads may take one now and then).
        let seen: Vec<usize> = (0..20)
            .map(|_| std::thread::spawn(thread_index).join().unwrap())
            .collect();
        assert!(seen.iter().all(|&index| index != here));
        assert!(
            seen.windows(2).any(|pair| pair[0] == pair[1]),
            "no index was reused: {seen:?}"
        );
    }
}
