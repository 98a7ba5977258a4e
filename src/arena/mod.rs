//! `SlotArena<T>`: a lock-free slab of generational slots, reclaimed with crossbeam-epoch.
//!
//! # Protocol
//!
//! Slots live in pages that are allocated on demand, each twice the size of the one before,
//! so a slot index maps to its page with one `leading_zeros` (no scan). Each slot has a state
//! word (`generation << 32 | phase`, see [`slot::Slot::state`]) that says whether its value
//! is live and for which generation.
//!
//! - **insert** pops a slot from a lock-free free list (a Treiber stack whose head carries a
//!   32-bit tag against ABA) or claims one past the frontier, writes the value, then publishes
//!   `OCCUPIED(g)` with a `Release` store. It needs no epoch pin: the slot is exclusively the
//!   inserter's, and pages are never freed while `&self` is borrowed.
//! - **get** checks the key's arena and generation against the state word (`Acquire`) and
//!   returns a reference that lives as long as the caller's epoch guard. It writes nothing.
//! - **remove** moves `OCCUPIED(g)` to `RETIRED(g + 1)` with one compare-exchange (so new
//!   readers stop resolving the key at once) and pushes the slot on a retired list. When the
//!   list holds a batch, the batch is handed to crossbeam-epoch in one deferred call; after
//!   the grace period (no reader pinned before the removal is still pinned) the values are
//!   dropped and the whole batch is spliced onto the free list with one compare-exchange.
//!   A slot therefore returns to the free list only after no reader can still see its value.
//!
//! The free and retired lists are sharded: each thread works on the pair of its shard (a
//! small per-thread number modulo the shard count, a power of two up to the machine's
//! parallelism), so threads on different shards share no list head. An insert whose shard
//! has no free slot takes one from another shard before it grows the arena; a batch goes
//! back to the shard that retired it.
//!
//! Dropping the arena drops every live and every retired record exactly once (batches still
//! queued in the collector keep the shared state alive through an `Arc` until they run), and
//! frees every page. [`SlotArena::shrink`] releases trailing pages whose slots are all free.

mod key;
mod slot;

pub use key::Key;

use std::fmt;
use std::num::NonZeroU64;
use std::ptr;

use crossbeam_utils::CachePadded;

use crate::error::ArenaError;
use crate::stack::{Link, TaggedStack, NIL};
use crate::sync::epoch::{Collector, Guard};
use crate::sync::{
    epoch, next_identity, thread_shard, Arc, AtomicPtr, AtomicU32, AtomicU64, Ordering,
};
use slot::{Slot, DEAD, FREE, OCCUPIED, RETIRED};

/// Slot indices are `u32`; `u32::MAX` is reserved so that `index + 1` always fits a [`Link`].
const MAX_SLOTS: u64 = u32::MAX as u64;

/// Configuration of a [`SlotArena`].
///
/// ```
/// use ferropool::{ArenaConfig, SlotArena};
/// let arena: SlotArena<u64> = SlotArena::with_config(ArenaConfig {
///     first_page_len: 4,
///     retire_batch: 8,
///     ..ArenaConfig::default()
/// })?;
/// assert_eq!(arena.capacity(), 0); // pages are allocated on the first insert
/// # Ok::<(), ferropool::ArenaError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ArenaConfig {
    /// Slots in the first page; each later page doubles. A power of two in `1..=65536`.
    pub first_page_len: u32,
    /// Removed slots handed to the epoch collector per deferred call, in `1..=4096`.
    /// Larger batches amortise the deferral; smaller ones return memory sooner.
    pub retire_batch: u32,
    /// The epoch collector that protects readers. `None` uses crossbeam-epoch's global one.
    pub collector: Option<Collector>,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            first_page_len: 64,
            retire_batch: 64,
            collector: None,
        }
    }
}

/// A lock-free arena of generational slots whose removed values are reclaimed through
/// crossbeam-epoch.
///
/// Every operation takes `&self`. Reads take an epoch [`Guard`] and return a reference that
/// stays valid while the guard lives, even if another thread removes the value meanwhile.
///
/// ```
/// use ferropool::SlotArena;
/// let arena = SlotArena::new();
/// let key = arena.insert(String::from("weights"))?;
/// let guard = arena.pin();
/// assert_eq!(arena.get(key, &guard)?, "weights");
/// let removed = arena.remove(key, &guard)?; // still readable until `guard` drops
/// assert_eq!(removed, "weights");
/// assert!(!arena.contains(key));
/// assert!(arena.get(key, &guard).is_err());
/// # Ok::<(), ferropool::ArenaError>(())
/// ```
pub struct SlotArena<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    /// The collector that protects reads. It lives here and not in `Shared`: queued batches
    /// own an `Arc<Shared>` and the collector owns the queue, so a collector inside `Shared`
    /// would be a reference cycle that never frees either.
    collector: Collector,
    /// Whether `collector` is crossbeam-epoch's global collector (pinning can then use its
    /// thread-local handle).
    default_collector: bool,
}

/// The state shared by an arena and the reclamation batches it has queued.
struct Shared<T> {
    id: NonZeroU64,
    /// `log2(first_page_len)`.
    shift: u32,
    retire_batch: u32,
    /// Page `k` holds `first_page_len << k` slots, or is null.
    ///
    /// Invariant: a non-null page stays allocated until `shrink` (which needs `&mut
    /// SlotArena`) or the drop of `Shared`; so a slot reference obtained through `&self`
    /// never dangles.
    pages: Box<[AtomicPtr<Slot<T>>]>,
    /// The first generation of every slot of page `k` when the page is next allocated: the
    /// generations a released page reached, so that keys from before a `shrink` stay stale.
    page_floor: Box<[AtomicU32]>,
    /// Slot indices below this have been handed out at least once.
    frontier: CachePadded<AtomicU64>,
    /// The free and retired lists, by shard; the length is a power of two.
    shards: Box<[Shard]>,
}

/// One shard's lists. Each head has a cache line of its own.
struct Shard {
    /// Slots whose values are dropped and that no reader can see: ready for `insert`.
    free: TaggedStack,
    /// Retired list head: `count << 32 | link`, for slots removed but not yet deferred.
    retired: CachePadded<AtomicU64>,
}

/// Shards per arena: the machine's parallelism, rounded up to a power of two, at most 64.
/// Two under loom, so that models cover both a thread's own shard and stealing.
fn shard_count() -> usize {
    if cfg!(loom) {
        return 2;
    }
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .next_power_of_two()
        .min(64)
}

// SAFETY: `Shared` owns `T` values through raw page pointers. Sending it (or the last `Arc`
// to it) to another thread moves or drops those values there, which needs `T: Send`.
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: through `&Shared`, threads obtain `&T` (needs `T: Sync`) and drop or move values
// removed by other threads (needs `T: Send`). Every other access goes through atomics.
unsafe impl<T: Send + Sync> Sync for Shared<T> {}

impl<T: Send + 'static> SlotArena<T> {
    /// An empty arena with the default configuration, on the global epoch collector.
    pub fn new() -> Self {
        Self::with_config(ArenaConfig::default()).expect("the default configuration is valid")
    }

    /// An empty arena on a private collector (for example one per test, or per subsystem, so
    /// that its garbage is collected independently of the rest of the process).
    pub fn with_collector(collector: Collector) -> Self {
        Self::with_config(ArenaConfig {
            collector: Some(collector),
            ..ArenaConfig::default()
        })
        .expect("the default configuration is valid")
    }

    /// An empty arena with `config`.
    ///
    /// # Errors
    ///
    /// [`ArenaError::InvalidConfig`] when `first_page_len` is not a power of two in
    /// `1..=65536` or `retire_batch` is not in `1..=4096`.
    pub fn with_config(config: ArenaConfig) -> Result<Self, ArenaError> {
        if !config.first_page_len.is_power_of_two() || config.first_page_len > 1 << 16 {
            return Err(ArenaError::InvalidConfig {
                field: "first_page_len",
                value: u64::from(config.first_page_len),
                expected: "a power of two in 1..=65536",
            });
        }
        if !(1..=4096).contains(&config.retire_batch) {
            return Err(ArenaError::InvalidConfig {
                field: "retire_batch",
                value: u64::from(config.retire_batch),
                expected: "a batch size in 1..=4096",
            });
        }
        let shift = config.first_page_len.trailing_zeros();
        // Enough pages that the last one reaches index MAX_SLOTS - 1.
        let page_count = (33 - shift) as usize;
        let (collector, default_collector) = match config.collector {
            Some(c) => {
                let is_default = c == *epoch::default_collector();
                (c, is_default)
            }
            None => (epoch::default_collector().clone(), true),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                id: next_identity(),
                shift,
                retire_batch: config.retire_batch,
                pages: (0..page_count)
                    .map(|_| AtomicPtr::new(ptr::null_mut()))
                    .collect(),
                page_floor: (0..page_count).map(|_| AtomicU32::new(0)).collect(),
                frontier: CachePadded::new(AtomicU64::new(0)),
                shards: (0..shard_count())
                    .map(|_| Shard {
                        free: TaggedStack::new(),
                        retired: CachePadded::new(AtomicU64::new(0)),
                    })
                    .collect(),
            }),
            collector,
            default_collector,
        })
    }

    /// Pins the current thread on the arena's collector.
    ///
    /// On the global collector this uses crossbeam-epoch's thread-local handle (and, on a
    /// thread whose thread-locals are being destroyed, a fresh handle instead of panicking).
    /// On a private collector it registers a handle per call; hot loops on a private
    /// collector should keep their own `LocalHandle` and pin through it.
    pub fn pin(&self) -> Guard {
        if self.default_collector {
            epoch::pin()
        } else {
            self.collector.register().pin()
        }
    }

    /// The collector whose guards protect this arena's reads.
    pub fn collector(&self) -> &Collector {
        &self.collector
    }

    /// This arena's identity, as carried by its keys.
    pub fn id(&self) -> u64 {
        self.shared.id.get()
    }

    /// Inserts `value` and returns its key. Lock-free; needs no pin.
    ///
    /// # Errors
    ///
    /// [`ArenaError::Full`] when all 2^32 - 1 slot indices are in use (or retired after
    /// 2^32 reuses); `value` is dropped.
    pub fn insert(&self, value: T) -> Result<Key, ArenaError> {
        let shared = &*self.shared;
        let index = match shared.pop_free() {
            Some(index) => index,
            None => self
                .reclaim_then_pop()
                .map_or_else(|| shared.claim_fresh(), Ok)?,
        };
        let slot = shared.slot(index);
        // The slot is FREE and ours alone: it came off the free list or from past the frontier.
        let generation = slot::generation(slot.state.load(Ordering::Relaxed));
        slot.value.with_mut(|value_ptr| {
            // SAFETY: the slot is FREE (value uninitialised) and exclusively owned by this
            // call until the Release store below publishes it.
            unsafe { (*value_ptr).write(value) };
        });
        slot.state
            .store(slot::state(generation, OCCUPIED), Ordering::Release);
        Ok(Key::new(shared.id, index, generation))
    }

    /// Reads the value of `key`. Writes no shared memory and takes no lock.
    ///
    /// The reference stays valid while `guard` lives, even if the value is removed meanwhile.
    ///
    /// # Errors
    ///
    /// [`ArenaError::ForeignGuard`] if `guard` is not pinned on this arena's collector;
    /// [`ArenaError::ForeignKey`], [`ArenaError::OutOfRange`] or [`ArenaError::Stale`] if the
    /// key does not resolve to a live value.
    #[inline]
    pub fn get<'g>(&'g self, key: Key, guard: &'g Guard) -> Result<&'g T, ArenaError> {
        self.check_guard(guard)?;
        let slot = self.shared.live(key)?;
        // SAFETY: `live` saw OCCUPIED for the key's generation (Acquire), so the value is
        // initialised (the inserter's Release store). It cannot be dropped before `guard`
        // unpins: a remover only retires it, and the drop runs after an epoch grace period
        // that waits for `guard`, which is pinned on this arena's collector.
        Ok(slot
            .value
            .with(|value_ptr| unsafe { (*value_ptr).assume_init_ref() }))
    }

    /// Reads the value of `key` without an epoch pin.
    ///
    /// # Safety
    ///
    /// No thread may remove `key`'s value (with [`remove`](Self::remove)) while the returned
    /// reference lives. The group layer guarantees this by ownership: only a group removes
    /// its own descriptors, and only through its unique handle.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get), less the guard check.
    #[inline]
    pub(crate) unsafe fn get_unpinned(&self, key: Key) -> Result<&T, ArenaError> {
        let slot = self.shared.live(key)?;
        // SAFETY: `live` saw OCCUPIED at the key's generation (Acquire), so the value is
        // initialised, and by the caller's contract nobody retires it while the reference
        // lives.
        Ok(slot
            .value
            .with(|value_ptr| unsafe { (*value_ptr).assume_init_ref() }))
    }

    /// Runs `f` on the value of `key` under a fresh pin.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get), except that the guard is always the arena's own.
    pub fn with<R>(&self, key: Key, f: impl FnOnce(&T) -> R) -> Result<R, ArenaError> {
        let guard = self.pin();
        self.get(key, &guard).map(f)
    }

    /// Whether `key` resolves to a live value. Needs no pin.
    pub fn contains(&self, key: Key) -> bool {
        self.shared.live(key).is_ok()
    }

    /// Removes the value of `key`. From now on the key resolves to [`ArenaError::Stale`].
    ///
    /// Returns the removed value, readable while `guard` lives; it is dropped after every
    /// thread that could have seen it has unpinned.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); in particular removing twice yields [`ArenaError::Stale`].
    pub fn remove<'g>(&'g self, key: Key, guard: &'g Guard) -> Result<&'g T, ArenaError> {
        let shared = &*self.shared;
        self.check_guard(guard)?;
        let slot = shared.resolve(key)?;
        let generation = key.generation();
        let next = generation.wrapping_add(1);
        if cfg!(ferropool_planted = "retire_without_cas") {
            // PLANTED BUG (loom models only): check, then store; two removers can both win.
            let actual = slot.state.load(Ordering::Acquire);
            if actual != slot::state(generation, OCCUPIED) {
                return Err(stale(key, actual));
            }
            slot.state
                .store(slot::state(next, RETIRED), Ordering::Release);
        } else if let Err(actual) = slot.state.compare_exchange(
            slot::state(generation, OCCUPIED),
            slot::state(next, RETIRED),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            return Err(stale(key, actual));
        }
        self.retire(key.index(), guard);
        // SAFETY: this call won the OCCUPIED -> RETIRED transition, so the value is
        // initialised; it is dropped only after a grace period that waits for `guard`.
        Ok(slot
            .value
            .with(|value_ptr| unsafe { (*value_ptr).assume_init_ref() }))
    }

    /// Removes the value of `key` and returns it by value. Exclusive access means no reader
    /// can hold it, so the slot is reusable at once.
    ///
    /// # Errors
    ///
    /// [`ArenaError::ForeignKey`], [`ArenaError::OutOfRange`] or [`ArenaError::Stale`].
    pub fn take(&mut self, key: Key) -> Result<T, ArenaError> {
        let shared = &*self.shared;
        let slot = shared.live(key)?;
        // SAFETY: OCCUPIED means initialised; `&mut self` excludes readers and removers, and
        // the state is moved off OCCUPIED below before anyone else can look at it.
        let value = slot
            .value
            .with(|value_ptr| unsafe { (*value_ptr).assume_init_read() });
        let next = key.generation().wrapping_add(1);
        if next == 0 {
            slot.state.store(slot::state(0, DEAD), Ordering::Relaxed);
        } else {
            slot.state.store(slot::state(next, FREE), Ordering::Relaxed);
            let link = key.index() + 1;
            shared.push_free_chain(shared.my_shard(), link, link);
        }
        Ok(value)
    }

    /// Hands this arena's partly filled retire batch to the collector now, instead of when
    /// it fills. Call it at a step boundary to return removed slots sooner.
    ///
    /// # Errors
    ///
    /// [`ArenaError::ForeignGuard`] if `guard` is not pinned on this arena's collector.
    pub fn flush(&self, guard: &Guard) -> Result<(), ArenaError> {
        self.check_guard(guard)?;
        for (shard, head) in self.shared.take_retired() {
            self.defer_reclaim(shard, head, guard);
        }
        Ok(())
    }

    /// Calls `f` on every live value, under one pin.
    ///
    /// Values inserted or removed concurrently may or may not be visited; every visited
    /// reference stays valid while `guard` lives.
    ///
    /// # Errors
    ///
    /// [`ArenaError::ForeignGuard`] if `guard` is not pinned on this arena's collector.
    pub fn for_each<'g>(
        &'g self,
        guard: &'g Guard,
        mut f: impl FnMut(Key, &'g T),
    ) -> Result<(), ArenaError> {
        let shared = &*self.shared;
        self.check_guard(guard)?;
        shared.for_each_slot(|index, slot| {
            let state = slot.state.load(Ordering::Acquire);
            if slot::phase(state) == OCCUPIED {
                // SAFETY: as in `get`: OCCUPIED seen with Acquire, and the drop waits for
                // `guard`.
                let value = slot.value.with(|p| unsafe { (*p).assume_init_ref() });
                f(Key::new(shared.id, index, slot::generation(state)), value);
            }
        });
        Ok(())
    }

    /// The number of live values: a snapshot that may be stale by the time it returns.
    /// It counts slot states, so it costs O(capacity) and adds nothing to the hot paths.
    pub fn len(&self) -> usize {
        let mut live = 0;
        self.shared.for_each_slot(|_, slot| {
            live += usize::from(slot::phase(slot.state.load(Ordering::Relaxed)) == OCCUPIED);
        });
        live
    }

    /// Whether [`len`](Self::len) is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots in allocated pages.
    pub fn capacity(&self) -> u64 {
        self.shared.allocated_slots()
    }

    /// Releases trailing pages whose slots are all free, and returns how many slots were
    /// released. Retired values not yet handed to the collector are reclaimed first (no reader
    /// can hold them: `&mut self` excludes readers). Slots of batches still queued in the
    /// collector keep their page. Keys into a released page stay stale forever: the page's
    /// next allocation starts its generations past every generation it reached.
    pub fn shrink(&mut self) -> u64 {
        let shared = &*self.shared;
        shared.reclaim_retired_now();
        shared.shrink_free_pages()
    }

    /// Rejects guards that do not protect this arena (another collector, or `unprotected`).
    #[inline]
    fn check_guard(&self, guard: &Guard) -> Result<(), ArenaError> {
        match guard.collector() {
            Some(collector) if *collector == self.collector => Ok(()),
            _ => Err(ArenaError::ForeignGuard),
        }
    }

    /// The free list is empty: before growing, hand this thread's queued batches to the
    /// collector and let it reclaim what has passed its grace period, then try once more.
    /// Without this, batches wait in the thread's epoch bag until 64 of them fill it.
    #[cold]
    fn reclaim_then_pop(&self) -> Option<u32> {
        self.pin().flush();
        self.shared.pop_free()
    }

    /// Takes the retired list if it holds a full batch after adding `index`, and defers it;
    /// otherwise pushes `index` on it.
    fn retire(&self, index: u32, guard: &Guard) {
        let shared = &*self.shared;
        let shard = shared.my_shard();
        let retired = &shared.shards[shard].retired;
        let link = index + 1;
        let slot = shared.slot(index);
        let mut current = retired.load(Ordering::Relaxed);
        loop {
            let count = (current >> 32) as u32;
            slot.next.store(current as Link, Ordering::Relaxed);
            let (new, full) = if count + 1 >= shared.retire_batch {
                (0, true)
            } else {
                ((u64::from(count + 1) << 32) | u64::from(link), false)
            };
            match retired.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) if full && cfg!(ferropool_planted = "free_immediately") => {
                    // PLANTED BUG (loom models only): skip the grace period.
                    return self.shared.reclaim_chain(shard, link);
                }
                Ok(_) if full => return self.defer_reclaim(shard, link, guard),
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Queues the retired chain starting at `head` for reclamation after a grace period; its
    /// slots then go to the free list of `shard`.
    fn defer_reclaim(&self, shard: usize, head: Link, guard: &Guard) {
        let shared = Arc::clone(&self.shared);
        let reclaim = move || shared.reclaim_chain(shard, head);
        // SAFETY: the closure owns an `Arc` to the shared state, so the pages it touches
        // outlive it, and it only drops `T`s, which are `Send + 'static`. `guard` is pinned on
        // the arena's collector (checked by every caller), so the closure runs only after
        // every reader that could have resolved one of these slots has unpinned.
        unsafe { guard.defer_unchecked(reclaim) };
    }
}

impl<T: Send + 'static> Default for SlotArena<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + 'static> fmt::Debug for SlotArena<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotArena")
            .field("id", &self.shared.id)
            .field("capacity", &self.capacity())
            .field("retire_batch", &self.shared.retire_batch)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Drop for SlotArena<T> {
    fn drop(&mut self) {
        // No reader can exist (they borrow the arena), so the partial retire batches can be
        // reclaimed now rather than when the shared state finally drops.
        self.shared.reclaim_retired_now();
    }
}

/// The error for a key whose slot is not `OCCUPIED` at the key's generation.
fn stale(key: Key, state: u64) -> ArenaError {
    ArenaError::Stale {
        index: key.index(),
        generation: key.generation(),
        current_generation: slot::generation(state),
        state: slot::phase_name(state),
    }
}

impl<T> Shared<T> {
    #[inline(always)]
    fn first_page_len(&self) -> u64 {
        1 << self.shift
    }

    /// Page number and offset of a slot index.
    #[inline(always)]
    fn locate(&self, index: u32) -> (usize, usize) {
        let shifted = u64::from(index) + self.first_page_len();
        let page = (63 - shifted.leading_zeros() - self.shift) as usize;
        let offset = (shifted - (self.first_page_len() << page)) as usize;
        (page, offset)
    }

    /// First slot index of page `page`.
    fn page_start(&self, page: usize) -> u64 {
        (self.first_page_len() << page) - self.first_page_len()
    }

    fn page_len(&self, page: usize) -> usize {
        (self.first_page_len() << page) as usize
    }

    /// The slot of `key` if the key is this arena's and its page is allocated.
    #[inline]
    fn resolve(&self, key: Key) -> Result<&Slot<T>, ArenaError> {
        if key.arena() != self.id {
            return Err(ArenaError::ForeignKey {
                key_arena: key.arena_id(),
                arena: self.id.get(),
            });
        }
        let (page, offset) = self.locate(key.index());
        let base = self.pages[page].load(Ordering::Acquire);
        if base.is_null() {
            return Err(ArenaError::OutOfRange {
                index: key.index(),
                capacity: self.allocated_slots(),
            });
        }
        // SAFETY: a non-null page has `page_len(page)` slots and `offset` is below that by
        // `locate`; it stays allocated while `&self` lives (invariant on `pages`).
        Ok(unsafe { &*base.add(offset) })
    }

    /// The slot of `key` if it holds the key's value: resolved and `OCCUPIED` at the key's
    /// generation (an `Acquire` load, pairing with the inserter's `Release` store).
    #[inline]
    fn live(&self, key: Key) -> Result<&Slot<T>, ArenaError> {
        let slot = self.resolve(key)?;
        let state = slot.state.load(Ordering::Acquire);
        let live = if cfg!(ferropool_planted = "unchecked_generation") {
            // PLANTED BUG (loom models only): the generation is not compared.
            slot::phase(state) == OCCUPIED
        } else {
            state == slot::state(key.generation(), OCCUPIED)
        };
        if live {
            Ok(slot)
        } else {
            Err(stale(key, state))
        }
    }

    /// The slot of an index known to be in an allocated page (it was on a list, or claimed).
    #[inline]
    fn slot(&self, index: u32) -> &Slot<T> {
        let (page, offset) = self.locate(index);
        let base = self.pages[page].load(Ordering::Acquire);
        debug_assert!(!base.is_null(), "slot {index} has no page");
        // SAFETY: callers pass indices taken from a list or claimed below the frontier, whose
        // pages are allocated and stay so while `&self` lives (invariant on `pages`).
        unsafe { &*base.add(offset) }
    }

    fn allocated_slots(&self) -> u64 {
        self.pages
            .iter()
            .enumerate()
            .filter(|(_, page)| !page.load(Ordering::Acquire).is_null())
            .map(|(k, _)| self.page_len(k) as u64)
            .sum()
    }

    /// Calls `f` on every slot below the frontier in an allocated page.
    fn for_each_slot<'a>(&'a self, mut f: impl FnMut(u32, &'a Slot<T>)) {
        let frontier = self.frontier.load(Ordering::Acquire).min(MAX_SLOTS);
        for (k, page) in self.pages.iter().enumerate() {
            let start = self.page_start(k);
            if start >= frontier {
                break;
            }
            let base = page.load(Ordering::Acquire);
            if base.is_null() {
                continue;
            }
            let used = (frontier - start).min(self.page_len(k) as u64) as usize;
            for offset in 0..used {
                // SAFETY: `offset < page_len(k)` and the page stays allocated while `&self`
                // lives (invariant on `pages`).
                let slot = unsafe { &*base.add(offset) };
                f((start + offset as u64) as u32, slot);
            }
        }
    }

    /// The shard of the calling thread.
    #[inline]
    fn my_shard(&self) -> usize {
        thread_shard() & (self.shards.len() - 1)
    }

    /// A free slot: from the calling thread's shard, else from the others in turn.
    #[inline]
    fn pop_free(&self) -> Option<u32> {
        let mine = self.my_shard();
        match self.shards[mine].free.pop(|index| &self.slot(index).next) {
            Some(index) => Some(index),
            None => self.steal_free(mine),
        }
    }

    /// A free slot from a shard other than `mine`.
    #[cold]
    #[inline(never)]
    fn steal_free(&self, mine: usize) -> Option<u32> {
        let count = self.shards.len();
        (1..count).find_map(|k| {
            self.shards[(mine + k) & (count - 1)]
                .free
                .pop(|index| &self.slot(index).next)
        })
    }

    /// Publishes the chain `head ..= tail` (linked through `next`) on the free list of
    /// `shard`.
    fn push_free_chain(&self, shard: usize, head: Link, tail: Link) {
        self.shards[shard]
            .free
            .push_chain(head, &self.slot(tail - 1).next);
    }

    /// Takes every shard's partial retire batch: `(shard, head of its chain)` for each
    /// shard that had one.
    fn take_retired(&self) -> impl Iterator<Item = (usize, Link)> + '_ {
        self.shards.iter().enumerate().filter_map(|(shard, lists)| {
            let taken = lists.retired.swap(0, Ordering::AcqRel) as Link;
            (taken != NIL).then_some((shard, taken))
        })
    }

    /// Reclaims every partial retire batch at once. Only with exclusive access to the arena
    /// (no reader can hold a value), from `shrink` and `drop`.
    fn reclaim_retired_now(&self) {
        for (shard, head) in self.take_retired() {
            self.reclaim_chain(shard, head);
        }
    }

    /// Claims a never-used slot index, allocating its page if needed.
    fn claim_fresh(&self) -> Result<u32, ArenaError> {
        let index = self.frontier.fetch_add(1, Ordering::Relaxed);
        if index >= MAX_SLOTS {
            self.frontier.fetch_sub(1, Ordering::Relaxed);
            return Err(ArenaError::Full {
                capacity: MAX_SLOTS,
            });
        }
        let index = index as u32;
        let (page, _) = self.locate(index);
        if self.pages[page].load(Ordering::Acquire).is_null() {
            self.allocate_page(page);
        }
        Ok(index)
    }

    /// Allocates page `page` unless another thread did first.
    #[cold]
    fn allocate_page(&self, page: usize) {
        let floor = self.page_floor[page].load(Ordering::Relaxed);
        let slots: Box<[Slot<T>]> = (0..self.page_len(page))
            .map(|_| Slot::vacant(floor))
            .collect();
        let fresh = Box::into_raw(slots).cast::<Slot<T>>();
        if cfg!(ferropool_planted = "page_overwrite") {
            // PLANTED BUG (loom models only): publish without checking for a racing allocator.
            self.pages[page].store(fresh, Ordering::Release);
            return;
        }
        if self.pages[page]
            .compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: `fresh` came from `Box::into_raw` above with this length and was never
            // published, so it is still exclusively ours.
            drop(unsafe {
                Box::from_raw(ptr::slice_from_raw_parts_mut(fresh, self.page_len(page)))
            });
        }
    }

    /// Drops the values of a retired chain and publishes its slots on the free list of
    /// `shard` (or retires them for good when their generation wrapped).
    ///
    /// Called after a grace period, or with exclusive access: no reader can see the values.
    fn reclaim_chain(&self, shard: usize, head: Link) {
        let mut link = head;
        let (mut free_head, mut free_tail) = (NIL, NIL);
        while link != NIL {
            let slot = self.slot(link - 1);
            let next = slot.next.load(Ordering::Relaxed);
            let state = slot.state.load(Ordering::Acquire);
            debug_assert_eq!(slot::phase(state), RETIRED);
            slot.value.with_mut(|value_ptr| {
                // SAFETY: RETIRED means initialised, and the value is dropped only here: this
                // chain was taken off the retired list by exactly one party, after a grace
                // period (or under exclusive access), so no reader still holds it.
                unsafe { (*value_ptr).assume_init_drop() };
            });
            let generation = slot::generation(state);
            if generation == 0 {
                // The generation wrapped: retire the slot for good rather than let a key
                // from 2^32 generations ago resolve again.
                slot.state.store(slot::state(0, DEAD), Ordering::Release);
            } else {
                slot.state
                    .store(slot::state(generation, FREE), Ordering::Relaxed);
                slot.next.store(free_head, Ordering::Relaxed);
                if free_tail == NIL {
                    free_tail = link;
                }
                free_head = link;
            }
            link = next;
        }
        if free_head != NIL {
            self.push_free_chain(shard, free_head, free_tail);
        }
    }

    /// See [`SlotArena::shrink`]; the caller holds exclusive access to the arena, but
    /// reclamation batches may still push on the free list concurrently.
    fn shrink_free_pages(&self) -> u64 {
        // Take every shard's free list; count their slots per page. Cold path: collect the
        // lists so that released pages are never walked afterwards.
        let mut taken_indices = Vec::new();
        for lists in self.shards.iter() {
            let mut link = lists.free.take_all();
            while link != NIL {
                taken_indices.push(link - 1);
                link = self.slot(link - 1).next.load(Ordering::Relaxed);
            }
        }
        let mut free_in_page = vec![0u64; self.pages.len()];
        for &index in &taken_indices {
            free_in_page[self.locate(index).0] += 1;
        }
        // Release trailing pages whose used slots are all on the free list.
        let mut frontier = self.frontier.load(Ordering::Relaxed).min(MAX_SLOTS);
        let mut released = 0u64;
        let mut keep_below = self.pages.len();
        for k in (0..self.pages.len()).rev() {
            let base = self.pages[k].load(Ordering::Acquire);
            if base.is_null() {
                continue;
            }
            let start = self.page_start(k);
            let used = frontier.saturating_sub(start).min(self.page_len(k) as u64);
            let releasable = if cfg!(ferropool_planted = "shrink_by_phase") {
                // PLANTED BUG (loom models only): trust the phase instead of the taken list,
                // so a slot a concurrent batch is publishing right now looks releasable.
                (0..used as usize).all(|offset| {
                    // SAFETY: offset < page_len(k) and the page is allocated.
                    let state = unsafe { &*base.add(offset) }.state.load(Ordering::Relaxed);
                    slot::phase(state) == FREE
                })
            } else {
                free_in_page[k] == used
            };
            if !releasable {
                break;
            }
            let mut floor = self.page_floor[k].load(Ordering::Relaxed);
            for offset in 0..used as usize {
                // SAFETY: offset < page_len(k) and the page is allocated.
                let state = unsafe { &*base.add(offset) }.state.load(Ordering::Relaxed);
                floor = floor.max(slot::generation(state));
            }
            if floor == u32::MAX {
                break; // cannot promise fresh generations; keep the page
            }
            self.page_floor[k].store(floor, Ordering::Relaxed);
            self.pages[k].store(ptr::null_mut(), Ordering::Release);
            // SAFETY: every used slot of the page is FREE and was on the free lists we took,
            // so no list, reader (`&mut` arena) or reclamation batch refers to it; the page
            // came from `Box::into_raw` with this length in `allocate_page`.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, self.page_len(k))) });
            released += self.page_len(k) as u64;
            frontier = frontier.min(start);
            keep_below = k;
        }
        self.frontier.store(frontier, Ordering::Release);
        // Put back the slots of the pages we kept, in their original order.
        let (mut head, mut tail) = (NIL, NIL);
        for &index in taken_indices.iter().rev() {
            if self.locate(index).0 >= keep_below {
                continue;
            }
            self.slot(index).next.store(head, Ordering::Relaxed);
            if tail == NIL {
                tail = index + 1;
            }
            head = index + 1;
        }
        if head != NIL {
            self.push_free_chain(self.my_shard(), head, tail);
        }
        released
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        for k in 0..self.pages.len() {
            let base = self.pages[k].load(Ordering::Acquire);
            if base.is_null() {
                continue;
            }
            let len = self.page_len(k);
            for offset in 0..len {
                // SAFETY: offset < len, page allocated; `&mut self` is the last reference.
                let slot = unsafe { &*base.add(offset) };
                let phase = slot::phase(slot.state.load(Ordering::Relaxed));
                if phase == OCCUPIED || phase == RETIRED {
                    // SAFETY: OCCUPIED or RETIRED means initialised (invariant on `state`),
                    // and no batch can still refer to it: batches hold an `Arc` to `self`.
                    slot.value
                        .with_mut(|value_ptr| unsafe { (*value_ptr).assume_init_drop() });
                }
            }
            // SAFETY: from `Box::into_raw` in `allocate_page` with this length; last owner.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, len)) });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A slot whose generation would wrap is retired for good: the key issued 2^32
    /// generations earlier can never resolve again.
    #[test]
    fn generation_wrap_retires_the_slot() {
        let collector = Collector::new();
        let handle = collector.register();
        let arena = SlotArena::with_config(ArenaConfig {
            first_page_len: 1,
            retire_batch: 1,
            collector: Some(collector.clone()),
        })
        .unwrap();
        let first = arena.insert(1u32).unwrap();
        assert_eq!(first.generation(), 0);
        // Fast-forward the slot to its last generation, as 2^32 - 1 reuses would.
        let slot = arena.shared.slot(first.index());
        let last = u32::MAX;
        // SAFETY (test): the value is a `u32`, so overwriting the state leaks nothing.
        slot.state
            .store(slot::state(last, OCCUPIED), Ordering::SeqCst);
        let old = Key::new(arena.shared.id, first.index(), last);
        {
            let guard = handle.pin();
            arena.remove(old, &guard).unwrap();
        }
        for _ in 0..64 {
            handle.pin().flush();
        }
        assert_eq!(slot::phase(slot.state.load(Ordering::SeqCst)), DEAD);
        let next = arena.insert(2u32).unwrap();
        assert_ne!(next.index(), first.index(), "a dead slot is never reused");
        let guard = handle.pin();
        assert!(arena.get(first, &guard).is_err());
        assert!(arena.get(old, &guard).is_err());
    }

    #[test]
    fn locate_maps_indices_to_doubling_pages() {
        let arena: SlotArena<u8> = SlotArena::with_config(ArenaConfig {
            first_page_len: 4,
            ..ArenaConfig::default()
        })
        .unwrap();
        let s = &arena.shared;
        assert_eq!(s.locate(0), (0, 0));
        assert_eq!(s.locate(3), (0, 3));
        assert_eq!(s.locate(4), (1, 0));
        assert_eq!(s.locate(11), (1, 7));
        assert_eq!(s.locate(12), (2, 0));
        let (last_page, _) = s.locate(u32::MAX - 1);
        assert!(last_page < s.pages.len());
        for k in 0..s.pages.len() {
            assert_eq!(s.locate(s.page_start(k) as u32), (k, 0));
        }
    }
}
