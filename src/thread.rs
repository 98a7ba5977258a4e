//! Per-thread state, in one thread-local: the thread's *index* (a small number, reused after the
//! thread exits, held by one live thread at a time), the pool's and the arena's thread caches it
//! used last (so an operation on the same pool or arena finds its record with this one thread-local
//! read), and the memory tag current on the thread.
//!
//! The state has no destructor, so it stays readable while thread-locals are destroyed. A
//! second thread-local, with a destructor, gives the index back when the thread exits; from
//! then on the thread has no index (operations that need one fall back to shared paths).

#[cfg(not(loom))]
pub(crate) use std_state::*;

/// The calling thread's index, for spreading threads over shards: its own index when it has
/// one, else 0 (threads may share a shard).
#[inline]
pub(crate) fn index_or_zero() -> usize {
    index().unwrap_or(0)
}

#[cfg(not(loom))]
mod std_state {
    use std::cell::{Cell, RefCell};
    use std::sync::{Mutex, PoisonError};

    use crate::paged::PagedTable;
    use crate::sync::{AtomicUsize, Ordering};

    /// The next index never handed out, and how many free indices `FREE` holds.
    static REGISTRY: Mutex<(usize, usize)> = Mutex::new((0, 0));
    /// Free indices (a stack: entries `0..len` of `REGISTRY`), used under its lock. Its
    /// storage comes from the system allocator directly, so giving an index back (in a
    /// thread-local destructor, under the lock) never calls a global allocator that might
    /// itself ask for an index.
    static FREE: std::sync::OnceLock<PagedTable<AtomicUsize>> = std::sync::OnceLock::new();

    /// The calling thread's state.
    struct ThreadState {
        /// The thread's index, or `usize::MAX` (before it claims one, and after it gave it
        /// back).
        index: Cell<usize>,
        /// The thread cache of the pool this thread used last.
        pool: Cached,
        /// The thread cache of the arena this thread used last.
        arena: Cached,
        /// The current memory tag (0: none).
        tag: Cell<u32>,
        /// Bookkeeping scopes open on this thread (see [`Bookkeeping`]).
        bookkeeping: Cell<u32>,
    }

    /// One owner's per-thread record (a pool's thread cache, an arena's thread cache) for the
    /// thread's current index, remembered so that the next operation on the same owner finds it
    /// with this one thread-local read.
    struct Cached {
        /// The owner's identity (0: none). Identities are never reused, so a record of an
        /// owner that is gone never matches a live one. Invariant: 0 while the thread's
        /// `index` is `usize::MAX`.
        owner: Cell<u64>,
        /// That owner's record for the thread's index.
        record: Cell<*const ()>,
    }

    impl Cached {
        const fn none() -> Self {
            Self {
                owner: Cell::new(0),
                record: Cell::new(std::ptr::null()),
            }
        }
    }

    thread_local! {
        static STATE: ThreadState = const {
            ThreadState {
                index: Cell::new(usize::MAX),
                pool: Cached::none(),
                arena: Cached::none(),
                tag: Cell::new(0),
                bookkeeping: Cell::new(0),
            }
        };
        /// Gives the index back when the thread exits.
        static OWNER: RefCell<Option<Owner>> = const { RefCell::new(None) };
    }

    struct Owner(usize);

    impl Drop for Owner {
        fn drop(&mut self) {
            // From now on this thread has no index (and no remembered thread cache).
            let _ = STATE.try_with(|state| {
                state.index.set(usize::MAX);
                state.pool.owner.set(0);
                state.arena.owner.set(0);
            });
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
    /// thread-locals are being destroyed (it cannot hold an index then).
    #[inline]
    pub(crate) fn index() -> Option<usize> {
        match STATE.try_with(|state| state.index.get()) {
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
            // Blocking is safe: this thread's own `Owner::drop` is the only code of this
            // thread that takes the lock while running, and while it runs `OWNER` is being
            // destroyed, so `can_own` above is false. Under the lock nothing calls a global
            // allocator (the free list's pages come from the system), so no claim can nest.
            let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
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
        let _ = STATE.try_with(|state| state.index.set(index));
        Some(index)
    }

    /// The record `pick` caches for `owner`, with the thread's index, if this thread's last
    /// operation of that kind was on that owner (and it still holds its index).
    #[inline(always)]
    fn cached(pick: fn(&ThreadState) -> &Cached, owner: u64) -> Option<(*const (), usize)> {
        STATE
            .try_with(|state| {
                let cached = pick(state);
                // `Owner::drop` clears every `owner` with the index, so a match implies one.
                (cached.owner.get() == owner).then(|| (cached.record.get(), state.index.get()))
            })
            .ok()
            .flatten()
    }

    /// Caches `record` as this thread's record of `owner` in `pick` (for its current index;
    /// nothing while the thread holds none).
    #[inline]
    fn cache(pick: fn(&ThreadState) -> &Cached, owner: u64, record: *const ()) {
        let _ = STATE.try_with(|state| {
            if state.index.get() != usize::MAX {
                pick(state).owner.set(owner);
                pick(state).record.set(record);
            }
        });
    }

    /// The thread cache remembered for pool `pool`, with the thread's index and its memory
    /// tag: the pool's hot path reads the thread-local state once.
    #[inline(always)]
    pub(crate) fn remembered_pool_cache(pool: u64) -> Option<(*const (), u32, u32)> {
        STATE
            .try_with(|state| {
                // `Owner::drop` clears `owner` with the index, so a match implies one.
                (state.pool.owner.get() == pool).then(|| {
                    let index = state.index.get() as u32;
                    (state.pool.record.get(), index, state.tag.get())
                })
            })
            .ok()
            .flatten()
    }

    /// Remembers `record` as this thread's cache of pool `pool`.
    #[inline]
    pub(crate) fn remember_pool_cache(pool: u64, record: *const ()) {
        cache(|state| &state.pool, pool, record);
    }

    /// The thread cache remembered for arena `arena`, with the thread's index.
    #[inline(always)]
    pub(crate) fn remembered_arena_cache(arena: u64) -> Option<(*const (), usize)> {
        cached(|state| &state.arena, arena)
    }

    /// Remembers `cache` as this thread's cache in arena `arena`.
    #[inline]
    pub(crate) fn remember_arena_cache(arena: u64, record: *const ()) {
        cache(|state| &state.arena, arena, record);
    }

    /// Whether a [`Bookkeeping`] scope is open on this thread.
    #[inline]
    pub(crate) fn in_bookkeeping() -> bool {
        STATE
            .try_with(|state| state.bookkeeping.get() > 0)
            .unwrap_or(false)
    }

    /// While it lives, the calling thread builds a pool's own bookkeeping (an export of its
    /// trace or blocks): `PoolAllocator` serves the thread's large requests from its
    /// fallback allocator instead of the pool, so the export neither comes from nor counts
    /// against the pool it describes. Scopes nest.
    #[derive(Debug)]
    pub(crate) struct Bookkeeping {
        /// Not `Send`: it closes the scope of the thread that opened it.
        _not_send: std::marker::PhantomData<*const ()>,
    }

    impl Bookkeeping {
        pub(crate) fn open() -> Self {
            let _ = STATE.try_with(|state| {
                state
                    .bookkeeping
                    .set(state.bookkeeping.get().saturating_add(1))
            });
            Self {
                _not_send: std::marker::PhantomData,
            }
        }
    }

    impl Drop for Bookkeeping {
        fn drop(&mut self) {
            let _ = STATE.try_with(|state| {
                state
                    .bookkeeping
                    .set(state.bookkeeping.get().saturating_sub(1))
            });
        }
    }

    /// The memory tag current on this thread (0: none).
    #[inline(always)]
    pub(crate) fn tag() -> u32 {
        STATE.try_with(|state| state.tag.get()).unwrap_or(0)
    }

    /// Sets the current memory tag; returns the previous one.
    pub(crate) fn set_tag(tag: u32) -> u32 {
        STATE.try_with(|state| state.tag.replace(tag)).unwrap_or(0)
    }
}

/// Under loom the numbering restarts with every execution (a per-execution `lazy_static`),
/// so that replaying a schedule replays the shards and thread caches. Indices are not reused; no
/// thread cache is remembered.
#[cfg(loom)]
pub(crate) fn index() -> Option<usize> {
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

#[cfg(loom)]
pub(crate) fn remembered_pool_cache(_pool: u64) -> Option<(*const (), u32, u32)> {
    None
}

#[cfg(loom)]
pub(crate) fn remember_pool_cache(_pool: u64, _record: *const ()) {}

#[cfg(loom)]
pub(crate) fn remembered_arena_cache(_arena: u64) -> Option<(*const (), usize)> {
    None
}

#[cfg(loom)]
pub(crate) fn remember_arena_cache(_arena: u64, _record: *const ()) {}

/// Under loom there is no global allocator front end: bookkeeping scopes do nothing.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct Bookkeeping;

#[cfg(loom)]
impl Bookkeeping {
    pub(crate) fn open() -> Self {
        Self
    }
}

#[cfg(loom)]
pub(crate) fn tag() -> u32 {
    0
}

#[cfg(loom)]
pub(crate) fn set_tag(_tag: u32) -> u32 {
    0
}

/// Held by the unit tests that watch or flood thread indices, so that they do not run at
/// once: one test's 2,200 live threads take every index another test waits to see reused.
#[cfg(all(test, not(loom)))]
pub(crate) static INDEX_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(all(test, not(loom)))]
/// Runs `f` on a thread whose thread index is at least `threads - 1`: `threads` threads
/// claim an index each and wait until the one with the highest index has run `f`.
pub(crate) fn on_a_high_index(threads: usize, f: impl Fn() + Send + Sync) {
    // Not while the index-reuse test watches indices (this floods them).
    let _alone = INDEX_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let barrier = std::sync::Barrier::new(threads);
    let highest = std::sync::Mutex::new(0usize);
    let done = std::sync::Barrier::new(threads);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn_scoped(scope, || {
                    let index = index().expect("a live thread has an index");
                    {
                        let mut highest = highest.lock().unwrap();
                        *highest = (*highest).max(index);
                    }
                    barrier.wait();
                    // A failure must end the test, not leave the others waiting.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        if *highest.lock().unwrap() == index {
                            assert!(index + 1 >= threads);
                            f();
                        }
                    }));
                    done.wait();
                    if let Err(panic) = outcome {
                        std::panic::resume_unwind(panic);
                    }
                })
                .unwrap();
        }
    });
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The calling thread's index (a live thread always gets one).
    fn claimed() -> usize {
        index().expect("a live thread holds an index")
    }

    #[test]
    fn an_exited_threads_index_is_reused() {
        let _alone = INDEX_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let here = claimed();
        assert_eq!(index(), Some(here), "stable within a thread");
        // Threads run one after the other: each takes the index the one before gave back
        // (other tests' threads may take one now and then).
        let seen: Vec<usize> = (0..20)
            .map(|_| std::thread::spawn(claimed).join().unwrap())
            .collect();
        assert!(seen.iter().all(|&i| i != here));
        assert!(
            seen.windows(2).any(|pair| pair[0] == pair[1]),
            "no index was reused: {seen:?}"
        );
    }

    #[test]
    fn remembered_caches_answer_only_for_their_pool_or_arena() {
        let marker = 7u8;
        let here = claimed();
        remember_pool_cache(u64::MAX - 1, std::ptr::from_ref(&marker).cast());
        assert!(remembered_pool_cache(u64::MAX - 1).is_some());
        assert!(remembered_pool_cache(u64::MAX - 2).is_none());
        remember_arena_cache(u64::MAX - 3, std::ptr::from_ref(&marker).cast());
        assert_eq!(
            remembered_arena_cache(u64::MAX - 3),
            Some((std::ptr::from_ref(&marker).cast(), here))
        );
        assert!(remembered_arena_cache(u64::MAX - 4).is_none());
        assert!(
            remembered_pool_cache(u64::MAX - 1).is_some(),
            "one cache each"
        );
        assert_eq!(set_tag(5), 0);
        assert_eq!(tag(), 5);
        assert_eq!(set_tag(0), 5);
    }
}
