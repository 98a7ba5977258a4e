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

/// The calling thread's index, for spreading threads over shards: its own index when it has
/// one, else 0 (threads may share a shard).
#[inline]
pub(crate) fn thread_index() -> usize {
    owned_thread_index().unwrap_or(0)
}

#[cfg(not(loom))]
pub(crate) use std_index::owned_thread_index;

/// Thread indices for real threads: a registry of free indices, refilled by each thread's
/// exit. While a thread holds an index, no other thread has it. The registry's storage comes
/// from the system allocator directly, so handing an index back (which runs in a thread-local
/// destructor, under the registry's lock) never calls a global allocator that might itself
/// ask for an index.
#[cfg(not(loom))]
mod std_index {
    use std::cell::{Cell, RefCell};
    use std::sync::{Mutex, PoisonError};

    use crate::paged::PagedTable;
    use crate::sync::{AtomicUsize, Ordering};

    /// The next index never handed out, and how many free indices `FREE` holds.
    static REGISTRY: Mutex<(usize, usize)> = Mutex::new((0, 0));
    /// Free indices (a stack: entries `0..len` of `REGISTRY`), used under its lock.
    static FREE: std::sync::OnceLock<PagedTable<AtomicUsize>> = std::sync::OnceLock::new();

    thread_local! {
        /// This thread's index once claimed (`usize::MAX` before, and after it was given
        /// back). No destructor, so it stays readable while thread-locals are destroyed.
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
        /// Gives the index back when the thread exits.
        static OWNER: RefCell<Option<Owner>> = const { RefCell::new(None) };
    }

    struct Owner(usize);

    impl Drop for Owner {
        fn drop(&mut self) {
            // From now on this thread has no index: operations that need one fall back to
            // paths that share.
            let _ = INDEX.try_with(|index| index.set(usize::MAX));
            let free = FREE.get_or_init(|| PagedTable::new(64));
            let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
            let at = registry.1;
            let (page, _) = free.locate(at as u32);
            free.ensure_page(page, |_| AtomicUsize::new(0));
            free.at(at as u32).store(self.0, Ordering::Relaxed);
            registry.1 += 1;
        }
    }

    /// The calling thread's own index, claiming one on first use; `None` while the thread's
    /// thread-locals are being destroyed (it cannot hold an index then), or if the registry
    /// is busy on this very thread.
    #[inline]
    pub(crate) fn owned_thread_index() -> Option<usize> {
        match INDEX.try_with(Cell::get) {
            Ok(index) if index != usize::MAX => Some(index),
            _ => claim(),
        }
    }

    #[cold]
    fn claim() -> Option<usize> {
        // Only a thread that can register the index's return may hold one.
        let can_own = OWNER
            .try_with(|owner| owner.try_borrow().map(|o| o.is_none()).unwrap_or(false))
            .unwrap_or(false);
        if !can_own {
            return None;
        }
        let index = {
            // `try_lock`: the registry's lock may be held by this thread's own `Owner::drop`.
            let mut registry = REGISTRY.try_lock().ok()?;
            if registry.1 > 0 {
                registry.1 -= 1;
                let free = FREE.get().expect("free indices were stored");
                free.at(registry.1 as u32).load(Ordering::Relaxed)
            } else {
                registry.0 += 1;
                registry.0 - 1
            }
        };
        let _ = OWNER.try_with(|owner| *owner.borrow_mut() = Some(Owner(index)));
        let _ = INDEX.try_with(|cell| cell.set(index));
        Some(index)
    }
}

/// Under loom the numbering restarts with every execution (a per-execution `lazy_static`),
/// so that replaying a schedule replays the shards and slots. Indices are not reused.
#[cfg(loom)]
pub(crate) fn owned_thread_index() -> Option<usize> {
    use std::cell::Cell;
    loom::lazy_static! {
        static ref NEXT: crate::sync::Mutex<usize> = crate::sync::Mutex::new(0);
    }
    loom::thread_local! {
        static INDEX: Cell<usize> = Cell::new(usize::MAX);
    }
    Some(INDEX.with(|index| {
        if index.get() == usize::MAX {
            let mut next = NEXT.lock().unwrap();
            index.set(*next);
            *next += 1;
        }
        index.get()
    }))
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
