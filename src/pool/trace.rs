//! The pool's event trace: a bounded ring of events, off unless configured.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Instant;

use crate::sync::Mutex;

/// What happened to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolEventKind {
    /// A buffer was handed out.
    Alloc,
    /// A buffer came back.
    Free,
    /// A block was obtained from the system.
    SystemAlloc,
    /// A block went back to the system.
    SystemFree,
    /// `trim` ran (`size` is the bytes it released).
    Trim,
}

impl PoolEventKind {
    fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::Free => "free",
            Self::SystemAlloc => "system_alloc",
            Self::SystemFree => "system_free",
            Self::Trim => "trim",
        }
    }
}

/// One traced event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolEvent {
    /// Nanoseconds since the pool was created.
    pub at_ns: u64,
    /// What happened.
    pub kind: PoolEventKind,
    /// Block bytes (the class size), or the bytes released for `Trim`.
    pub size: u64,
    /// The size class index (0 for `Trim`).
    pub class: u32,
    /// A small per-process index of the thread that caused the event.
    pub thread: u32,
}

/// The ring.
pub(super) struct Trace {
    started: Instant,
    capacity: usize,
    ring: Mutex<VecDeque<PoolEvent>>,
}

impl Trace {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            started: Instant::now(),
            capacity,
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(1 << 16))),
        }
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    pub(super) fn record(&self, kind: PoolEventKind, size: u64, class: u32, thread: u32) {
        let at_ns = self.now_ns();
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == self.capacity {
            ring.pop_front();
        }
        ring.push_back(PoolEvent {
            at_ns,
            kind,
            size,
            class,
            thread,
        });
    }

    pub(super) fn events(&self) -> Vec<PoolEvent> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter().copied().collect()
    }
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// Renders events as JSON: `{"events":[{"t_ns":..,"kind":"alloc",..},..]}`.
pub(super) fn to_json(events: &[PoolEvent]) -> String {
    let mut out = String::with_capacity(32 + events.len() * 80);
    out.push_str("{\"events\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"t_ns\":{},\"kind\":\"{}\",\"size\":{},\"class\":{},\"thread\":{}}}",
            e.at_ns,
            e.kind.name(),
            e.size,
            e.class,
            e.thread
        );
    }
    out.push_str("]}");
    out
}
