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
//!   `Release` store. When the shard has none it recycles ready batches (its own, then other
//!   shards'), then claims a chunk of fresh slots past the frontier; it takes other shards'
//!   vacant slots first only once its growth has reached
//!   [`ArenaConfig::growth_before_stealing`]. It needs no epoch pin: the slot is the
//!   inserter's alone.
//! - **get** checks the key's arena and generation against the state word (`Acquire`) and
//!   returns a reference that lives as long as the caller's epoch guard. It writes nothing.
//! - **remove** moves `OCCUPIED(g)` to `REMOVED(g + 1)` with one compare-exchange (so new
//!   readers stop resolving the key at once) and adds the slot to its shard's removal batch.
//!   A full batch is handed to crossbeam-epoch in one deferred call (the thread's epoch bag
//!   reaches the collector's shared queue every 8 such calls); after the grace period
//!   (no reader pinned before the removal is still pinned) the collector moves it onto the
//!   shard's ready list. See [`recycle`] for how ready batches become vacant slots.
//!
//! A slot therefore becomes vacant only after no reader can still see its value, and the
//! epoch collector never runs user code.
//!
//! Dropping the arena drops every value it still holds, removed or not: no reader can hold
//! one then, since readers borrow the arena.

mod cache;
mod config;
mod error;
mod key;
mod panics;
mod pin;
mod recycle;
mod shard;
mod slot;
mod slow;
mod table;
mod trim;

pub use config::ArenaConfig;
pub use error::ArenaError;
pub use key::Key;
pub use slot::SlotPhase;

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::identity::next_identity;
use crate::paged::PagedTable;
use crate::roster::Roster;
use crate::stack::NIL;
use crate::sync::epoch::{Collector, Guard};
use crate::sync::{epoch, Arc, AtomicU32, AtomicU64, Ordering};
use cache::Added;
use recycle::ReadyLists;
use shard::Shard;
use slot::OCCUPIED;
use table::{ArenaInner, Shape, CHUNK};

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
/// ([`ArenaConfig::removal_batch`] removals by one thread) is full, has reached the epoch
/// collector's shared queue (see below) and has passed its grace period, by an
/// [`insert`](Self::insert) that needs a slot, by [`flush`](Self::flush) (which also takes
/// partial batches) or [`shrink`](Self::shrink), or when the arena drops; never inside the
/// epoch collector. The partial batch of a thread that went idle or exited is also taken by
/// the other threads' inserts: every 64th time a thread refills its slots in an arena, it
/// takes the partial batches there that have not changed since its previous such look.
///
/// A full batch first waits in the epoch bag of the guard it was removed under (crossbeam's
/// per-thread, per-collector list of deferred functions), which goes to the shared queue
/// every 8 batches the thread defers, when an insert of that thread refills while its
/// shard's batches are in transit, when the thread flushes, or when it exits. So on one
/// collector an idle thread holds at most 7 full batches of removed values; with several
/// collectors, up to crossbeam's 64 deferred functions per collector. Removals under a guard
/// of your own [`LocalHandle`](crossbeam_epoch::LocalHandle) wait in that handle's bag: flush
/// with a guard from it, or drop it. If such a `Drop` panics, the arena first finishes its
/// work (every other value dropped once, every slot reusable), then resumes the panic from
/// that call; an `insert` that resumes one drops the value it was given. A `Drop` may use
/// the arena it is dropped from.
pub struct SlotArena<T: Send + 'static> {
    arena: ArenaInner<T>,
    /// Ready lists, shared with the batches in transit through the collector.
    ready: Arc<ReadyLists>,
    /// The collector that protects reads.
    collector: Collector,
    /// Whether `collector` is crossbeam-epoch's global collector (pinning can then use its
    /// thread-local handle).
    default_collector: bool,
}

impl<T: Send + 'static> SlotArena<T> {
    /// An empty arena with the default configuration, on the global epoch collector.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena: SlotArena<u32> = SlotArena::new();
    /// assert!(arena.is_empty());
    /// assert_eq!(arena.capacity(), 0);
    /// ```
    pub fn new() -> Self {
        Self::with_config(ArenaConfig::default()).expect("the default configuration is valid")
    }

    /// An empty arena on a private collector (for example one per test, or per subsystem, so
    /// that its garbage is collected independently of the rest of the process).
    ///
    /// ```
    /// use ferropool::{Collector, SlotArena};
    /// let collector = Collector::new();
    /// let arena = SlotArena::with_collector(collector.clone());
    /// let key = arena.insert(1u32)?;
    /// assert!(arena.collector() == &collector);
    /// assert_eq!(arena.get(key, &arena.pin())?, &1);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn with_collector(collector: Collector) -> Self {
        Self::with_config(ArenaConfig {
            collector: Some(collector),
            ..ArenaConfig::default()
        })
        .expect("the default configuration is valid")
    }

    /// An empty arena with `config`.
    ///
    /// ```
    /// use ferropool::{ArenaConfig, ArenaError, SlotArena};
    /// let config = ArenaConfig { first_page_len: 3, ..ArenaConfig::default() };
    /// let refused = SlotArena::<u32>::with_config(config);
    /// assert!(matches!(refused, Err(ArenaError::InvalidConfig { field: "first_page_len", .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// [`ArenaError::InvalidConfig`] when `first_page_len` is not a power of two in
    /// `1..=65536`, `removal_batch` is not in `1..=4096`, `shards` is not a power of two
    /// in `1..=64`, or `max_slots` is 0.
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
        if config.max_slots == 0 {
            return Err(ArenaError::InvalidConfig {
                field: "max_slots",
                value: 0,
                expected: "a number of slots in 1..=4294967295",
            });
        }
        let shards = match config.shards {
            None => shard::shard_count(),
            Some(n) if n.is_power_of_two() && n <= 64 => n,
            Some(n) => {
                return Err(ArenaError::InvalidConfig {
                    field: "shards",
                    value: n as u64,
                    expected: "a power of two in 1..=64",
                })
            }
        };
        let (collector, default_collector) = match config.collector {
            Some(c) => {
                let is_default = c == *epoch::default_collector();
                (c, is_default)
            }
            None => (epoch::default_collector().clone(), true),
        };
        // Thread caches use the asymmetric fences; decide their implementation first.
        crate::sync::asymmetric::init();
        let slots = PagedTable::new(config.first_page_len);
        let links = PagedTable::new(config.first_page_len);
        debug_assert!(
            slots.same_layout(&links),
            "invariant on `ArenaInner::links`"
        );
        Ok(Self {
            arena: ArenaInner {
                shape: Shape {
                    id: next_identity(),
                    removal_batch: config.removal_batch,
                    chunk: CHUNK.min(config.first_page_len),
                    max_slots: u64::from(config.max_slots),
                    growth_before_stealing: (config.growth_before_stealing
                        / std::mem::size_of::<slot::Slot<T>>())
                        as u64,
                },
                page_floor: (0..slots.page_count()).map(|_| AtomicU32::new(0)).collect(),
                links,
                chains: PagedTable::new(config.first_page_len),
                slots,
                frontier: CachePadded::new(AtomicU64::new(0)),
                shards: (0..shards).map(|_| Shard::new()).collect(),
                caches: Roster::new(cache::FIRST_CACHES),
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
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let key = arena.insert([1.0f32, 2.0])?;
    /// let guard = arena.pin();
    /// assert_eq!(arena.get(key, &guard)?, &[1.0, 2.0]);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    #[inline]
    pub fn pin(&self) -> Guard {
        pin::pin(&self.collector, self.default_collector)
    }

    /// The collector whose guards protect this arena's reads.
    ///
    /// ```
    /// use ferropool::{Collector, SlotArena};
    /// let arena = SlotArena::with_collector(Collector::new());
    /// let key = arena.insert('k')?;
    /// let handle = arena.collector().register(); // a thread's own handle
    /// assert_eq!(arena.get(key, &handle.pin())?, &'k');
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn collector(&self) -> &Collector {
        &self.collector
    }

    /// This arena's identity, as carried by its keys.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let (a, b) = (SlotArena::new(), SlotArena::<u8>::new());
    /// let key = a.insert(1u8)?;
    /// assert_eq!(key.arena_id(), a.id());
    /// assert_ne!(a.id(), b.id());
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn id(&self) -> u64 {
        self.arena.shape.id.get()
    }

    /// Inserts `value` and returns its key. Lock-free; needs no pin.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let a = arena.insert("a")?;
    /// let b = arena.insert("b")?;
    /// assert_ne!(a, b);
    /// assert_eq!(arena.len(), 2);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ArenaError::Full`] when every slot index the arena may use
    /// ([`ArenaConfig::max_slots`], 2^32 - 1 by default) is in use (see the error for what
    /// counts); [`ArenaError::OutOfMemory`] when the arena needs a new page of slots
    /// and the system refuses it; `value` is dropped (see [`try_insert`](Self::try_insert)
    /// to get it back). One refusal ends the process instead, as a refused `Box::new` does:
    /// that of a page a concurrent [`trim`](Self::trim) released while this insert was
    /// claiming slots in it, which the insert allocates again after its claim.
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
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let key = arena.try_insert(vec![1u8; 4]).map_err(|(error, _refused)| error)?;
    /// assert_eq!(arena.with(key, |bytes| bytes.len())?, 4);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    ///
    /// # Panics
    ///
    /// As [`insert`](Self::insert).
    // Always inlined (its slow path is a cold function of its own): returned through memory,
    // the key was written as two 8-byte words and read back as one 16-byte one, a store the
    // CPU cannot forward; inlined, it stays in registers.
    #[inline(always)]
    pub fn try_insert(&self, value: T) -> Result<Key, (ArenaError, T)> {
        let arena = &self.arena;
        let cache = arena.my_cache();
        let (index, slot, value) = match cache.and_then(|(cache, _)| arena.pop_hand(cache)) {
            Some((index, slot)) => (index, slot, value),
            None => {
                let (index, value) = self.refilled_slot(cache, value)?;
                (index, arena.slots.at(index), value)
            }
        };
        // The slot is VACANT and ours alone: it came off a free list or from a fresh chunk.
        let generation = slot::generation(slot.state.load(Ordering::Relaxed));
        slot.value.with_mut(|value_ptr| {
            // SAFETY: the slot is VACANT (value uninitialised) and exclusively owned by this
            // call until the Release store below publishes it.
            unsafe { (*value_ptr).write(value) };
        });
        slot.state
            .store(slot::state(generation, OCCUPIED), Ordering::Release);
        Ok(Key::new(arena.shape.id, index, generation))
    }

    /// Reads the value of `key`. Writes no shared memory and takes no lock.
    ///
    /// The reference stays valid while `guard` lives, even if the value is removed meanwhile.
    ///
    /// ```
    /// use ferropool::{ArenaError, Collector, SlotArena};
    /// let arena = SlotArena::new();
    /// let key = arena.insert(7u64)?;
    /// assert_eq!(arena.get(key, &arena.pin())?, &7);
    /// let other = Collector::new().register();
    /// assert_eq!(arena.get(key, &other.pin()), Err(ArenaError::ForeignGuard));
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
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
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let key = arena.insert(String::from("layer.0"))?;
    /// assert_eq!(arena.with(key, |name| name.len())?, 7);
    /// arena.remove(key, &arena.pin())?;
    /// assert!(arena.with(key, |name| name.len()).is_err()); // the key is stale now
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get), except that the guard is always the arena's own.
    pub fn with<R>(&self, key: Key, f: impl FnOnce(&T) -> R) -> Result<R, ArenaError> {
        let guard = self.pin();
        self.get(key, &guard).map(f)
    }

    /// Whether `key` resolves to a live value.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let key = arena.insert(1i32)?;
    /// assert!(arena.contains(key));
    /// arena.remove(key, &arena.pin())?;
    /// assert!(!arena.contains(key));
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
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
    /// ```
    /// use ferropool::{ArenaError, SlotArena};
    /// let arena = SlotArena::new();
    /// let key = arena.insert(vec![1, 2])?;
    /// let guard = arena.pin();
    /// assert_eq!(arena.remove(key, &guard)?, &[1, 2]);
    /// assert!(matches!(arena.remove(key, &guard), Err(ArenaError::Stale { .. })));
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get); in particular removing twice yields [`ArenaError::Stale`].
    pub fn remove<'g>(&'g self, key: Key, guard: &'g Guard) -> Result<&'g T, ArenaError> {
        let arena = &self.arena;
        self.check_guard(guard)?;
        let slot = arena.mark_removed(key)?;
        self.add_to_batch(key.index(), guard);
        // SAFETY: this call won the OCCUPIED -> REMOVED transition, so the value is
        // initialised; it is dropped only after a grace period that waits for `guard`.
        Ok(slot
            .value
            .with(|value_ptr| unsafe { (*value_ptr).assume_init_ref() }))
    }

    /// Removes the value of `key` without reading it, and without an epoch pin. From now on
    /// the key resolves to [`ArenaError::Stale`]; the value is dropped as after
    /// [`remove`](Self::remove), once every thread that could have seen it has unpinned.
    ///
    /// This is the removal to use when the value is not needed: it costs the thread's cache
    /// lookup, an operation on that cache (two sequence stores and its light fence), a
    /// compare-exchange and a few plain stores, and a pin only when it fills a removal
    /// batch; `remove` needs a guard (the caller's pin) and checks it. A stale key may point
    /// into a page that a concurrent [`trim`](Self::trim) releases; `discard` reads the slot
    /// inside an operation on its thread's cache of this arena, and `trim` waits for such
    /// operations in flight before it frees a page. A thread without that cache (its
    /// thread-locals are being destroyed) pins instead.
    ///
    /// ```
    /// use ferropool::{ArenaError, SlotArena};
    /// let arena = SlotArena::new();
    /// let key = arena.insert(vec![1, 2])?;
    /// arena.discard(key)?;
    /// assert!(!arena.contains(key));
    /// assert!(matches!(arena.discard(key), Err(ArenaError::Stale { .. })));
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ArenaError::ForeignKey`], [`ArenaError::OutOfRange`] or [`ArenaError::Stale`] if the
    /// key does not resolve to a live value; removing twice yields [`ArenaError::Stale`].
    #[inline]
    pub fn discard(&self, key: Key) -> Result<(), ArenaError> {
        let Some((cache, shard)) = self.arena.my_cache() else {
            return self.discard_without_cache(key);
        };
        match self.arena.discard_in(cache, key)? {
            Added::Kept => {}
            added => self.defer_discarded(added, shard, key.index()),
        }
        Ok(())
    }

    /// Removes the value of `key` and returns it by value. Exclusive access means no reader
    /// can hold it, so the slot is reusable at once.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let mut arena = SlotArena::new();
    /// let key = arena.insert(String::from("grad"))?;
    /// assert_eq!(arena.take(key)?, "grad");
    /// let next = arena.insert(String::from("next"))?;
    /// assert_eq!(next.index(), key.index()); // the slot was reusable at once
    /// assert!(!arena.contains(key));
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
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
        if slot.vacate(key.generation().wrapping_add(1)) {
            // On top of the shard's free list, where any thread may take it; the hand goes
            // there first, so that this thread's next insert takes this slot.
            let shard = match arena.my_cache() {
                Some((cache, shard)) => {
                    let hand = cache.take_hand();
                    if hand != NIL {
                        arena.push_chain(shard, hand);
                    }
                    shard
                }
                None => arena.my_shard(),
            };
            arena.push_one(shard, key.index());
        }
        Ok(value)
    }

    /// Calls `f` on every live value, under one pin.
    ///
    /// Values inserted or removed concurrently may or may not be visited; every visited
    /// reference stays valid while `guard` lives.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// for x in [1u32, 2, 3] {
    ///     arena.insert(x)?;
    /// }
    /// let mut sum = 0;
    /// arena.for_each(&arena.pin(), |_key, x| sum += *x)?;
    /// assert_eq!(sum, 6);
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
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
                f(
                    Key::new(arena.shape.id, index, slot::generation(state)),
                    value,
                );
            }
        });
        Ok(())
    }

    /// The number of live values: a snapshot that may be stale by the time it returns.
    /// It counts slot states, so it costs O(capacity) and adds nothing to the hot paths.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let arena = SlotArena::new();
    /// let key = arena.insert(1u8)?;
    /// arena.insert(2u8)?;
    /// arena.remove(key, &arena.pin())?;
    /// assert_eq!(arena.len(), 1); // removed values are not counted
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn len(&self) -> usize {
        let _guard = self.pin(); // pages may be released by a concurrent `trim`
        let mut live = 0;
        self.arena.for_each_slot(|_, slot| {
            live += usize::from(slot::phase(slot.state.load(Ordering::Relaxed)) == OCCUPIED);
        });
        live
    }

    /// Whether [`len`](Self::len) is zero.
    ///
    /// ```
    /// use ferropool::SlotArena;
    /// let mut arena = SlotArena::new();
    /// let key = arena.insert(1u8)?;
    /// assert!(!arena.is_empty());
    /// arena.take(key)?;
    /// assert!(arena.is_empty());
    /// # Ok::<(), ferropool::ArenaError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rejects guards that do not protect this arena (another collector, or `unprotected`).
    #[inline]
    fn check_guard(&self, guard: &Guard) -> Result<(), ArenaError> {
        match guard.collector() {
            Some(collector) if *collector == self.collector => Ok(()),
            _ => Err(ArenaError::ForeignGuard),
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
            .field("id", &self.arena.shape.id)
            .field("capacity", &self.capacity())
            .field("removal_batch", &self.arena.shape.removal_batch)
            .field(
                "growth_before_stealing_slots",
                &self.arena.shape.growth_before_stealing,
            )
            .field("shards", &self.arena.shards.len())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
