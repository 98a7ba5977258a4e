//! Evictable blocks: buffers whose owner lets the pool take them back when its budget refuses
//! a request, and which the owner rebuilds when it next needs them (see
//! [`RetainedValue::evictable`](crate::RetainedValue::evictable), which builds on this).
//!
//! The pool keeps a registry of them. When an allocation through a handle
//! ([`BufferPool::alloc`](super::BufferPool::alloc) and friends, never the global allocator's
//! front end) is refused by the budget, the pool evicts one value at a time, the one with the
//! lowest score among those no reader pins, and tries again: first among the values whose
//! block is of the class the request needs (the freed block serves it directly, so what the
//! pool reserves stays what is live), then among all. The score is Dynamic Tensor
//! Rematerialization's: the cost of recomputing the value, evicted inputs included, over its
//! bytes times its staleness (pool clock ticks since its last pin).
//!
//! Each value's state is a small lock (`Mutex` and `Condvar`), taken by readers, the
//! recomputing thread and the evicting thread, never while allocating or running user code,
//! so no lock is held across a recursive request. The allocation fast path is untouched:
//! eviction starts only once the budget has refused a request.

use std::fmt;
use std::ptr::NonNull;

use super::inner::PoolInner;
use super::{class, OutOfMemory, PoolBuffer, PoolError, PoolEventKind};
use crate::sync::{
    thread_id, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
    ThreadId, UnsafeCell,
};
use crate::thread;

/// Where an evictable value's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// In a block of the pool.
    Resident,
    /// Given back to the pool; a reader must recompute it.
    Evicted,
    /// Being recomputed by one thread; other readers wait for it.
    Recomputing,
}

/// What the lock of an evictable value guards.
#[derive(Debug)]
struct State {
    phase: Phase,
    /// Pins held: reads in progress, and inputs of recomputes in progress. A value with
    /// readers is never evicted.
    readers: usize,
    /// The thread recomputing the value, while the phase is `Recomputing`.
    recomputer: Option<ThreadId>,
}

/// One evictable value as the pool sees it: its block, while resident, and what the eviction
/// policy weighs. Shared (`Arc`) by its owner and the pool's registry.
pub(crate) struct Evictable {
    /// Its entry in the pool's registry (fixed at registration).
    slot: usize,
    /// The class of its block and the block's bytes.
    class: usize,
    bytes: u64,
    /// The cost of recomputing it, in the owner's unit.
    cost: u64,
    /// The evictable values it is recomputed from: their cost counts in its score while
    /// they are evicted too.
    parents: Box<[Arc<Evictable>]>,
    state: Mutex<State>,
    /// Signalled when a recompute ends (in success or failure).
    ready: Condvar,
    /// Whether the phase is `Resident`, for the policy's estimates read without the lock.
    resident: AtomicBool,
    /// The pool clock at its last pin.
    last_use: AtomicU64,
    /// Invariant: `Some` exactly while the phase is `Resident`. Written only with `state`
    /// locked and no reader (an eviction taking it, a recompute storing it); read by whoever
    /// holds a pin (`readers` counts it for the whole read) or the lock.
    buffer: UnsafeCell<Option<PoolBuffer>>,
}

// SAFETY: the buffer is written only under the lock with no reader, and read only under a pin
// or the lock (invariant on `buffer`); a `PoolBuffer` is `Send + Sync`; every other field is
// a lock, an atomic or immutable.
unsafe impl Send for Evictable {}
// SAFETY: as above.
unsafe impl Sync for Evictable {}

impl fmt::Debug for Evictable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evictable")
            .field("bytes", &self.bytes)
            .field("cost", &self.cost)
            .field("resident", &self.resident.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Why a pin could not be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotPinned {
    /// Evicted: the caller may recompute it.
    Evicted,
    /// The calling thread is recomputing it (a recompute that reads its own output).
    RecomputingHere,
}

impl Evictable {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock: a panic while it was held, and none of the sections below can
        // panic between their writes, so the state is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block's bytes (its class size).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the bytes are in a block now (a snapshot).
    pub(crate) fn is_resident(&self) -> bool {
        self.lock().phase == Phase::Resident
    }

    /// Pins the value if it is resident (one more reader); else says why not, waiting first
    /// for a recompute another thread has in flight.
    pub(crate) fn try_pin(&self, pool: &PoolInner) -> Result<(), NotPinned> {
        let mut state = self.lock();
        loop {
            match state.phase {
                Phase::Resident => {
                    state.readers += 1;
                    self.last_use.store(pool.evictor.tick(), Ordering::Relaxed);
                    return Ok(());
                }
                Phase::Evicted => return Err(NotPinned::Evicted),
                Phase::Recomputing if state.recomputer == Some(thread_id()) => {
                    return Err(NotPinned::RecomputingHere)
                }
                Phase::Recomputing => {
                    state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }

    /// Gives a pin back.
    pub(crate) fn unpin(&self) {
        let mut state = self.lock();
        debug_assert!(state.readers > 0, "an unpin without a pin");
        state.readers = state.readers.saturating_sub(1);
    }

    /// Claims the recompute of an evicted value: true if the caller must now recompute it and
    /// then [`fill`](Self::fill) or [`abandon`](Self::abandon) it; false if it is no longer
    /// evicted (the caller tries to pin it again).
    pub(crate) fn claim(&self) -> bool {
        let mut state = self.lock();
        if state.phase != Phase::Evicted {
            return false;
        }
        state.phase = Phase::Recomputing;
        state.recomputer = Some(thread_id());
        true
    }

    /// Ends a claimed recompute with its block: the value is resident, pinned once for the
    /// caller, and the threads waiting for it wake.
    pub(crate) fn fill(&self, pool: &PoolInner, buffer: PoolBuffer) {
        let mut state = self.lock();
        debug_assert_eq!(state.phase, Phase::Recomputing);
        // SAFETY: the lock is held and the value has no reader (it was not resident), as the
        // invariant on `buffer` requires for a write.
        self.buffer.with_mut(|slot| unsafe { *slot = Some(buffer) });
        state.phase = Phase::Resident;
        state.recomputer = None;
        state.readers += 1;
        self.resident.store(true, Ordering::Relaxed);
        self.last_use.store(pool.evictor.tick(), Ordering::Relaxed);
        drop(state);
        self.ready.notify_all();
    }

    /// Ends a claimed recompute that failed: the value is evicted again, and a waiting
    /// thread may try itself.
    pub(crate) fn abandon(&self) {
        let mut state = self.lock();
        debug_assert_eq!(state.phase, Phase::Recomputing);
        state.phase = Phase::Evicted;
        state.recomputer = None;
        drop(state);
        self.ready.notify_all();
    }

    /// The block of a pinned value.
    ///
    /// # Safety
    ///
    /// The caller holds a pin on the value (from [`try_pin`](Self::try_pin) or
    /// [`fill`](Self::fill)) for as long as it uses the reference.
    pub(crate) unsafe fn pinned_buffer(&self) -> &PoolBuffer {
        // SAFETY: the caller's pin keeps the phase `Resident`, so the buffer is `Some` and
        // nobody writes it (invariant on `buffer`).
        self.buffer
            .with(|slot| unsafe { (*slot).as_ref() })
            .expect("a pinned value is resident")
    }

    /// Takes the block of a resident value no reader pins, as the lock-holder `state` shows;
    /// the caller drops it once every lock is released.
    fn take(&self, state: &mut State) -> Option<PoolBuffer> {
        if state.phase != Phase::Resident || state.readers > 0 {
            return None;
        }
        state.phase = Phase::Evicted;
        self.resident.store(false, Ordering::Relaxed);
        // SAFETY: the lock is held (`state` borrows its guard) and there is no reader.
        self.buffer.with_mut(|slot| unsafe { (*slot).take() })
    }

    /// The cost of recomputing the value now: its own, plus that of its evicted ancestors
    /// (DTR's evicted neighbourhood), looked at through at most 64 of them.
    fn cost_now(&self) -> u64 {
        let mut cost = self.cost;
        let mut stack: Vec<&Evictable> = self.parents.iter().map(|p| &**p).collect();
        let mut visited = 0;
        while let Some(parent) = stack.pop() {
            visited += 1;
            if visited > 64 {
                break;
            }
            if !parent.resident.load(Ordering::Relaxed) {
                cost = cost.saturating_add(parent.cost);
                stack.extend(parent.parents.iter().map(|p| &**p));
            }
        }
        cost.max(1)
    }
}

/// The registry of a pool's evictable values, and what eviction counts.
pub(crate) struct Evictor {
    registry: Mutex<Registry>,
    /// Values registered now (read without the lock to skip eviction when there are none).
    registered: AtomicUsize,
    /// The clock of staleness: one tick per pin.
    clock: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) evicted_bytes: AtomicU64,
    pub(super) recomputations: AtomicU64,
    pub(super) recomputed_bytes: AtomicU64,
    pub(super) recompute_ns: AtomicU64,
}

/// The registered values by slot; vacant slots are reused.
#[derive(Default)]
struct Registry {
    slots: Vec<Option<Arc<Evictable>>>,
    vacant: Vec<usize>,
}

impl fmt::Debug for Evictor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evictor")
            .field("registered", &self.registered.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Evictor {
    pub(super) fn new() -> Self {
        Self {
            registry: Mutex::new(Registry::default()),
            registered: AtomicUsize::new(0),
            clock: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            recomputations: AtomicU64::new(0),
            recomputed_bytes: AtomicU64::new(0),
            recompute_ns: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Nothing panics while the registry is locked but a failed allocation of its
        // tables, which leaves it as it was.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// What evictable values held when a request failed: bytes pinned by readers (or recomputes),
/// and bytes resident and unpinned (which the pool could not take: another thread held them
/// for a moment).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Held {
    pub(super) pinned: u64,
    pub(super) evictable: u64,
}

impl PoolInner {
    /// Registers a resident value of `buffer`'s block, recomputed at `cost` from `parents`.
    pub(crate) fn register_evictable(
        &self,
        buffer: PoolBuffer,
        cost: u64,
        parents: Box<[Arc<Evictable>]>,
    ) -> Arc<Evictable> {
        // The registry's own tables are bookkeeping: never from this pool (or any pool
        // behind the global allocator).
        let _scope = thread::Bookkeeping::open();
        let mut registry = self.evictor.lock();
        let slot = match registry.vacant.pop() {
            Some(slot) => slot,
            None => {
                registry.slots.push(None);
                registry.slots.len() - 1
            }
        };
        let value = Arc::new(Evictable {
            slot,
            class: buffer.class(),
            bytes: buffer.capacity() as u64,
            cost,
            parents,
            state: Mutex::new(State {
                phase: Phase::Resident,
                readers: 0,
                recomputer: None,
            }),
            ready: Condvar::new(),
            resident: AtomicBool::new(true),
            last_use: AtomicU64::new(self.evictor.tick()),
            buffer: UnsafeCell::new(Some(buffer)),
        });
        registry.slots[slot] = Some(Arc::clone(&value));
        self.evictor.registered.fetch_add(1, Ordering::Relaxed);
        value
    }

    /// Takes a value out of the registry (its owner is dropping it); its block goes back to
    /// the pool when the last reference drops.
    pub(crate) fn unregister_evictable(&self, value: &Evictable) {
        let entry = {
            let _scope = thread::Bookkeeping::open();
            let mut registry = self.evictor.lock();
            let entry = registry.slots.get_mut(value.slot).and_then(Option::take);
            if entry.is_some() {
                registry.vacant.push(value.slot);
                self.evictor.registered.fetch_sub(1, Ordering::Relaxed);
            }
            entry
        };
        drop(entry); // outside the lock: it may be the last reference, and free the block
    }

    /// Evicts the value of `value` now if it is resident and unpinned; whether it did.
    pub(crate) fn evict_now(&self, value: &Evictable) -> bool {
        let taken = value.take(&mut value.lock());
        self.evicted(taken)
    }

    /// Counts an eviction and gives its block back (no lock held).
    fn evicted(&self, taken: Option<PoolBuffer>) -> bool {
        let Some(buffer) = taken else {
            return false;
        };
        let (bytes, class) = (buffer.capacity() as u64, buffer.class());
        drop(buffer);
        self.evictor.evictions.fetch_add(1, Ordering::Relaxed);
        self.evictor
            .evicted_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        self.trace(PoolEventKind::Evict, bytes, class);
        true
    }

    /// Counts a recompute of `bytes` that took `ns` nanoseconds.
    pub(crate) fn count_recompute(&self, bytes: u64, ns: u64) {
        let evictor = &self.evictor;
        evictor.recomputations.fetch_add(1, Ordering::Relaxed);
        evictor.recomputed_bytes.fetch_add(bytes, Ordering::Relaxed);
        evictor.recompute_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Evicts the unpinned resident value with the lowest score, preferring blocks of
    /// `class`; the bytes and class of the block given back, or `None` if no value could be
    /// evicted. A value whose lock is busy this instant (a reader pinning or unpinning it), or
    /// that a reader pins between the choice and the take, makes it look again, a bounded
    /// number of times: a refusal is not decided by another thread's timing.
    fn evict_one(&self, class: usize) -> Option<(u64, usize)> {
        const LOOKS: usize = 64;
        for _ in 0..LOOKS {
            match self.try_evict_one(class) {
                Looked::Evicted(freed) => return Some(freed),
                Looked::Nothing => return None,
                Looked::Busy => crate::sync::yield_now(),
            }
        }
        None
    }

    /// One look at the registry for [`evict_one`](Self::evict_one).
    fn try_evict_one(&self, class: usize) -> Looked {
        let mut busy = false;
        let taken = {
            let registry = self.evictor.lock();
            let now = self.evictor.clock.load(Ordering::Relaxed);
            // (score, same class, value): the lowest score among the values of `class`, or
            // among all if none of `class` can go.
            let mut best: Option<(f64, bool, &Arc<Evictable>)> = None;
            for value in registry.slots.iter().flatten() {
                let Ok(state) = value.state.try_lock() else {
                    busy = true;
                    continue; // busy this instant: a reader or a recompute is on it
                };
                if state.phase != Phase::Resident || state.readers > 0 {
                    continue;
                }
                drop(state);
                let stale = now.saturating_sub(value.last_use.load(Ordering::Relaxed)) + 1;
                let score = value.cost_now() as f64 / (value.bytes as f64 * stale as f64);
                let same = value.class == class;
                let better = match best {
                    None => true,
                    Some((s, best_same, _)) => (same, -score) > (best_same, -s),
                };
                if better {
                    best = Some((score, same, value));
                }
            }
            let Some((_, _, value)) = best else {
                return if busy { Looked::Busy } else { Looked::Nothing };
            };
            let taken = value.take(&mut value.lock());
            // Pinned since it was chosen: look again.
            let Some(buffer) = taken else {
                return Looked::Busy;
            };
            (buffer, Arc::clone(value))
        };
        let (buffer, _value) = taken;
        let freed = (buffer.capacity() as u64, buffer.class());
        self.evicted(Some(buffer));
        Looked::Evicted(freed)
    }

    /// What the registered values hold: pinned bytes, and unpinned resident bytes.
    pub(super) fn evictables_held(&self) -> Held {
        let mut held = Held::default();
        if self.evictor.registered.load(Ordering::Relaxed) == 0 {
            return held;
        }
        let registry = self.evictor.lock();
        for value in registry.slots.iter().flatten() {
            let state = value.lock();
            match (state.phase, state.readers) {
                (Phase::Resident, 0) => held.evictable += value.bytes,
                (Phase::Resident, _) => held.pinned += value.bytes,
                _ => {}
            }
        }
        held
    }

    /// Allocates through a handle (or a buffer's `alloc_sibling`): a request the budget
    /// refuses evicts values until it fits (see [`alloc_evicting`](Self::alloc_evicting)).
    /// The fast path is [`alloc`](Self::alloc)'s with one more branch on its result.
    #[inline]
    pub(super) fn alloc_or_evict(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
    ) -> Result<PoolBuffer, PoolError> {
        match PoolInner::alloc(this, size, zeroed) {
            Err(PoolError::BudgetExceeded(report)) => {
                PoolInner::alloc_evicting(this, size, zeroed, report)
            }
            served => served,
        }
    }

    /// An allocation the budget refused with `report`: evicts values until it is served or
    /// none is left to evict, then fails with the report of the last try, which says what
    /// the values still held.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_evicting(
        this: NonNull<PoolInner>,
        size: usize,
        zeroed: bool,
        mut report: Box<OutOfMemory>,
    ) -> Result<PoolBuffer, PoolError> {
        // SAFETY: the caller holds a handle or a live buffer of the pool.
        let inner = unsafe { this.as_ref() };
        // Whatever the eviction allocates (the search's short list) goes to the global
        // front end's fallback, if that front end is ferropool's: never back into this pool
        // while this thread holds the registry's lock.
        let _scope = thread::Bookkeeping::open();
        let class = class::class_of(size).expect("a request the budget refused has a class");
        if inner.evictor.registered.load(Ordering::Relaxed) > 0 {
            // Bytes to free before the next try: what the budget lacked, unless a block of
            // the class itself comes back (it serves the request directly).
            let mut freed = 0u64;
            while let Some((bytes, evicted_class)) = inner.evict_one(class) {
                freed = freed.saturating_add(bytes);
                let short = report
                    .reserved
                    .saturating_add(report.block_bytes as u64)
                    .saturating_sub(report.budget.unwrap_or(u64::MAX));
                if evicted_class != class && freed < short {
                    continue;
                }
                freed = 0;
                match PoolInner::alloc(this, size, zeroed) {
                    Err(PoolError::BudgetExceeded(again)) => report = again,
                    served => return served,
                }
            }
        }
        let held = inner.evictables_held();
        report.evictable_pinned = held.pinned;
        report.evictable_unpinned = held.evictable;
        Err(PoolError::BudgetExceeded(report))
    }
}

/// What one look at the registry did.
enum Looked {
    /// Evicted a value: the bytes and class of its block.
    Evicted((u64, usize)),
    /// Found no value to evict, and none busy.
    Nothing,
    /// Found none it could take now, but some were busy: look again.
    Busy,
}
