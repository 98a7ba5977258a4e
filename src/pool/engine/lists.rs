//! The shared lists of one pool ([`SharedLists`]): per size class, the blocks no thread
//! cache holds, in shards, and which classes the idle policy last saw drawn on. Their fields
//! are private: a block goes on a list and off it only through the methods here, which keep
//! the lists' invariant.

use crossbeam_utils::CachePadded;

use super::blocks::{BlockTable, Record};
use crate::pool::class;
use crate::stack::{TaggedStack, NIL};
use crate::sync::{AtomicU64, Ordering};

/// Shards of the shared lists (a power of two; two under loom, whose models run two or three
/// threads, so that a model still sees a block cross shards).
#[cfg(not(loom))]
pub(in crate::pool) const LIST_SHARDS: usize = 8;
#[cfg(loom)]
pub(in crate::pool) const LIST_SHARDS: usize = 2;

/// The shard of threads without a cache (they have no cache number).
pub(in crate::pool) const CACHELESS_SHARD: usize = 0;

/// One shard of the shared lists: a list per size class, packed (each shard on cache lines
/// of its own; classes of one shard share lines, as the shard's threads write them).
type ClassLists = [TaggedStack; class::CLASSES];

/// The shared lists: [`LIST_SHARDS`] shards of one list of blocks per size class. A thread
/// pushes the blocks it frees to its own shard (its cache's `shard`) and pops from its own
/// shard first, then from the others: any thread can take any listed block, and threads on
/// different shards share no list head.
pub(in crate::pool) struct SharedLists {
    /// Invariant: every block on a shard's list `c` holds `class_size(c)` bytes and is owned
    /// by the list (no thread cache, buffer or other list holds it); its record's `next`
    /// links the list. Pushed by [`push`](SharedLists::push), taken by the pops and
    /// [`take_all`](SharedLists::take_all), nothing else.
    shards: [CachePadded<ClassLists>; LIST_SHARDS],
    /// Per class, the idle round in which an allocation last drew on its list or the system:
    /// a heuristic for the idle policy, never a safety matter.
    last_drawn: [AtomicU64; class::CLASSES],
    /// Idle rounds so far (calls of `trim_idle`).
    idle_round: AtomicU64,
}

impl SharedLists {
    /// Writes empty lists at `p`, in place: the lists are too large to build on the stack and
    /// move (the pool's control block is built field by field where it lives).
    ///
    /// # Safety
    ///
    /// `p` is valid for writes of one `SharedLists` and properly aligned; what it held is
    /// overwritten without being dropped.
    pub(in crate::pool) unsafe fn init(p: *mut Self) {
        // SAFETY: the caller's contract; each field is written once, through raw pointers,
        // the arrays element by element.
        unsafe {
            let shards = std::ptr::addr_of_mut!((*p).shards).cast::<CachePadded<ClassLists>>();
            for shard in 0..LIST_SHARDS {
                let empty: ClassLists = std::array::from_fn(|_| TaggedStack::new());
                shards.add(shard).write(CachePadded::new(empty));
            }
            let last_drawn = std::ptr::addr_of_mut!((*p).last_drawn).cast::<AtomicU64>();
            for class in 0..class::CLASSES {
                last_drawn.add(class).write(AtomicU64::new(0));
            }
            std::ptr::addr_of_mut!((*p).idle_round).write(AtomicU64::new(0));
        }
    }

    /// Puts the block of `record`, of `class`, on `shard`'s list of its class. The caller
    /// gives up the block: it holds `class_size(class)` bytes, and no cache, buffer or list
    /// holds it any more.
    #[inline]
    pub(in crate::pool) fn push(&self, shard: usize, class: usize, record: &Record) {
        self.shards[shard][class].push_chain(record.index + 1, &record.next);
    }

    /// Takes a block of `class`: from `shard`'s list first, then from the other shards in
    /// turn; with `spare`, only from a list that keeps at least one more. The caller owns the
    /// block of the record returned.
    #[inline(always)]
    pub(in crate::pool) fn pop(
        &self,
        blocks: &BlockTable,
        shard: usize,
        class: usize,
        spare: bool,
    ) -> Option<u32> {
        let next = |i| &blocks.record(i).next;
        for k in 0..LIST_SHARDS {
            let list = &self.shards[(shard + k) & (LIST_SHARDS - 1)][class];
            let popped = if spare {
                list.pop_spare(next)
            } else {
                list.pop(next)
            };
            if popped.is_some() {
                return popped;
            }
        }
        None
    }

    /// Takes a block of `class` from `shard`'s list alone, if it has one.
    pub(in crate::pool) fn pop_from(
        &self,
        blocks: &BlockTable,
        shard: usize,
        class: usize,
    ) -> Option<u32> {
        self.shards[shard][class].pop(|i| &blocks.record(i).next)
    }

    /// Takes every block on the lists of `class`, every shard's, and calls `f` with each
    /// record (the caller owns each block); returns how many.
    pub(in crate::pool) fn take_all(
        &self,
        blocks: &BlockTable,
        class: usize,
        mut f: impl FnMut(u32),
    ) -> u64 {
        let mut taken = 0;
        for shard in &self.shards {
            let mut link = shard[class].take_all();
            while link != NIL {
                let record = link - 1;
                link = blocks.record(record).next.load(Ordering::Relaxed);
                taken += 1;
                f(record);
            }
        }
        taken
    }

    /// Records that an allocation drew on `class` in the current idle round. Stores only on
    /// a change, so a class in steady use keeps its line shared instead of bouncing it.
    #[inline]
    pub(in crate::pool) fn note_drawn(&self, class: usize) {
        let round = self.idle_round.load(Ordering::Relaxed);
        if self.last_drawn[class].load(Ordering::Relaxed) != round {
            self.last_drawn[class].store(round, Ordering::Relaxed);
        }
    }

    /// Starts the next idle round; returns its number.
    pub(in crate::pool) fn next_round(&self) -> u64 {
        self.idle_round.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether no allocation drew on `class` during the `rounds` rounds before `round`.
    pub(in crate::pool) fn idle(&self, class: usize, round: u64, rounds: u64) -> bool {
        // Saturating: a racing call may have advanced the round already.
        round.saturating_sub(self.last_drawn[class].load(Ordering::Relaxed)) > rounds
    }
}
