//! A pool's books: the pool-wide counters, the counts of threads without a cache, and the
//! event trace.

use super::counters::{OpCounters, PoolCounters, CACHELESS};
use super::trace::{PoolEventKind, Trace};

/// What a pool counts and records beside its threads' own counts.
#[derive(Debug)]
pub(in crate::pool) struct Books {
    /// The counters of the slow paths, and the exact bytes in use with their peaks.
    pub(in crate::pool) counters: PoolCounters,
    /// The operations of threads without a cache (their thread-locals are being destroyed).
    pub(in crate::pool) cacheless: OpCounters,
    /// The event trace, once enabled (by the configuration or [`enable`](Books::enable));
    /// never replaced.
    trace: std::sync::OnceLock<Trace>,
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
}
