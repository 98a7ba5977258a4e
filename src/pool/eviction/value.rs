//! Evictable values as the pool sees them ([`Evictable`]: the block while resident, its
//! residence, the pins, what the eviction policy weighs), and the pool's clock of staleness
//! ([`Clock`]). The registry that holds them and chooses among them is `registry.rs`.
//!
//! Each value's state is a small lock (`Mutex` and `Condvar`), taken by readers, the
//! recomputing thread and the evicting thread, never while allocating or running user code,
//! so no lock is held across a recursive request.

use std::fmt;

use crate::sync::{
    thread_id, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
    ThreadId, UnsafeCell,
};

/// What the registry asks of a resident value's block (in the pool, a `PoolBuffer`): generic,
/// so that the registry, a part of the pool's state, does not name the buffer that points
/// back to that state.
pub(in crate::pool) trait ValueBlock {
    /// The block's class.
    fn class(&self) -> usize;
    /// The block's bytes (its class size).
    fn bytes(&self) -> u64;
    /// The address of the block's first byte.
    fn start(&self) -> usize;
}

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
pub(in crate::pool) struct Evictable<B> {
    /// Its entry in the pool's registry (fixed at registration).
    slot: usize,
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
    parents: Box<[Arc<Evictable<B>>]>,
    state: Mutex<ValueState>,
    /// Signalled when a recompute ends (in success or failure).
    ready: Condvar,
    /// Whether the phase is `Resident`, for the policy's estimates read without the lock.
    resident: AtomicBool,
    /// The pool clock at its last pin.
    last_use: AtomicU64,
    /// Invariant: `Some` exactly while the phase is `Resident`. Written only with `state`
    /// locked and no reader (an eviction taking it, a recompute storing it); read by whoever
    /// holds a pin (`readers` counts it for the whole read) or the lock.
    buffer: UnsafeCell<Option<B>>,
}

// SAFETY: the block is written only under the lock with no reader, and read only under a pin
// or the lock (invariant on `buffer`); the block is `Send + Sync` (a `PoolBuffer` is); every
// other field is a lock, an atomic or immutable.
unsafe impl<B: Send + Sync> Send for Evictable<B> {}
// SAFETY: as above.
unsafe impl<B: Send + Sync> Sync for Evictable<B> {}

impl<B> Drop for Evictable<B> {
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

impl<B: ValueBlock> fmt::Debug for Evictable<B> {
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

impl<B: ValueBlock> Evictable<B> {
    /// A resident value of `buffer`'s block in registry entry `slot`, recomputed at `cost`
    /// from `parents`, last used at clock tick `now`.
    pub(in crate::pool) fn new(
        slot: usize,
        buffer: B,
        cost: u64,
        parents: Box<[Arc<Evictable<B>>]>,
        now: u64,
    ) -> Self {
        Self {
            slot,
            class: AtomicUsize::new(buffer.class()),
            bytes: AtomicU64::new(buffer.bytes()),
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
    pub(in crate::pool) fn try_pin(&self, clock: &Clock) -> Result<(), NotPinned> {
        let mut state = self.lock();
        loop {
            match state.phase {
                Residence::Resident => {
                    state.readers += 1;
                    self.last_use.store(clock.tick(), Ordering::Relaxed);
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
    pub(in crate::pool) fn fill(&self, clock: &Clock, buffer: B) {
        let mut state = self.lock();
        debug_assert_eq!(state.phase, Residence::Recomputing);
        self.class.store(buffer.class(), Ordering::Relaxed);
        self.bytes.store(buffer.bytes(), Ordering::Relaxed);
        // SAFETY: the lock is held and the value has no reader (it was not resident), as the
        // invariant on `buffer` requires for a write.
        self.buffer.with_mut(|slot| unsafe { *slot = Some(buffer) });
        state.phase = Residence::Resident;
        state.recomputer = None;
        state.readers += 1;
        self.resident.store(true, Ordering::Release);
        self.last_use.store(clock.tick(), Ordering::Relaxed);
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
    pub(in crate::pool) unsafe fn pinned_buffer(&self) -> &B {
        self.buffer
            .with(|slot| {
                // SAFETY: the caller's pin keeps the phase `Resident`, so the buffer is `Some`
                // and nobody writes it (invariant on `buffer`).
                unsafe { (*slot).as_ref() }
            })
            .expect("a pinned value is resident")
    }

    /// Takes the block of a resident value no reader pins, as the lock-holder `state` shows;
    /// the caller drops it once every lock is released.
    pub(in crate::pool) fn take(&self, state: &mut ValueState) -> Option<B> {
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
            .with(|slot| unsafe { (*slot).as_ref().map(ValueBlock::start) })
    }

    /// Its entry in the pool's registry.
    pub(super) fn slot(&self) -> usize {
        self.slot
    }

    /// The cost of recomputing it alone, in the owner's unit.
    pub(super) fn own_cost(&self) -> u64 {
        self.cost
    }

    /// The evictable values it is recomputed from.
    pub(super) fn parents(&self) -> &[Arc<Evictable<B>>] {
        &self.parents
    }

    /// Whether it seemed resident at a relaxed look without the lock: for the policy's
    /// estimates.
    pub(super) fn seems_resident(&self) -> bool {
        self.resident.load(Ordering::Relaxed)
    }

    /// The pool clock at its last pin (a relaxed look).
    pub(super) fn last_use(&self) -> u64 {
        self.last_use.load(Ordering::Relaxed)
    }
}

/// The pool's clock of staleness: one tick per pin.
#[derive(Debug)]
pub(in crate::pool) struct Clock(AtomicU64);

impl Clock {
    pub(super) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// One tick more; the time now.
    pub(super) fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The time now.
    pub(super) fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
