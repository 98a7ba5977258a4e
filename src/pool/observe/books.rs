//! A pool's books ([`Books`]): the pool-wide counters (the slow paths' counts, and the exact
//! bytes in use with their peaks, behind their sole-writer protocol), the counts of threads
//! without a cache, and the event trace. Their fields are private: the engine counts and
//! reads through the methods here.

use crossbeam_utils::CachePadded;

use super::counters::{add, OpCounters, ResetPeak, Writers, CACHELESS};
use super::trace::{PoolEventKind, Trace};
use crate::pool::config::PoolConfig;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// What a pool counts and records beside its threads' own counts.
#[derive(Debug)]
pub(in crate::pool) struct Books {
    /// The counters of the slow paths, and the exact bytes in use with their peaks.
    counters: PoolCounters,
    /// The operations of threads without a cache (their thread-locals are being destroyed).
    cacheless: OpCounters,
    /// The event trace, once enabled (by the configuration or [`enable`](Books::enable));
    /// never replaced.
    trace: std::sync::OnceLock<Trace>,
}

/// Pool-wide counters: those of the slow paths (read-modify-writes are fine there), and the
/// exact bytes in use with their peaks. (What the pool holds from the system, and its peak,
/// are the memory's books: `engine/memory.rs`.)
#[derive(Default, Debug)]
struct PoolCounters {
    /// The bytes in use (with `exact_peaks`) and requested (with `exact_requested`), on a
    /// cache line of their own: the hot path writes them.
    live: CachePadded<LiveBytes>,
    trims: AtomicU64,
    retries: AtomicU64,
    budget_failures: AtomicU64,
}

/// `LiveBytes::solo` before any thread counted in the exact counters.
const SOLO_NONE: u32 = 0;
/// `LiveBytes::solo` while a second thread waits out the sole writer's operation.
const SOLO_SWITCHING: u32 = u32::MAX - 1;
/// `LiveBytes::solo` once more than one thread may write the exact counters: for good.
const SOLO_SHARED: u32 = u32::MAX;

/// The value of `LiveBytes::solo` that makes `thread` the sole writer, if its index allows.
#[inline(always)]
fn solo_value(thread: u32) -> Option<u32> {
    thread
        .checked_add(1)
        .filter(|&value| value < SOLO_SWITCHING)
}

/// The exact counters of `exact_peaks` and `exact_requested`.
#[derive(Default, Debug)]
struct LiveBytes {
    /// Bytes (class sizes) of the blocks handed out: every allocation adds, every free
    /// subtracts, so each value it takes is the true figure at that instant.
    ///
    /// Invariant: while `solo` names a thread index, only the thread holding that index
    /// writes it (and `requested`), inside an operation of its cache, with a load and a
    /// store (a thread that takes the index after its holder exited takes the role too: the
    /// index's hand-over orders their accesses); otherwise every writer
    /// uses one read-modify-write per change. A thread that finds another one named there
    /// moves `solo` to [`SOLO_SWITCHING`], fences heavily, waits out the named thread's
    /// operation in flight and only then stores [`SOLO_SHARED`]; the named index's thread checks
    /// `solo` inside each operation, after the operation's light fence, so it either sees
    /// the switch or is waited out (the handshake of `crate::handshake`).
    in_use: AtomicU64,
    /// Requested bytes of the blocks handed out (same rule).
    requested: AtomicU64,
    /// Who may write `in_use` and `requested`: [`SOLO_NONE`] (nobody yet), a thread index
    /// plus one (that thread alone, with loads and stores: a pool one thread uses pays no
    /// locked instruction for its exact counts), [`SOLO_SWITCHING`], or [`SOLO_SHARED`].
    /// Moves only forward (none, a thread, switching, shared) by compare-exchange, and to
    /// shared by a `Release` store after the wait; a thread joins (see
    /// `PoolInner::join_exact_counters`) before it first counts.
    ///
    /// On a cache line of its own: every operation reads it, and only a joining thread
    /// writes it. On the counters' line, its load fetched a line the other thread had just
    /// written for reading, and the add then had to take it again for writing.
    solo: CachePadded<AtomicU32>,
    /// Invariant: the largest value `in_use` took since the last reset, as far as its
    /// movers and readers raised it (an allocation raises it with the value its add gave, a
    /// read with the value it reports); never a value `in_use` did not take, nor one it
    /// took before the last reset ([`ResetPeak`]).
    peak_in_use: ResetPeak,
    /// The same for `requested`.
    peak_requested: ResetPeak,
}

impl Books {
    /// Books with every count at zero, tracing with a ring of `trace_capacity` events if it
    /// is not zero (the ring comes from the system allocator directly, never from a pool).
    pub(in crate::pool) fn new(trace_capacity: usize) -> Self {
        let trace = std::sync::OnceLock::new();
        if trace_capacity > 0 {
            let _ = trace.set(Trace::new(trace_capacity));
        }
        Self {
            counters: PoolCounters::default(),
            cacheless: OpCounters::default(),
            trace,
        }
    }

    /// The event trace, if tracing is on.
    #[inline(always)]
    pub(in crate::pool) fn ring(&self) -> Option<&Trace> {
        self.trace.get()
    }

    /// Starts tracing with a ring of `capacity` events (above 0), unless it traces already;
    /// whether this call started it.
    pub(in crate::pool) fn enable(&self, capacity: usize) -> bool {
        capacity > 0 && self.trace.set(Trace::new(capacity)).is_ok()
    }

    /// Records an event made by the calling thread, if tracing is on.
    #[inline(always)]
    pub(in crate::pool) fn trace(&self, kind: PoolEventKind, bytes: u64, class: usize) {
        if let Some(trace) = self.ring() {
            let thread = crate::thread::index().map_or(CACHELESS, |t| t as u32);
            trace.record(kind, bytes, class, thread, "");
        }
    }

    /// The counts of the threads without a cache, for `ThreadCaches::op_totals` to add up.
    pub(in crate::pool) fn cacheless(&self) -> &OpCounters {
        &self.cacheless
    }

    /// Counts an operation of a thread without a cache, in the shared counters and (with
    /// the configuration) the exact ones, as a cache's operation is counted.
    pub(in crate::pool) fn count_cacheless(
        &self,
        config: &PoolConfig,
        class_bytes: usize,
        requested: usize,
        allocation: bool,
    ) {
        if allocation {
            self.cacheless
                .count_alloc(false, class_bytes, requested, Writers::Shared);
        } else {
            self.cacheless
                .count_free(class_bytes, requested, Writers::Shared);
        }
        let (bytes, requested) = (class_bytes as u64, requested as u64);
        if allocation {
            self.exact_alloc(config, bytes, requested, Writers::Shared);
        } else {
            self.exact_free(config, bytes, requested, Writers::Shared);
        }
    }

    /// Counts a change of a block's requested size from `old` to `new` bytes by a thread
    /// without a cache, as [`count_cacheless`](Self::count_cacheless) counts its operations.
    pub(in crate::pool) fn count_cacheless_resize(
        &self,
        config: &PoolConfig,
        old: usize,
        new: usize,
    ) {
        self.cacheless.count_resize(old, new, Writers::Shared);
        self.exact_resize(config, old as u64, new as u64, Writers::Shared);
    }

    /// Counts a trim.
    pub(in crate::pool) fn count_trim(&self) {
        self.counters.trims.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a retry after releasing cached memory.
    pub(in crate::pool) fn count_retry(&self) {
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request the budget refused.
    pub(in crate::pool) fn count_budget_failure(&self) {
        self.counters
            .budget_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The slow paths' counts: retries, budget failures, trims.
    pub(in crate::pool) fn slow_counts(&self) -> (u64, u64, u64) {
        let c = &self.counters;
        (
            c.retries.load(Ordering::Relaxed),
            c.budget_failures.load(Ordering::Relaxed),
            c.trims.load(Ordering::Relaxed),
        )
    }

    /// The exact bytes in use now (with `exact_peaks`).
    pub(in crate::pool) fn in_use(&self) -> u64 {
        self.counters.live.in_use.load(Ordering::Relaxed)
    }

    /// The exact requested bytes now (with `exact_requested`).
    pub(in crate::pool) fn requested(&self) -> u64 {
        self.counters.live.requested.load(Ordering::Relaxed)
    }

    /// The exact bytes in use now, and their peak raised to it: one load, the figure at one
    /// instant, so that no later read reports a peak below a figure reported before.
    pub(in crate::pool) fn in_use_and_peak(&self) -> (u64, u64) {
        let live = &self.counters.live;
        live.peak_in_use.read(&live.in_use)
    }

    /// The exact requested bytes now, and their peak raised to it.
    pub(in crate::pool) fn requested_and_peak(&self) -> (u64, u64) {
        let live = &self.counters.live;
        live.peak_requested.read(&live.requested)
    }

    /// Whether the calling thread (`thread`, with its cache claimed; `None` for a thread
    /// without a cache) may count in the exact counters already: they are shared, or the
    /// thread is their sole writer (see the invariant on `LiveBytes::in_use`).
    #[inline(always)]
    pub(in crate::pool) fn exact_joined(&self, thread: Option<u32>) -> bool {
        let solo = self.counters.live.solo.load(Ordering::Acquire);
        solo == SOLO_SHARED || thread.and_then(solo_value) == Some(solo)
    }

    /// Makes the calling thread one that may count in the exact counters: the first thread
    /// with a cache becomes their sole writer; any other thread ends that, calling
    /// `wait_out(writer)` with the sole writer's thread once it has marked them switching, to
    /// fence heavily and wait out that thread's operation in flight, before it marks them
    /// shared (see the invariant on `LiveBytes::in_use`).
    pub(in crate::pool) fn join_exact(&self, thread: Option<u32>, wait_out: impl FnOnce(u32)) {
        let solo = &self.counters.live.solo;
        let mine = thread.and_then(solo_value);
        let mut current = solo.load(Ordering::Acquire);
        loop {
            let next = match current {
                SOLO_SHARED => return,
                // Another thread is waiting out the sole writer: after its wait, shared.
                SOLO_SWITCHING => {
                    crate::sync::yield_now();
                    current = solo.load(Ordering::Acquire);
                    continue;
                }
                SOLO_NONE => mine.unwrap_or(SOLO_SHARED),
                owner if Some(owner) == mine => return,
                _ => SOLO_SWITCHING,
            };
            match solo.compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if next == SOLO_SWITCHING => break,
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
        // `current` is the sole writer's value (its thread plus one), whose cache exists:
        // it claimed it before it joined. From its next operation on it sees the switch (its
        // light fence pairs with the caller's heavy one); the one in flight, if any, is
        // waited out.
        wait_out(current - 1);
        solo.store(SOLO_SHARED, Ordering::Release);
    }

    /// How the calling thread, `thread` (with a cache, inside one of its operations),
    /// writes the exact counters `config` keeps: alone with loads and stores when it is
    /// their sole writer, else with read-modify-writes. (Without exact counters the answer
    /// is never used, and nothing is loaded.)
    #[inline(always)]
    pub(in crate::pool) fn exact_writers(&self, config: &PoolConfig, thread: u32) -> Writers {
        if config.exact_counters()
            && solo_value(thread) == Some(self.counters.live.solo.load(Ordering::Relaxed))
        {
            Writers::Owner
        } else {
            Writers::Shared
        }
    }

    /// Counts an allocation of `bytes` (`requested`) in the exact counters `config` keeps,
    /// written as `writers` says ([`exact_writers`](Self::exact_writers)).
    #[inline]
    pub(in crate::pool) fn exact_alloc(
        &self,
        config: &PoolConfig,
        bytes: u64,
        requested: u64,
        writers: Writers,
    ) {
        // Wrapping: inside a pool operation nothing may panic (a panic there would leave
        // the thread's cache busy for good); the counts never exceed the bytes held.
        let live = &self.counters.live;
        if config.exact_peaks {
            let since = live.peak_in_use.since();
            let in_use = add(&live.in_use, bytes, writers, Ordering::Relaxed);
            let _ = live.peak_in_use.raise(since, in_use);
        }
        if config.exact_requested {
            let since = live.peak_requested.since();
            let requested = add(&live.requested, requested, writers, Ordering::Relaxed);
            let _ = live.peak_requested.raise(since, requested);
        }
    }

    /// Counts a free in the exact counters `config` keeps.
    #[inline]
    pub(in crate::pool) fn exact_free(
        &self,
        config: &PoolConfig,
        bytes: u64,
        requested: u64,
        writers: Writers,
    ) {
        if config.exact_peaks {
            add(
                &self.counters.live.in_use,
                bytes.wrapping_neg(),
                writers,
                Ordering::Relaxed,
            );
        }
        if config.exact_requested {
            add(
                &self.counters.live.requested,
                requested.wrapping_neg(),
                writers,
                Ordering::Relaxed,
            );
        }
    }

    /// Moves the requested bytes of a block handed out from `old` to `new` (an in-place
    /// reallocation), in the exact counter of requested bytes if `config` keeps it.
    #[inline]
    pub(in crate::pool) fn exact_resize(
        &self,
        config: &PoolConfig,
        old: u64,
        new: u64,
        writers: Writers,
    ) {
        if !config.exact_requested {
            return;
        }
        let live = &self.counters.live;
        let since = live.peak_requested.since();
        let requested = add(
            &live.requested,
            new.wrapping_sub(old),
            writers,
            Ordering::Relaxed,
        );
        if new >= old {
            let _ = live.peak_requested.raise(since, requested);
        }
    }

    /// Starts the peaks again from the current values, each in a new generation: no read
    /// or allocation that read a counter before the reset raises the new peak with it (see
    /// [`ResetPeak`]). An allocation racing the reset may lose its raise; the next read
    /// raises the peak again while the block lives.
    pub(in crate::pool) fn reset_peaks(&self, config: &PoolConfig) {
        let live = &self.counters.live;
        if config.exact_peaks {
            live.peak_in_use.reset(&live.in_use);
        }
        if config.exact_requested {
            live.peak_requested.reset(&live.requested);
        }
    }
}
