//! Evictable values as the pool sees them ([`Evictable`]: the block while resident, its
//! residence, the pins, what the eviction policy weighs) and the pool's registry of them
//! ([`Evictor`], a field of `PoolInner`). The policy that uses them, more methods of
//! `Evictor` given their pool, is in `policy.rs`.
//!
//! Each value's state is a small lock (`Mutex` and `Condvar`), taken by readers, the
//! recomputing thread and the evicting thread, never while allocating or running user code,
//! so no lock is held across a recursive request.

use std::fmt;

use super::super::PoolBuffer;
use crate::pool::class;
use crate::sync::{
    thread_id, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
    Tally, ThreadId, UnsafeCell,
};

/// Where an evictable value's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::pool) enum Residence {
    /// In a block of the pool.
    Resident,
    /// Given back to the pool; a reader must recompute it.
    Evicted,
    /// Being recomputed by one thread; other readers wait for it.
    Recomputing,
}

/// What the lock of an evictable value guards.
#[derive(Debug)]
pub(in crate::pool) struct ValueState {
    pub(in crate::pool) phase: Residence,
    /// Pins held: reads in progress, and inputs of recomputes in progress. A value with
    /// readers is never evicted.
    pub(in crate::pool) readers: usize,
    /// The thread recomputing the value, while the phase is `Recomputing`.
    pub(in crate::pool) recomputer: Option<ThreadId>,
}

/// One evictable value as the pool sees it: its block, while resident, and what the eviction
/// policy weighs. Shared (`Arc`) by its owner and the pool's registry.
pub(in crate::pool) struct Evictable {
    /// Its entry in the pool's registry (fixed at registration).
    pub(in crate::pool) slot: usize,
    /// The class of its block and the block's bytes: those of the block it holds, or held
    /// last. Set when it is made and by each recompute (whose block may be of a larger
    /// class: one borrowed from a neighbour's list while the pool had no budget), with
    /// `state` locked; read with the lock, or of a value found resident and unpinned, which
    /// no recompute can be filling.
    class: AtomicUsize,
    bytes: AtomicU64,
    /// The cost of recomputing it, in the owner's unit.
    cost: u64,
    /// The evictable values it is recomputed from: their cost counts in its score while
    /// they are evicted too.
    parents: Box<[Arc<Evictable>]>,
    state: Mutex<ValueState>,
    /// Signalled when a recompute ends (in success or failure).
    ready: Condvar,
    /// Whether the phase is `Resident`, for the policy's estimates read without the lock.
    resident: AtomicBool,
    /// The pool clock at its last pin.
    pub(in crate::pool) last_use: AtomicU64,
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

impl Drop for Evictable {
    fn drop(&mut self) {
        // Values hold their ancestors through `parents`: unlink a chain one value at a time,
        // not one stack frame per ancestor.
        let mut pending = std::mem::take(&mut self.parents).into_vec();
        while let Some(parent) = pending.pop() {
            if let Ok(mut parent) = Arc::try_unwrap(parent) {
                pending.append(&mut std::mem::take(&mut parent.parents).into_vec());
            }
        }
    }
}

impl fmt::Debug for Evictable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evictable")
            .field("bytes", &self.bytes())
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
    /// A resident value of `buffer`'s block in registry entry `slot`, recomputed at `cost`
    /// from `parents`, last used at clock tick `now`.
    pub(in crate::pool) fn new(
        slot: usize,
        buffer: PoolBuffer,
        cost: u64,
        parents: Box<[Arc<Evictable>]>,
        now: u64,
    ) -> Self {
        Self {
            slot,
            class: AtomicUsize::new(buffer.class()),
            bytes: AtomicU64::new(buffer.capacity() as u64),
            cost,
            parents,
            state: Mutex::new(ValueState {
                phase: Residence::Resident,
                readers: 0,
                recomputer: None,
            }),
            ready: Condvar::new(),
            resident: AtomicBool::new(true),
            last_use: AtomicU64::new(now),
            buffer: UnsafeCell::new(Some(buffer)),
        }
    }

    pub(in crate::pool) fn lock(&self) -> MutexGuard<'_, ValueState> {
        // A poisoned lock: a panic while it was held, and none of the sections below can
        // panic between their writes, so the state is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The block's bytes (its class size).
    pub(in crate::pool) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The block's class.
    pub(in crate::pool) fn class(&self) -> usize {
        self.class.load(Ordering::Relaxed)
    }

    /// Whether the bytes are in a block now (a snapshot). Reads the flag kept beside the
    /// state, without the lock: a query never holds up an eviction.
    pub(in crate::pool) fn is_resident(&self) -> bool {
        self.resident.load(Ordering::Acquire)
    }

    /// Pins the value if it is resident (one more reader); else says why not, waiting first
    /// for a recompute another thread has in flight.
    pub(in crate::pool) fn try_pin(&self, evictor: &Evictor) -> Result<(), NotPinned> {
        let mut state = self.lock();
        loop {
            match state.phase {
                Residence::Resident => {
                    state.readers += 1;
                    self.last_use.store(evictor.tick(), Ordering::Relaxed);
                    return Ok(());
                }
                Residence::Evicted => return Err(NotPinned::Evicted),
                Residence::Recomputing if state.recomputer == Some(thread_id()) => {
                    return Err(NotPinned::RecomputingHere)
                }
                Residence::Recomputing => {
                    state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }

    /// Gives a pin back.
    pub(in crate::pool) fn unpin(&self) {
        let mut state = self.lock();
        // A hard check: an unpin without a pin would let an eviction take the bytes from
        // under a reader still reading them.
        assert!(state.readers > 0, "internal error: an unpin without a pin");
        state.readers -= 1;
    }

    /// Claims the recompute of an evicted value: true if the caller must now recompute it and
    /// then [`fill`](Self::fill) or [`abandon`](Self::abandon) it; false if it is no longer
    /// evicted (the caller tries to pin it again).
    pub(in crate::pool) fn claim(&self) -> bool {
        let mut state = self.lock();
        if state.phase != Residence::Evicted {
            return false;
        }
        state.phase = Residence::Recomputing;
        state.recomputer = Some(thread_id());
        true
    }

    /// Ends a claimed recompute with its block: the value is resident, pinned once for the
    /// caller, and the threads waiting for it wake.
    pub(in crate::pool) fn fill(&self, evictor: &Evictor, buffer: PoolBuffer) {
        let mut state = self.lock();
        debug_assert_eq!(state.phase, Residence::Recomputing);
        self.class.store(buffer.class(), Ordering::Relaxed);
        self.bytes
            .store(buffer.capacity() as u64, Ordering::Relaxed);
        // SAFETY: the lock is held and the value has no reader (it was not resident), as the
        // invariant on `buffer` requires for a write.
        self.buffer.with_mut(|slot| unsafe { *slot = Some(buffer) });
        state.phase = Residence::Resident;
        state.recomputer = None;
        state.readers += 1;
        self.resident.store(true, Ordering::Release);
        self.last_use.store(evictor.tick(), Ordering::Relaxed);
        drop(state);
        self.ready.notify_all();
    }

    /// Ends a claimed recompute that failed: the value is evicted again, and a waiting
    /// thread may try itself.
    pub(in crate::pool) fn abandon(&self) {
        let mut state = self.lock();
        debug_assert_eq!(state.phase, Residence::Recomputing);
        state.phase = Residence::Evicted;
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
    pub(in crate::pool) unsafe fn pinned_buffer(&self) -> &PoolBuffer {
        // SAFETY: the caller's pin keeps the phase `Resident`, so the buffer is `Some` and
        // nobody writes it (invariant on `buffer`).
        self.buffer
            .with(|slot| unsafe { (*slot).as_ref() })
            .expect("a pinned value is resident")
    }

    /// Takes the block of a resident value no reader pins, as the lock-holder `state` shows;
    /// the caller drops it once every lock is released.
    pub(in crate::pool) fn take(&self, state: &mut ValueState) -> Option<PoolBuffer> {
        if state.phase != Residence::Resident || state.readers > 0 {
            return None;
        }
        state.phase = Residence::Evicted;
        self.resident.store(false, Ordering::Release);
        // SAFETY: the lock is held (`state` borrows its guard) and there is no reader.
        self.buffer.with_mut(|slot| unsafe { (*slot).take() })
    }

    /// The address of the block of a resident value, as the lock-holder `state` shows;
    /// `None` if it is not resident.
    pub(in crate::pool) fn block_start(&self, state: &ValueState) -> Option<usize> {
        if state.phase != Residence::Resident {
            return None;
        }
        // SAFETY: the lock is held (`state` borrows its guard), so no write to `buffer` runs
        // (every write holds the lock, invariant on `buffer`).
        self.buffer
            .with(|slot| unsafe { (*slot).as_ref().map(|buffer| buffer.as_ptr() as usize) })
    }

    /// What the policies weigh a value by at pool clock `now`: its recompute cost now
    /// ([`cost_now`](Self::cost_now)) and its staleness, the clock ticks since its last pin
    /// plus one.
    pub(in crate::pool) fn cost_and_staleness(&self, now: u64) -> (f64, f64) {
        let stale = now.saturating_sub(self.last_use.load(Ordering::Relaxed)) + 1;
        (self.cost_now() as f64, stale as f64)
    }

    /// The cost of recomputing the value now: its own, plus that of its evicted ancestors
    /// (DTR's evicted neighbourhood), looked at through at most 64 of them.
    pub(in crate::pool) fn cost_now(&self) -> u64 {
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
pub(in crate::pool) struct Evictor {
    pub(in crate::pool) registry: Mutex<Registry>,
    /// Values registered now (read without the lock to skip eviction when there are none).
    pub(in crate::pool) registered: AtomicUsize,
    /// The clock of staleness: one tick per pin.
    pub(in crate::pool) clock: AtomicU64,
    pub(in crate::pool) evictions: AtomicU64,
    pub(in crate::pool) evicted_bytes: AtomicU64,
    /// Evictions by the class of the block given back (one count per class).
    pub(in crate::pool) evicted_by_class: Box<[Tally]>,
    /// Values the window step evicted (they count in `evictions` too).
    pub(in crate::pool) window_evictions: Tally,
    pub(in crate::pool) recomputations: AtomicU64,
    pub(in crate::pool) recomputed_bytes: AtomicU64,
    pub(in crate::pool) recompute_ns: AtomicU64,
}

/// The registered values by slot; vacant slots are reused.
#[derive(Default)]
pub(in crate::pool) struct Registry {
    pub(in crate::pool) slots: Vec<Option<Arc<Evictable>>>,
    pub(in crate::pool) vacant: Vec<usize>,
}

impl fmt::Debug for Evictor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evictor")
            .field("registered", &self.registered.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Evictor {
    pub(in crate::pool) fn new() -> Self {
        Self {
            registry: Mutex::new(Registry::default()),
            registered: AtomicUsize::new(0),
            clock: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            evicted_by_class: (0..class::CLASSES).map(|_| Tally::new(0)).collect(),
            window_evictions: Tally::new(0),
            recomputations: AtomicU64::new(0),
            recomputed_bytes: AtomicU64::new(0),
            recompute_ns: AtomicU64::new(0),
        }
    }

    pub(in crate::pool) fn lock(&self) -> MutexGuard<'_, Registry> {
        // Nothing panics while the registry is locked but a failed allocation of its
        // tables, which leaves it as it was.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(in crate::pool) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// What evictable values held when a request failed: bytes pinned by readers (or recomputes),
/// and bytes resident and unpinned (which the pool could not take: another thread held them
/// for a moment).
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::pool) struct Held {
    pub(in crate::pool) pinned: u64,
    pub(in crate::pool) evictable: u64,
}
