//! `SlotArena<T>`: a lock-free slab of generational slots, reclaimed with crossbeam-epoch.
//!
//! # Protocol
//!
//! Slots live in pages allocated on demand, each twice the size of the one before, so a slot
//! index maps to its page with one `leading_zeros` (see [`PagedTable`]). Each slot has a state
//! word (`generation << 32 | phase`, see [`slot::Slot::state`]) that says whether its value is
//! live and for which generation.
//!
//! - **insert** pops a vacant slot from its thread's shard (a Treiber stack whose head carries
//!   a 32-bit tag against ABA), writes the value, then publishes `OCCUPIED(g)` with a
//!   `Release` store. When the shard has none it recycles ready batches, then takes vacant
//!   slots from other shards, then claims a chunk of fresh slots past the frontier. It needs
//!   no epoch pin: the slot is the inserter's alone.
//! - **get** checks the key's arena and generation against the state word (`Acquire`) and
//!   returns a reference that lives as long as the caller's epoch guard. It writes nothing.
//! - **remove** moves `OCCUPIED(g)` to `REMOVED(g + 1)` with one compare-exchange (so new
//!   readers stop resolving the key at once) and adds the slot to its shard's removal batch.
//!   A full batch is handed to crossbeam-epoch in one deferred call; after the grace period
//!   (no reader pinned before the removal is still pinned) the collector moves it onto the
//!   shard's ready list. See [`recycle`] for how ready batches become vacant slots.
//!
//! A slot therefore becomes vacant only after no reader can still see its value, and the
//! epoch collector never runs user code.
//!
//! Dropping the arena drops every value it still holds, removed or not: no reader can hold
//! one then, since readers borrow the arena.

mod error;
mod key;
mod pin;
mod recycle;
mod shard;
mod slot;
mod trim;

pub use error::ArenaError;
pub use key::Key;
pub use slot::SlotPhase;

use std::fmt;
use std::num::NonZeroU64;

use crossbeam_utils::CachePadded;

use crate::identity::next_identity;
use crate::paged::PagedTable;
use crate::stack::{Link, NIL};
use crate::sync::epoch::{Collector, Guard};
use crate::sync::{epoch, Arc, AtomicU32, AtomicU64, Ordering};
use recycle::{Panics, PendingBatch, ReadyLists};
use shard::Shard;
use slot::{Slot, EXHAUSTED, OCCUPIED, REMOVED, VACANT};

/// Slot indices are `u32`; `u32::MAX` is reserved so that `index + 1` always fits a [`Link`].
const MAX_SLOTS: u64 = u32::MAX as u64;

/// Set in the frontier while a `trim` runs: no fresh slot can be claimed then.
const FROZEN: u64 = 1 << 63;

/// Fresh slots a shard claims at once (at most the first page's length, so that a chunk
/// never straddles two pages). Chunks keep one thread's slots on cache lines of their own.
const CHUNK: u32 = 64;

/// Configuration of a [`SlotArena`].
///
/// ```
/// use ferropool::{ArenaConfig, SlotArena};
/// let arena: SlotArena<u64> = SlotArena::with_config(ArenaConfig {
///     first_page_len: 4,
///     removal_batch: 8,
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
    /// Default 64. Larger batches amortise the deferral (each one pushes a bag onto the
    /// collector's global queue, which every thread of the collector shares: 256 made a
    /// two-thread churn about 20% faster); smaller ones recycle slots, and drop removed
    /// values, sooner. A removed value waits in its thread's batch until the batch is full
    /// (or [`SlotArena::flush`] takes it), so values that own much memory call for small
    /// batches.
    pub removal_batch: u32,
    /// The epoch collector that protects readers. `None` uses crossbeam-epoch's global one.
    pub collector: Option<Collector>,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            first_page_len: 64,
            removal_batch: 64,
            collector: None,
        }
    }
}

/// A lock-free arena of generational slots whose removed values are reclaimed through
/// crossbeam-epoch.
///
/// Every operation but [`take`](Self::take) and [`shrink`](Self::shrink) takes `&self`.
/// Reads take an epoch [`Guard`] and return a reference that stays valid while the guard
/// lives, even if another thread removes the value meanwhile.
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
///
/// # Destructors
///
/// A removed value is dropped when its slot is recycled: once its removal batch
/// ([`ArenaConfig::removal_batch`] removals on one shard) is full and has passed its grace
/// period, by an [`insert`](Self::insert) that needs a slot, by [`flush`](Self::flush)
/// (which also takes partial batches) or [`shrink`](Self::shrink), or when the arena drops;
/// never inside the epoch collector. If
/// such a `Drop` panics, the arena first finishes its work (every other value dropped once,
/// every slot reusable), then resumes the panic from that call; an `insert` that resumes one
/// drops the value it was given. A `Drop` may use the arena it is dropped from.
pub struct SlotArena<T: Send + 'static> {
    arena: Arena<T>,
    /// Ready lists, shared with the batches in transit through the collector.
    ready: Arc<ReadyLists>,
    /// The collector that protects reads.
    collector: Collector,
    /// Whether `collector` is crossbeam-epoch's global collector (pinning can then use its
    /// thread-local handle).
    default_collector: bool,
}

/// Slots, links and lists: the arena less its collector.
struct Arena<T> {
    id: NonZeroU64,
    removal_batch: u32,
    /// Fresh slots claimed at once.
    chunk: u32,
    /// The slots.
    ///
    /// Invariant: a page is released only by `trim`, when every slot in it below the
    /// frontier is on a free list `trim` took; its memory is freed after an epoch grace
    /// period (or at once under exclusive access). So a slot reference obtained while
    /// pinned, or through a slot one owns (popped, claimed, occupied by a live key, or in a
    /// removal batch), never dangles.
    slots: PagedTable<Slot<T>>,
    /// The list link of every slot (`Link` of the next slot on whichever list it is on).
    /// Never released while the arena lives, so a racing pop that reads the link of a slot
    /// another thread just took reads allocated memory.
    links: PagedTable<AtomicU32>,
    /// The first generation of every slot of page `k` when the page is next allocated: the
    /// generations a released page reached, so that keys from before a `trim` stay stale.
    page_floor: Box<[AtomicU32]>,
    /// Slot indices below this have been claimed at least once, plus [`FROZEN`] while a
    /// `trim` runs. Claims advance it with an `AcqRel` compare-exchange when it is not
    /// frozen, and `trim` unfreezes it with a `Release` store, so a claimer sees the page
    /// floors `trim` wrote.
    frontier: CachePadded<AtomicU64>,
    /// The free lists and removal batches, by shard; the length is a power of two.
    shards: Box<[Shard]>,
}

// SAFETY: `Arena` owns `T` values through raw page pointers. Sending it moves or drops them
// on the receiving thread, which needs `T: Send`.
unsafe impl<T: Send> Send for Arena<T> {}
// SAFETY: through `&Arena`, threads obtain `&T` (needs `T: Sync`) and drop values removed by
// other threads (needs `T: Send`). Every other access goes through atomics.
unsafe impl<T: Send + Sync> Sync for Arena<T> {}

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
    /// `1..=65536` or `removal_batch` is not in `1..=4096`.
    pub fn with_config(config: ArenaConfig) -> Result<Self, ArenaError> {
        if !config.first_page_len.is_power_of_two() || config.first_page_len > 1 << 16 {
            return Err(ArenaError::InvalidConfig {
                field: "first_page_len",
                value: u64::from(config.first_page_len),
                expected: "a power of two in 1..=65536",
            });
        }
        if !(1..=4096).contains(&config.removal_batch) {
            return Err(ArenaError::InvalidConfig {
                field: "removal_batch",
                value: u64::from(config.removal_batch),
                expected: "a batch size in 1..=4096",
            });
        }
        let (collector, default_collector) = match config.collector {
            Some(c) => {
                let is_default = c == *epoch::default_collector();
                (c, is_default)
            }
            None => (epoch::default_collector().clone(), true),
        };
        let slots = PagedTable::new(config.first_page_len);
        let shards = shard::shard_count();
        Ok(Self {
            arena: Arena {
                id: next_identity(),
                removal_batch: config.removal_batch,
                chunk: CHUNK.min(config.first_page_len),
                page_floor: (0..slots.page_count()).map(|_| AtomicU32::new(0)).collect(),
                links: PagedTable::new(config.first_page_len),
                slots,
                frontier: CachePadded::new(AtomicU64::new(0)),
                shards: (0..shards).map(|_| Shard::new()).collect(),
            },
            ready: Arc::new(ReadyLists::new(shards)),
            collector,
            default_collector,
        })
    }

    /// Pins the current thread on the arena's collector.
    ///
    /// On the global collector this uses crossbeam-epoch's thread-local handle. On a private
    /// collector each thread keeps a handle for the last few private collectors it pinned
    /// on, so pinning costs about the same.
    #[inline]
    pub fn pin(&self) -> Guard {
        pin::pin(&self.collector, self.default_collector)
    }

    /// The collector whose guards protect this arena's reads.
    pub fn collector(&self) -> &Collector {
        &self.collector
    }

    /// This arena's identity, as carried by its keys.
    pub fn id(&self) -> u64 {
        self.arena.id.get()
    }

    /// Inserts `value` and returns its key. Lock-free; needs no pin.
    ///
    /// # Errors
    ///
    /// [`ArenaError::Full`] when all 2^32 - 1 slot indices are in use (or exhausted after
    /// 2^32 reuses); `value` is dropped.
    ///
    /// # Panics
    ///
    /// Resumes the panic of a removed value's `Drop` that this call ran while recycling
    /// slots (see [Destructors](Self#destructors)); `value` is then dropped.
    #[inline]
    pub fn insert(&self, value: T) -> Result<Key, ArenaError> {
        self.try_insert(value).map_err(|(error, _)| error)
    }

    /// As [`insert`](Self::insert), but a refused value comes back with the error.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    ///
    /// # Panics
    ///
    /// As [`insert`](Self::insert).
    #[inline]
    pub fn try_insert(&self, value: T) -> Result<Key, (ArenaError, T)> {
        let arena = &self.arena;
        let shard = arena.my_shard();
        let index = match arena.shards[shard].free.pop(|i| arena.links.at(i)) {
            Some(index) => index,
            None => {
                let mut panics = Panics::default();
                let refilled = self.refill(shard, &mut panics);
                if panics.caught() {
                    // A recycled value's drop panicked. Give the slot back, drop `value` (in
                    // a catch: its own drop may panic too, and a second panic while unwinding
                    // would abort), then resume the first panic.
                    if let Ok(index) = refilled {
                        arena.push_free(shard, index + 1, index + 1);
                    }
                    panics.catch(|| drop(value));
                    panics.resume();
                    unreachable!("a caught panic was resumed");
                }
                match refilled {
                    Ok(index) => index,
                    Err(error) => return Err((error, value)),
                }
            }
        };
        let slot = arena.slots.at(index);
        // The slot is VACANT and ours alone: it came off a free list or from a fresh chunk.
        let generation = slot::generation(slot.state.load(Ordering::Relaxed));
        slot.value.with_mut(|value_ptr| {
            // SAFETY: the slot is VACANT (value uninitialised) and exclusively owned by this
            // call until the Release store below publishes it.
            unsafe { (*value_ptr).write(value) };
        });
        slot.state
            .store(slot::state(generation, OCCUPIED), Ordering::Release);
        Ok(Key::new(arena.id, index, generation))
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
        let slot = self.arena.live(key)?;
        // SAFETY: `live` saw OCCUPIED for the key's generation (Acquire), so the value is
        // initialised (the inserter's Release store). It cannot be dropped before `guard`
        // unpins: a remover only marks it REMOVED, and it is dropped when its batch is
        // recycled, after a grace period that waits for `guard`, which is pinned on this
        // arena's collector. The page stays allocated as long (invariant on `slots`).
        Ok(slot
            .value
            .with(|value_ptr| unsafe { (*value_ptr).assume_init_ref() }))
    }

    /// Reads the value of `key` without an epoch pin.
    ///
    /// # Safety
    ///
    /// `key` must be live (inserted into this arena and not removed) when the call starts,
    /// and no thread may remove it while the returned reference lives. The group layer
    /// guarantees both by ownership: a group checks a key against its own table of live
    /// descriptors first, and removes its descriptors only through its unique handle.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get), less the guard check.
    #[inline]
    pub(crate) unsafe fn get_unpinned(&self, key: Key) -> Result<&T, ArenaError> {
        let slot = self.arena.live(key)?;
        // SAFETY: `live` saw OCCUPIED at the key's generation (Acquire), so the value is
        // initialised; by the caller's contract nobody removes it while the reference lives,
        // and a page with an occupied slot is never released (invariant on `slots`).
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

    /// Whether `key` resolves to a live value.
    pub fn contains(&self, key: Key) -> bool {
        // Pinned: the key may be stale, and its page may be released by a concurrent `trim`.
        let _guard = self.pin();
        self.arena.live(key).is_ok()
    }

    /// Removes the value of `key`. From now on the key resolves to [`ArenaError::Stale`].
    ///
    /// Returns the removed value, readable while `guard` lives; it is dropped after every
    /// thread that could have seen it has unpinned (see [Destructors](Self#destructors)).
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); in particular removing twice yields [`ArenaError::Stale`].
    pub fn remove<'g>(&'g self, key: Key, guard: &'g Guard) -> Result<&'g T, ArenaError> {
        let arena = &self.arena;
        self.check_guard(guard)?;
        let slot = arena.resolve(key)?;
        let generation = key.generation();
        if let Err(actual) = slot.state.compare_exchange(
            slot::state(generation, OCCUPIED),
            slot::state(generation.wrapping_add(1), REMOVED),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            return Err(stale(key, actual));
        }
        self.add_to_batch(key.index(), guard);
        // SAFETY: this call won the OCCUPIED -> REMOVED transition, so the value is
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
        let arena = &self.arena;
        let slot = arena.live(key)?;
        // SAFETY: OCCUPIED means initialised; `&mut self` excludes readers and removers, and
        // the state is moved off OCCUPIED below before anyone else can look at it.
        let value = slot
            .value
            .with(|value_ptr| unsafe { (*value_ptr).assume_init_read() });
        let next = key.generation().wrapping_add(1);
        if next == 0 {
            slot.state
                .store(slot::state(0, EXHAUSTED), Ordering::Relaxed);
        } else {
            slot.state
                .store(slot::state(next, VACANT), Ordering::Relaxed);
            let link = key.index() + 1;
            arena.push_free(arena.my_shard(), link, link);
        }
        Ok(value)
    }

    /// Hands every partly filled removal batch to the collector now instead of when it
    /// fills, and recycles the batches whose grace period has passed. Call it at a step
    /// boundary to get removed slots back sooner.
    ///
    /// # Errors
    ///
    /// [`ArenaError::ForeignGuard`] if `guard` is not pinned on this arena's collector.
    ///
    /// # Panics
    ///
    /// Resumes the panic of a removed value's `Drop` (see [Destructors](Self#destructors)).
    pub fn flush(&self, guard: &Guard) -> Result<(), ArenaError> {
        self.check_guard(guard)?;
        for (shard, head) in self.arena.take_partial_batches() {
            self.defer_batch(shard, head, guard);
        }
        guard.flush();
        let mut panics = Panics::default();
        recycle::recycling(|| {
            for shard in 0..self.arena.shards.len() {
                self.recycle_ready(shard, shard, &mut panics);
            }
        });
        panics.resume();
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
        let arena = &self.arena;
        self.check_guard(guard)?;
        arena.for_each_slot(|index, slot| {
            let state = slot.state.load(Ordering::Acquire);
            if slot::phase(state) == OCCUPIED {
                // SAFETY: as in `get`: OCCUPIED seen with Acquire, and the drop waits for
                // `guard`.
                let value = slot.value.with(|p| unsafe { (*p).assume_init_ref() });
                f(Key::new(arena.id, index, slot::generation(state)), value);
            }
        });
        Ok(())
    }

    /// The number of live values: a snapshot that may be stale by the time it returns.
    /// It counts slot states, so it costs O(capacity) and adds nothing to the hot paths.
    pub fn len(&self) -> usize {
        let _guard = self.pin(); // pages may be released by a concurrent `trim`
        let mut live = 0;
        self.arena.for_each_slot(|_, slot| {
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
        self.arena.slots.allocated()
    }

    /// Returns vacant memory to the system: hands partly filled removal batches to the
    /// collector, recycles the batches whose grace period has passed, then releases the
    /// trailing pages whose slots are all vacant. Returns how many slots were released.
    ///
    /// Safe to call at any time from any thread: a page that a concurrent operation could
    /// still touch is kept, and released memory is freed after an epoch grace period.
    /// Removed values still in their grace period keep their pages (a later call gets
    /// them); so does every page below an occupied slot (keys never move). Keys into a
    /// released page stay stale: the page's next allocation starts its generations past
    /// every generation it reached.
    ///
    /// # Panics
    ///
    /// Resumes the panic of a removed value's `Drop` (see [Destructors](Self#destructors)).
    pub fn trim(&self) -> u64 {
        let guard = self.pin();
        self.flush(&guard)
            .expect("the arena's own guard is pinned on its collector");
        self.arena.release_vacant_pages(|page| {
            // SAFETY: the page is unlinked; readers that reached it before are pinned, and
            // the closure (which only frees vacant slots: no `T` is dropped) runs after them.
            unsafe { guard.defer_unchecked(move || drop(page)) };
        })
    }

    /// With exclusive access: recycles every removed value not still in transit through the
    /// collector (no reader can hold one: `&mut self` excludes readers), then releases the
    /// trailing vacant pages at once, as [`trim`](Self::trim) does. Returns the slots
    /// released.
    ///
    /// # Panics
    ///
    /// Resumes the panic of a removed value's `Drop` (see [Destructors](Self#destructors)),
    /// after the pages are released.
    pub fn shrink(&mut self) -> u64 {
        let mut panics = Panics::default();
        let arena = &self.arena;
        for (shard, head) in arena.take_partial_batches() {
            arena.recycle_chain(head, shard, &mut panics);
        }
        for shard in 0..arena.shards.len() {
            self.recycle_ready(shard, shard, &mut panics);
        }
        // Exclusive access: no reader can hold a released page, so it is freed at once.
        let released = arena.release_vacant_pages(drop);
        panics.resume();
        released
    }

    /// Rejects guards that do not protect this arena (another collector, or `unprotected`).
    #[inline]
    fn check_guard(&self, guard: &Guard) -> Result<(), ArenaError> {
        match guard.collector() {
            Some(collector) if *collector == self.collector => Ok(()),
            _ => Err(ArenaError::ForeignGuard),
        }
    }

    /// A vacant slot for `shard`, whose free list is empty: recycled, taken from another
    /// shard, or fresh.
    #[cold]
    #[inline(never)]
    fn refill(&self, shard: usize, panics: &mut Panics) -> Result<u32, ArenaError> {
        let arena = &self.arena;
        let shards = arena.shards.len();
        let others = || (1..shards).map(move |k| (shard + k) & (shards - 1));
        recycle::recycling(|| {
            // This shard's own batches first: its slots stay on its threads' cache lines.
            self.recycle_ready(shard, shard, panics);
            if arena.shards[shard].free.is_empty() && self.ready.has_pending(shard) {
                // Some are in transit: let the collector move what has passed its grace
                // period (no user code runs there), and recycle that.
                self.pin().flush();
                self.recycle_ready(shard, shard, panics);
            }
            // Then other shards' batches (a thread that only removes leaves them there).
            if arena.shards[shard].free.is_empty() {
                for from in others() {
                    if self.recycle_ready(from, shard, panics) {
                        break;
                    }
                }
            }
        });
        if let Some(index) = arena.pop_free(shard) {
            return Ok(index);
        }
        if let Some(index) = others().find_map(|from| arena.pop_free(from)) {
            return Ok(index);
        }
        arena.claim_fresh(shard)
    }

    /// Recycles the ready batches of shard `from` onto the free list of shard `to`. Returns
    /// whether there were any.
    fn recycle_ready(&self, from: usize, to: usize, panics: &mut Panics) -> bool {
        let mut any = false;
        for head in self.ready.take(from) {
            self.arena.recycle_chain(head, to, panics);
            any = true;
        }
        any
    }

    /// Adds `index`, just removed, to the calling thread's removal batch; hands the batch
    /// to the collector when it is full.
    fn add_to_batch(&self, index: u32, guard: &Guard) {
        let arena = &self.arena;
        let shard = arena.my_shard();
        let removed = &arena.shards[shard].removed;
        let link = index + 1;
        let next = arena.links.at(index);
        let mut current = removed.load(Ordering::Relaxed);
        loop {
            let count = (current >> 32) as u32;
            next.store(current as Link, Ordering::Relaxed);
            let (new, full) = if count + 1 >= arena.removal_batch {
                (0, true)
            } else {
                ((u64::from(count + 1) << 32) | u64::from(link), false)
            };
            match removed.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) if full => {
                    self.defer_batch(shard, link, guard);
                    // Push it to the collector's global queue now: left in this thread's
                    // bag, it would wait for 63 more deferrals, forever if the thread idles.
                    guard.flush();
                    return;
                }
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Hands the removal batch starting at `head` to the collector; after its grace period
    /// it lands on the ready list of `shard`.
    fn defer_batch(&self, shard: usize, head: Link, guard: &Guard) {
        self.ready.note_pending(shard);
        let ready = Arc::clone(&self.ready);
        let batch = PendingBatch::new(head);
        let to_ready_list = move || ready.push(shard, batch);
        // SAFETY: the closure owns what it touches (an `Arc` of the ready lists and the batch
        // node; it reads no slot), so it may run on any thread at any later time. `guard` is
        // pinned on the arena's collector (checked by every caller), so it runs only after
        // every reader that could have resolved one of the batch's slots has unpinned.
        unsafe { guard.defer_unchecked(to_ready_list) };
    }
}

impl<T> Arena<T> {
    /// The shard of the calling thread.
    #[inline]
    fn my_shard(&self) -> usize {
        crate::thread::shard() & (self.shards.len() - 1)
    }

    /// Pops a vacant slot from the free list of `shard`.
    #[inline]
    fn pop_free(&self, shard: usize) -> Option<u32> {
        self.shards[shard].free.pop(|i| self.links.at(i))
    }

    /// Publishes the chain `head ..= tail` (linked through `links`) on the free list of
    /// `shard`.
    fn push_free(&self, shard: usize, head: Link, tail: Link) {
        self.shards[shard]
            .free
            .push_chain(head, self.links.at(tail - 1));
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
        self.slots
            .get(key.index())
            .ok_or_else(|| ArenaError::OutOfRange {
                index: key.index(),
                capacity: self.slots.allocated(),
            })
    }

    /// The slot of `key` if it holds the key's value: resolved and `OCCUPIED` at the key's
    /// generation (an `Acquire` load, pairing with the inserter's `Release` store).
    #[inline]
    fn live(&self, key: Key) -> Result<&Slot<T>, ArenaError> {
        let slot = self.resolve(key)?;
        let state = slot.state.load(Ordering::Acquire);
        if state == slot::state(key.generation(), OCCUPIED) {
            Ok(slot)
        } else {
            Err(stale(key, state))
        }
    }

    /// Calls `f` on every slot below the frontier in an allocated page. The caller keeps
    /// the pages alive (a pin, or exclusive access).
    fn for_each_slot<'a>(&'a self, mut f: impl FnMut(u32, &'a Slot<T>)) {
        let frontier = (self.frontier.load(Ordering::Acquire) & !FROZEN).min(MAX_SLOTS);
        for k in 0..self.slots.page_count() {
            let start = self.slots.page_start(k);
            if start >= frontier {
                break;
            }
            let Some(page) = self.slots.page(k) else {
                continue;
            };
            let used = (frontier - start).min(page.len() as u64) as usize;
            for (offset, slot) in page[..used].iter().enumerate() {
                f((start + offset as u64) as u32, slot);
            }
        }
    }

    /// Takes every shard's partly filled removal batch: `(shard, head of its chain)` for
    /// each shard that had one.
    fn take_partial_batches(&self) -> impl Iterator<Item = (usize, Link)> + '_ {
        self.shards.iter().enumerate().filter_map(|(shard, lists)| {
            let taken = lists.removed.swap(0, Ordering::AcqRel) as Link;
            (taken != NIL).then_some((shard, taken))
        })
    }

    /// Claims a chunk of never-used slots for `shard`: returns one, publishes the rest on
    /// the shard's free list. Waits while a `trim` has the frontier frozen.
    #[cold]
    fn claim_fresh(&self, shard: usize) -> Result<u32, ArenaError> {
        let chunk = u64::from(self.chunk);
        let mut frontier = self.frontier.load(Ordering::Acquire);
        let start = loop {
            if frontier & FROZEN != 0 {
                // A trim is running (briefly): it gives vacant slots back when done.
                if let Some(index) = self.pop_free(shard) {
                    return Ok(index);
                }
                crate::sync::yield_now();
                frontier = self.frontier.load(Ordering::Acquire);
                continue;
            }
            if frontier >= MAX_SLOTS {
                return Err(ArenaError::Full {
                    capacity: MAX_SLOTS,
                });
            }
            // AcqRel: see the invariant on `frontier`.
            match self.frontier.compare_exchange_weak(
                frontier,
                frontier + chunk,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break frontier,
                Err(actual) => frontier = actual,
            }
        };
        let end = (start + chunk).min(MAX_SLOTS) as u32;
        let start = start as u32;
        // A chunk lies within one page: pages start at multiples of the first page's length,
        // which the chunk divides.
        let (page, _) = self.slots.locate(start);
        let floor = self.page_floor[page].load(Ordering::Relaxed);
        self.links.ensure_page(page, |_| AtomicU32::new(NIL));
        self.slots.ensure_page(page, |_| Slot::vacant(floor));
        if end - start > 1 {
            // Link start + 1 .. end in order and publish them.
            for index in start + 1..end - 1 {
                self.links.at(index).store(index + 2, Ordering::Relaxed);
            }
            self.push_free(shard, start + 2, end);
        }
        Ok(start)
    }

    /// Drops the values of the removed chain starting at `head` and publishes its slots on
    /// the free list of `shard` (an exhausted slot is left out for good).
    ///
    /// The chain's grace period has passed (it came off a ready list), or the caller has
    /// exclusive access: no reader can see the values.
    fn recycle_chain(&self, head: Link, shard: usize, panics: &mut Panics) {
        let (mut vacant_head, mut vacant_tail) = (NIL, NIL);
        let mut link = head;
        while link != NIL {
            let index = link - 1;
            let next = self.links.at(index).load(Ordering::Relaxed);
            let slot = self.slots.at(index);
            let state = slot.state.load(Ordering::Acquire);
            debug_assert_eq!(slot::phase(state), REMOVED);
            let generation = slot::generation(state);
            // First the state, then the drop: a value whose drop panics has been dropped, and
            // nothing may drop it again (invariant on `Slot::state`). The slot is on no list
            // until the chain is published below, so a destructor that inserts cannot take it.
            if generation == 0 {
                // The generation wrapped: keep the slot out of use rather than let a key from
                // 2^32 generations ago resolve again.
                slot.state
                    .store(slot::state(0, EXHAUSTED), Ordering::Relaxed);
            } else {
                slot.state
                    .store(slot::state(generation, VACANT), Ordering::Relaxed);
                self.links.at(index).store(vacant_head, Ordering::Relaxed);
                if vacant_tail == NIL {
                    vacant_tail = link;
                }
                vacant_head = link;
            }
            panics.catch(|| {
                slot.value.with_mut(|value_ptr| {
                    // SAFETY: REMOVED means initialised; this chain was taken off a ready list
                    // (or a removal batch under exclusive access) by this call alone, after its
                    // grace period, so no reader holds the value and nobody else drops it.
                    unsafe { (*value_ptr).assume_init_drop() }
                });
            });
            link = next;
        }
        if vacant_head != NIL {
            self.push_free(shard, vacant_head, vacant_tail);
        }
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
            .field("id", &self.arena.id)
            .field("capacity", &self.capacity())
            .field("removal_batch", &self.arena.removal_batch)
            .field("shards", &self.arena.shards.len())
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Drop for SlotArena<T> {
    fn drop(&mut self) {
        // No reader can exist (readers borrow the arena), so every value can be dropped now,
        // removed ones included, whether their batch is pending, in transit through the
        // collector or ready. A batch in transit later lands on a ready list nobody reads,
        // and is freed with it.
        let mut panics = Panics::default();
        self.arena.for_each_slot(|_, slot| {
            let state = slot.state.load(Ordering::Relaxed);
            let phase = slot::phase(state);
            if phase == OCCUPIED || phase == REMOVED {
                slot.state.store(
                    slot::state(slot::generation(state), VACANT),
                    Ordering::Relaxed,
                );
                panics.catch(|| {
                    // SAFETY: OCCUPIED or REMOVED means initialised (invariant on `state`);
                    // the state was just changed, so nothing drops it again.
                    slot.value
                        .with_mut(|value_ptr| unsafe { (*value_ptr).assume_init_drop() });
                });
            }
        });
        panics.resume_unless_unwinding();
    }
}

/// The error for a key whose slot is not `OCCUPIED` at the key's generation.
#[cold]
fn stale(key: Key, state: u64) -> ArenaError {
    ArenaError::Stale {
        index: key.index(),
        generation: key.generation(),
        current_generation: slot::generation(state),
        phase: slot::slot_phase(state),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A slot whose generation would wrap is kept out of use for good: the key issued 2^32
    /// generations earlier can never resolve again.
    #[test]
    fn generation_wrap_exhausts_the_slot() {
        let collector = Collector::new();
        let mut arena = SlotArena::with_config(ArenaConfig {
            first_page_len: 1,
            removal_batch: 2, // so the removal waits in its batch, which `shrink` recycles
            collector: Some(collector.clone()),
        })
        .unwrap();
        let first = arena.insert(1u32).unwrap();
        assert_eq!(first.generation(), 0);
        // Fast-forward the slot to its last generation, as 2^32 - 1 reuses would.
        let slot = arena.arena.slots.at(first.index());
        let last = u32::MAX;
        slot.state
            .store(slot::state(last, OCCUPIED), Ordering::SeqCst);
        let old = Key::new(arena.arena.id, first.index(), last);
        arena.remove(old, &arena.pin()).unwrap();
        arena.shrink(); // exclusive: recycles the removal now
        let slot = arena.arena.slots.at(first.index());
        assert_eq!(slot::phase(slot.state.load(Ordering::SeqCst)), EXHAUSTED);
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
}
