//! The registry of a pool's evictable values ([`Evictor`], a field of `PoolInner`, its fields
//! private), the policy that chooses among them, and its scoring. Evictable blocks are
//! buffers whose owner lets the pool take them back when its budget refuses a request, and
//! which the owner rebuilds when it next needs them (see
//! [`RetainedValue::evictable`](crate::RetainedValue::evictable), which builds on this).
//!
//! When an allocation through a handle
//! ([`BufferPool::alloc`](crate::pool::BufferPool::alloc) and friends, never the global
//! allocator's front end) is refused by the budget, the allocation entry in `engine/alloc.rs`
//! calls this file's one hook, `make_room`, and retries. `make_room` first takes Coop's step for a
//! request of 256 KiB or more (which the page layer serves): it evicts the cheapest *window*, a run
//! of values whose blocks, with the free pages beside and between them, make one free range the
//! request fits in, so that it takes those pages rather than new ones (see `evict_window` for when
//! it does not). Then, until the budget has room, it evicts one value at a time, the one with the
//! lowest score among those no reader pins: first among the values whose block is of the class the
//! request needs (the freed block serves it directly, so what the pool reserves stays what is
//! live), then among all. The score is the policy's behind the seam of `score.rs` (the pool's:
//! Dynamic Tensor Rematerialization's, the cost of recomputing the value, evicted inputs
//! included, over its bytes times its staleness, pool clock ticks since its last pin); the
//! cost with the evicted inputs is here (`cost_now`).
//!
//! Each value's state is a small lock (`Mutex` and `Condvar`), taken by readers, the
//! recomputing thread and the evicting thread, never while allocating or running user code,
//! so no lock is held across a recursive request. The allocation fast path is untouched:
//! eviction starts only once the budget has refused a request.

use std::fmt;

use super::score;
use super::value::{Clock, Evictable, Residence, ValueBlock};
use super::window::lightest_window;
use crate::pool::class;
use crate::pool::error::{OutOfMemory, PoolError};
use crate::pool::observe::stats::PoolStats;
use crate::pool::pages::Beside;
use crate::sync::{Arc, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, Tally};
use crate::thread;

/// What the eviction asks of the pool it serves (`PoolInner` answers, in `engine/inner.rs`):
/// the registry is a part of the pool's state, so it names the pool through this contract.
pub(in crate::pool) trait PoolView {
    /// Records an eviction of a block of `bytes` and `class` in the trace.
    fn trace_eviction(&self, bytes: u64, class: usize);
    /// Whether a freed block of `bytes` goes straight back to the page layer.
    fn merges_on_free(&self, bytes: usize) -> bool;
    /// Whether a block of `class`, freed by any thread, goes straight back to the page layer.
    fn freed_to_pages(&self, class: usize) -> bool;
    /// Whether a free range of the page layer holds `bytes` of resident pages in a run.
    fn has_dirty_run(&self, bytes: usize) -> bool;
    /// Fills in the free bytes beside each of `blocks` (the page layer's look).
    fn free_beside(&self, blocks: &mut [Beside]);
    /// The bytes in use now.
    fn bytes_in_use(&self) -> u64;
}

/// The registry of a pool's evictable values, and what eviction counts.
pub(in crate::pool) struct Evictor<B> {
    registry: Mutex<Registry<B>>,
    /// Values registered now (read without the lock to skip eviction when there are none).
    registered: AtomicUsize,
    /// The clock of staleness: one tick per pin.
    clock: Clock,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    /// Evictions by the class of the block given back (one count per class).
    evicted_by_class: Box<[Tally]>,
    /// Values the window step evicted (they count in `evictions` too).
    window_evictions: Tally,
    recomputations: AtomicU64,
    recomputed_bytes: AtomicU64,
    recompute_ns: AtomicU64,
}

/// The registered values by slot; vacant slots are reused.
struct Registry<B> {
    slots: Vec<Option<Arc<Evictable<B>>>>,
    vacant: Vec<usize>,
}

impl<B> Default for Registry<B> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
        }
    }
}

impl<B> fmt::Debug for Evictor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evictor")
            .field("registered", &self.registered.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<B> Evictor<B> {
    pub(in crate::pool) fn new() -> Self {
        Self {
            registry: Mutex::new(Registry::default()),
            registered: AtomicUsize::new(0),
            clock: Clock::new(),
            evictions: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            evicted_by_class: (0..class::CLASSES).map(|_| Tally::new(0)).collect(),
            window_evictions: Tally::new(0),
            recomputations: AtomicU64::new(0),
            recomputed_bytes: AtomicU64::new(0),
            recompute_ns: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry<B>> {
        // Nothing panics while the registry is locked but a failed allocation of its
        // tables, which leaves it as it was.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clock of staleness, which a pin or a fill of a value ticks.
    pub(in crate::pool) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Evictions by the class of the block given back, for `BufferPool::class_stats`.
    pub(in crate::pool) fn evicted_by_class(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.evicted_by_class
            .iter()
            .enumerate()
            .map(|(class, count)| (class, count.get()))
    }

    /// Fills in the eviction's figures of `stats`.
    pub(in crate::pool) fn stats(&self, stats: &mut PoolStats) {
        stats.evictions = self.evictions.load(Ordering::Relaxed);
        stats.evicted_bytes = self.evicted_bytes.load(Ordering::Relaxed);
        stats.window_evictions = self.window_evictions.get();
        stats.recomputations = self.recomputations.load(Ordering::Relaxed);
        stats.recomputed_bytes = self.recomputed_bytes.load(Ordering::Relaxed);
        stats.recompute_ns = self.recompute_ns.load(Ordering::Relaxed);
    }
}

impl<B: ValueBlock> Evictor<B> {
    /// Registers a resident value of `buffer`'s block, recomputed at `cost` from `parents`.
    pub(in crate::pool) fn register(
        &self,
        buffer: B,
        cost: u64,
        parents: Box<[Arc<Evictable<B>>]>,
    ) -> Arc<Evictable<B>> {
        // The registry's own tables are bookkeeping: never from this pool (or any pool
        // behind the global allocator).
        let _scope = thread::Bookkeeping::open();
        let mut registry = self.lock();
        let slot = match registry.vacant.pop() {
            Some(slot) => slot,
            None => {
                registry.slots.push(None);
                registry.slots.len() - 1
            }
        };
        let value = Arc::new(Evictable::new(
            slot,
            buffer,
            cost,
            parents,
            self.clock.tick(),
        ));
        registry.slots[slot] = Some(Arc::clone(&value));
        self.registered.fetch_add(1, Ordering::Relaxed);
        value
    }

    /// Takes a value out of the registry (its owner is dropping it); its block goes back to
    /// the pool when the last reference drops.
    pub(in crate::pool) fn unregister(&self, value: &Evictable<B>) {
        let entry = {
            let _scope = thread::Bookkeeping::open();
            let mut registry = self.lock();
            // Only this value's own entry (its slot is fixed at registration, and vacant
            // slots are reused).
            let entry = registry
                .slots
                .get_mut(value.slot())
                .filter(|entry| {
                    entry
                        .as_deref()
                        .is_some_and(|held| std::ptr::eq(held, value))
                })
                .and_then(Option::take);
            if entry.is_some() {
                registry.vacant.push(value.slot());
                self.registered.fetch_sub(1, Ordering::Relaxed);
            }
            entry
        };
        drop(entry); // outside the lock: it may be the last reference, and free the block
    }

    /// Evicts `value` now if it is resident and unpinned (a user's call, through its
    /// handle); whether it did.
    pub(in crate::pool) fn evict(&self, pool: &impl PoolView, value: &Evictable<B>) -> bool {
        let taken = value.take(&mut value.lock());
        self.evicted(pool, taken)
    }

    /// Counts an eviction and gives its block back (no lock held).
    fn evicted(&self, pool: &impl PoolView, taken: Option<B>) -> bool {
        let Some(buffer) = taken else {
            return false;
        };
        let (bytes, class) = (buffer.bytes(), buffer.class());
        drop(buffer);
        self.evictions.fetch_add(1, Ordering::Relaxed);
        self.evicted_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(count) = self.evicted_by_class.get(class) {
            count.add(1);
        }
        pool.trace_eviction(bytes, class);
        true
    }

    /// Counts a recompute of `bytes` that took `ns` nanoseconds.
    pub(in crate::pool) fn count_recompute(&self, bytes: u64, ns: u64) {
        self.recomputations.fetch_add(1, Ordering::Relaxed);
        self.recomputed_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.recompute_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Evicts the unpinned resident value with the lowest score, preferring blocks of
    /// `class`; the bytes and class of the block given back, or `None` if no value could be
    /// evicted. The look waits for each value's lock; a value that a reader pins between the
    /// choice and the take makes it look again, a bounded number of times.
    fn evict_one(&self, pool: &impl PoolView, class: usize) -> Option<(u64, usize)> {
        const LOOKS: usize = 64;
        for _ in 0..LOOKS {
            match self.try_evict_one(pool, class) {
                Looked::Evicted(freed) => return Some(freed),
                Looked::Nothing => return None,
                Looked::Busy => crate::sync::yield_now(),
            }
        }
        None
    }

    /// One look at the registry for [`evict_one`](Self::evict_one).
    fn try_evict_one(&self, pool: &impl PoolView, class: usize) -> Looked {
        let buffer = {
            let registry = self.lock();
            let now = self.clock.now();
            // (score, same class, value): the lowest score among the values of `class`, or
            // among all if none of `class` can go.
            let mut best: Option<(f64, bool, &Arc<Evictable<B>>)> = None;
            for value in registry.slots.iter().flatten() {
                // Waits for the value's lock: it is held only for a few instructions (a pin,
                // an unpin, a query, the start or end of a recompute; never across user code
                // or an allocation), and no thread that holds it takes the registry's lock,
                // so the wait is short and cannot deadlock. Skipping a value whose lock was
                // busy made a refusal depend on another thread's timing: a thread querying
                // `is_resident` in a loop, preempted with the lock held, made 5 of every
                // 81-218 requests fail.
                let state = value.lock();
                if state.phase != Residence::Resident || state.readers > 0 {
                    continue;
                }
                drop(state);
                let (cost, stale) = cost_and_staleness(value, now);
                let score = score::score(cost, value.bytes() as f64, stale);
                let same = value.class() == class;
                let better = match best {
                    None => true,
                    Some((s, best_same, _)) => (same, -score) > (best_same, -s),
                };
                if better {
                    best = Some((score, same, value));
                }
            }
            let Some((_, _, value)) = best else {
                return Looked::Nothing;
            };
            let taken = value.take(&mut value.lock());
            // Pinned since it was chosen: look again.
            let Some(buffer) = taken else {
                return Looked::Busy;
            };
            buffer
        };
        let freed = (buffer.bytes(), buffer.class());
        self.evicted(pool, Some(buffer));
        Looked::Evicted(freed)
    }

    /// Coop's step, before DTR's, for a request of `need` bytes (of `class`) that the page
    /// layer serves and merges on free (256 KiB and more, under a budget) and for which the
    /// budget lacks `short` bytes: evicts the cheapest *window*, a run of values whose
    /// blocks, with the free pages beside and between them, make one free range of at
    /// least `need` bytes, so that the request takes those pages rather than mapping or
    /// faulting in others while the budget purges the freed ones. Only values whose blocks
    /// go straight back to the page layer when evicted count (`PoolInner::freed_to_pages`:
    /// not the classes the thread caches keep, by default those up to 1 MiB), and a window
    /// evicts at most `max(need, short)` bytes (a window is never a large value evicted
    /// for a small request). A window weighs the sum of its values' recompute costs, each
    /// over its staleness (DTR's score without the bytes, which the bound caps); the
    /// lightest wins, then the shortest.
    ///
    /// Nothing is evicted when the budget lacks nothing, when an unpinned value of the
    /// request's own class is resident (its block serves the request directly: DTR's
    /// same-class step), when a free range already holds `need` resident pages in a run,
    /// or when no window exists; nor when a window's value was pinned, evicted or moved
    /// since the look: the window is taken whole or not at all. Returns the bytes evicted.
    fn evict_window(&self, pool: &impl PoolView, class: usize, need: usize, short: u64) -> u64 {
        if short == 0 || !pool.merges_on_free(need) || pool.has_dirty_run(need) {
            return 0;
        }
        let cap = u64::try_from(need).unwrap_or(u64::MAX).max(short);
        let registry = self.lock();
        let now = self.clock.now();
        // (block, weight, value) of each value the window may take, by address.
        let mut found: Vec<(Beside, f64, &Arc<Evictable<B>>)> = Vec::new();
        for value in registry.slots.iter().flatten() {
            let state = value.lock();
            let Some(start) = value.block_start(&state).filter(|_| state.readers == 0) else {
                continue;
            };
            let (value_class, bytes) = (value.class(), value.bytes());
            drop(state);
            if value_class == class {
                return 0;
            }
            if !pool.freed_to_pages(value_class) {
                continue;
            }
            let (cost, stale) = cost_and_staleness(value, now);
            let block = Beside {
                start,
                len: usize::try_from(bytes).unwrap_or(usize::MAX),
                ..Beside::default()
            };
            found.push((block, score::weight(cost, stale), value));
        }
        found.sort_by_key(|(block, ..)| block.start);
        let mut blocks: Vec<Beside> = found.iter().map(|(block, ..)| *block).collect();
        pool.free_beside(&mut blocks);
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let Some((first, last)) = lightest_window(&blocks, |i| found[i].1, need, cap) else {
            return 0;
        };
        // Whole or not at all: every value of the window still resident, unpinned and at
        // the address looked at. (Several value locks at once: no other thread holds one
        // value's lock while it takes another's, so this cannot deadlock.)
        let window = &found[first..=last];
        let mut states: Vec<_> = window.iter().map(|(_, _, value)| value.lock()).collect();
        let unchanged = window
            .iter()
            .zip(&states)
            .all(|((block, _, value), state)| {
                state.readers == 0 && value.block_start(state) == Some(block.start)
            });
        if !unchanged {
            return 0;
        }
        let taken: Vec<B> = window
            .iter()
            .zip(&mut states)
            .filter_map(|((_, _, value), state)| value.take(state))
            .collect();
        drop(states);
        drop(registry);
        let mut freed = 0u64;
        for buffer in taken {
            freed = freed.saturating_add(buffer.bytes());
            if self.evicted(pool, Some(buffer)) {
                self.window_evictions.add(1);
            }
        }
        freed
    }

    /// What the registered values hold: pinned bytes, and unpinned resident bytes.
    fn evictables_held(&self) -> Held {
        let mut held = Held::default();
        if self.registered.load(Ordering::Relaxed) == 0 {
            return held;
        }
        let registry = self.lock();
        for value in registry.slots.iter().flatten() {
            let state = value.lock();
            match (state.phase, state.readers) {
                (Residence::Resident, 0) => held.evictable += value.bytes(),
                (Residence::Resident, _) => held.pinned += value.bytes(),
                _ => {}
            }
        }
        held
    }

    /// The eviction's hook in the allocation path (see `engine/alloc.rs`): a request of
    /// `class` that the budget refused with `report`, from a door that evicts. Evicts values
    /// until the request may fit: what the budget lacked, unless a block of the class itself
    /// comes back (it serves the request directly). Whether the request should try again:
    /// false once no value is left to evict, and at once (`first`) for a request that would
    /// not fit with every unpinned value evicted, which evicts none: what no eviction can
    /// free (plain buffers, pinned values) plus the request must fit.
    pub(in crate::pool) fn make_room(
        &self,
        pool: &impl PoolView,
        class: usize,
        report: &OutOfMemory,
        first: bool,
    ) -> bool {
        // Whatever the eviction allocates (the search's short list) goes to the global
        // front end's fallback, if that front end is ferropool's: never back into this pool
        // while this thread holds the registry's lock.
        let _scope = thread::Bookkeeping::open();
        let block_bytes = report.block_bytes as u64;
        if first {
            if self.registered.load(Ordering::Relaxed) == 0 {
                return false;
            }
            let evictable = self.evictables_held().evictable;
            if self.short_with_every_eviction(pool, block_bytes, report.budget, evictable) > 0 {
                return false;
            }
        }
        let short = report
            .reserved
            .saturating_add(block_bytes)
            .saturating_sub(report.budget.unwrap_or(u64::MAX));
        let mut freed = self.evict_window(pool, class, report.block_bytes, short);
        if freed > 0 && freed >= short {
            return true;
        }
        while let Some((bytes, evicted_class)) = self.evict_one(pool, class) {
            freed = freed.saturating_add(bytes);
            if evicted_class == class || freed >= short {
                return true;
            }
        }
        false
    }

    /// The error of a request the budget refused with `report` and no eviction served: the
    /// report says what the evictable values still hold.
    pub(in crate::pool) fn refused(
        &self,
        pool: &impl PoolView,
        mut report: Box<OutOfMemory>,
    ) -> PoolError {
        let held = self.evictables_held();
        report.evictable_pinned = held.pinned;
        report.evictable_unpinned = held.evictable;
        report.short_with_every_eviction = self.short_with_every_eviction(
            pool,
            report.block_bytes as u64,
            report.budget,
            held.evictable,
        );
        PoolError::BudgetExceeded(report)
    }

    /// The bytes a request of `block_bytes` lacks under `budget` even were every unpinned
    /// evictable value (`evictable` bytes, from [`evictables_held`](Self::evictables_held))
    /// evicted; 0: evicting would make room. The bytes in use that no eviction can free,
    /// plain buffers and pinned values, plus the request.
    fn short_with_every_eviction(
        &self,
        pool: &impl PoolView,
        block_bytes: u64,
        budget: Option<u64>,
        evictable: u64,
    ) -> u64 {
        pool.bytes_in_use()
            .saturating_sub(evictable)
            .saturating_add(block_bytes)
            .saturating_sub(budget.unwrap_or(u64::MAX))
    }
}

/// What evictable values held when a request failed: bytes pinned by readers (or recomputes),
/// and bytes resident and unpinned (which the pool could not take: another thread held them
/// for a moment).
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    pinned: u64,
    evictable: u64,
}

/// What one look at the registry did.
enum Looked {
    /// Evicted a value: the bytes and class of its block.
    Evicted((u64, usize)),
    /// Found no value to evict.
    Nothing,
    /// The value it chose was pinned before it could take it: look again.
    Busy,
}

/// What the score weighs `value` by at pool clock `now`: its recompute cost now
/// ([`cost_now`]) and its staleness, the clock ticks since its last pin plus one.
fn cost_and_staleness<B: ValueBlock>(value: &Evictable<B>, now: u64) -> (f64, f64) {
    let stale = now.saturating_sub(value.last_use()) + 1;
    (cost_now(value) as f64, stale as f64)
}

/// The cost of recomputing `value` now: its own, plus that of its evicted ancestors (DTR's
/// evicted neighbourhood), looked at through at most 64 of them.
fn cost_now<B: ValueBlock>(value: &Evictable<B>) -> u64 {
    let mut cost = value.own_cost();
    let mut stack: Vec<&Evictable<B>> = value.parents().iter().map(|p| &**p).collect();
    let mut visited = 0;
    while let Some(parent) = stack.pop() {
        visited += 1;
        if visited > 64 {
            break;
        }
        if !parent.seems_resident() {
            cost = cost.saturating_add(parent.own_cost());
            stack.extend(parent.parents().iter().map(|p| &**p));
        }
    }
    cost.max(1)
}
