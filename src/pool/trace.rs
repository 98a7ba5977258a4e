//! The pool's event trace: a bounded ring of events, off unless configured, exported in the
//! Chrome Trace Event format that Perfetto and `chrome://tracing` open.

use std::fmt::Write as _;
use std::time::Instant;

use super::tag::MemoryTag;
use crate::paged;
use crate::sync::Mutex;

/// What happened to the pool.
///
/// ```
/// use ferropool::{BufferPool, PoolEventKind};
/// let pool = BufferPool::new();
/// pool.enable_trace(64);
/// drop(pool.alloc(4096)?);
/// let kinds: Vec<_> = pool.trace_events().iter().map(|event| event.kind).collect();
/// assert_eq!(kinds, [PoolEventKind::SystemAlloc, PoolEventKind::Alloc, PoolEventKind::Free]);
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PoolEventKind {
    /// A buffer was handed out.
    Alloc,
    /// A buffer came back.
    Free,
    /// A block was obtained from the system.
    SystemAlloc,
    /// A block went back to the system.
    SystemFree,
    /// A trim ran (`bytes` is what it released).
    Trim,
    /// A caller's own moment (see [`BufferPool::trace_mark`](super::BufferPool::trace_mark)).
    Mark,
}

impl PoolEventKind {
    fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::Free => "free",
            Self::SystemAlloc => "system_alloc",
            Self::SystemFree => "system_free",
            Self::Trim => "trim",
            Self::Mark => "mark",
        }
    }
}

/// One traced event.
///
/// ```
/// use ferropool::{BufferPool, PoolEventKind};
/// let pool = BufferPool::new();
/// pool.enable_trace(64);
/// let buffer = pool.alloc(1000)?;
/// let event = pool.trace_events()[1]; // after the block from the system
/// assert_eq!((event.kind, event.bytes), (PoolEventKind::Alloc, 1024));
/// assert_eq!((event.in_use_after, event.reserved_after), (1024, 1024));
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolEvent {
    /// Nanoseconds since the pool was created.
    pub at_ns: u64,
    /// What happened.
    pub kind: PoolEventKind,
    /// Block bytes (the class size); for `Trim`, the bytes released; for `Mark`, the
    /// caller's value.
    pub bytes: u64,
    /// The size class index (0 for `Trim` and `Mark`).
    pub class: u32,
    /// The thread index of the thread that caused the event (`u32::MAX - 1` for a thread
    /// without one: its thread-locals were being destroyed).
    pub thread: u32,
    /// The memory tag current on that thread.
    pub tag: Option<MemoryTag>,
    /// After the event: bytes handed out, and bytes held from the system, as the trace
    /// counts them (from its own events, so they start at zero when tracing starts).
    pub in_use_after: u64,
    /// See `in_use_after`.
    pub reserved_after: u64,
}

/// The ring, and running totals for the counter tracks.
pub(super) struct Trace {
    started: Instant,
    capacity: usize,
    ring: Mutex<Ring>,
}

struct Ring {
    events: Events,
    in_use: u64,
    reserved: u64,
}

/// The ring's events, in memory from the system allocator directly: never from a pool (the
/// one it traces included), whatever the global allocator.
struct Events {
    /// `capacity` events from [`paged::allocate`], owned by this ring.
    base: *mut PoolEvent,
    capacity: usize,
    /// The oldest event's position, and how many there are (at most `capacity`).
    start: usize,
    len: usize,
}

// SAFETY: `Events` owns plain `Copy` data behind its pointer, like a `Box<[PoolEvent]>`.
unsafe impl Send for Events {}

impl Events {
    fn new(capacity: usize) -> Self {
        const EMPTY: PoolEvent = PoolEvent {
            at_ns: 0,
            kind: PoolEventKind::Mark,
            bytes: 0,
            class: 0,
            thread: 0,
            tag: None,
            in_use_after: 0,
            reserved_after: 0,
        };
        Self {
            base: paged::allocate(capacity, |_| EMPTY),
            capacity,
            start: 0,
            len: 0,
        }
    }

    /// Appends `event`, dropping the oldest one when the ring is full.
    fn push(&mut self, event: PoolEvent) {
        if self.capacity == 0 {
            return;
        }
        let at = if self.len == self.capacity {
            let oldest = self.start;
            self.start = (self.start + 1) % self.capacity;
            oldest
        } else {
            self.len += 1;
            (self.start + self.len - 1) % self.capacity
        };
        // SAFETY: `at < capacity`, inside the ring's elements, which `&mut self` owns.
        unsafe { self.base.add(at).write(event) };
    }

    /// The events, oldest first.
    fn iter(&self) -> impl Iterator<Item = PoolEvent> + '_ {
        (0..self.len).map(|i| {
            // SAFETY: `(start + i) % capacity < capacity`, an initialised element.
            unsafe { *self.base.add((self.start + i) % self.capacity) }
        })
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // SAFETY: `base` came from `paged::allocate` with `capacity` elements and is freed
        // once, here.
        unsafe { paged::free(self.base, self.capacity) };
    }
}

impl Trace {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            started: Instant::now(),
            capacity,
            ring: Mutex::new(Ring {
                // All of it now: a ring that grew while recording would allocate inside a
                // pool operation.
                events: Events::new(capacity),
                in_use: 0,
                reserved: 0,
            }),
        }
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    pub(super) fn record(&self, kind: PoolEventKind, bytes: u64, class: usize, thread: u32) {
        let tag = MemoryTag::from_raw(super::tag::current());
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        // The time is read under the lock, so the ring is in time order (`events` is oldest
        // first): read before it, a thread preempted between the clock and the lock would
        // push its event after newer ones of other threads.
        let at_ns = self.now_ns();
        match kind {
            PoolEventKind::Alloc => ring.in_use += bytes,
            PoolEventKind::Free => ring.in_use = ring.in_use.saturating_sub(bytes),
            PoolEventKind::SystemAlloc => ring.reserved += bytes,
            PoolEventKind::SystemFree => ring.reserved = ring.reserved.saturating_sub(bytes),
            PoolEventKind::Trim | PoolEventKind::Mark => {}
        }
        let event = PoolEvent {
            at_ns,
            kind,
            bytes,
            class: class as u32,
            thread,
            tag,
            in_use_after: ring.in_use,
            reserved_after: ring.reserved,
        };
        ring.events.push(event);
    }

    pub(super) fn events(&self) -> Vec<PoolEvent> {
        // Allocated before the lock is taken, for the whole ring: nothing allocates under
        // the lock (when this pool serves the global allocator, that allocation would
        // record itself in this very ring, and deadlock).
        let mut events = Vec::with_capacity(self.capacity);
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        events.extend(ring.events.iter());
        events
    }
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// Renders events in the Chrome Trace Event format (`{"traceEvents":[...]}`): an instant
/// event per allocation, free, system call, trim and mark, on the track of the thread that
/// made it, and a counter track `"pool <id> memory"` with the bytes in use, cached and
/// reserved after each event. Timestamps are microseconds since the pool was created.
pub(super) fn to_chrome_json(pool: u64, events: &[PoolEvent]) -> String {
    let mut out = String::with_capacity(64 + events.len() * 240);
    out.push_str("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
    let _ = write!(
        out,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pool},\"tid\":0,\"args\":{{\"name\":\"ferropool pool {pool}\"}}}}"
    );
    for e in events {
        let ts = e.at_ns as f64 / 1000.0;
        let tag = e
            .tag
            .map_or(String::from("null"), |t| json_string(t.name()));
        let _ = write!(
            out,
            ",{{\"name\":\"{}\",\"cat\":\"pool\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts:.3},\"pid\":{pool},\"tid\":{},\"args\":{{\"bytes\":{},\"class\":{},\"tag\":{tag}}}}}",
            e.kind.name(),
            e.thread,
            e.bytes,
            e.class,
        );
        let cached = e.reserved_after.saturating_sub(e.in_use_after);
        let _ = write!(
            out,
            ",{{\"name\":\"pool {pool} memory\",\"ph\":\"C\",\"ts\":{ts:.3},\"pid\":{pool},\"args\":{{\"in_use\":{},\"cached\":{cached},\"reserved\":{}}}}}",
            e.in_use_after, e.reserved_after,
        );
    }
    out.push_str("]}");
    out
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl super::inner::PoolInner {
    /// Records an event if tracing is on.
    #[inline(always)]
    pub(super) fn trace(&self, kind: PoolEventKind, bytes: u64, class: usize) {
        if let Some(trace) = self.trace.get() {
            let thread = crate::thread::index().map_or(super::counters::SLOTLESS, |t| t as u32);
            trace.record(kind, bytes, class, thread);
        }
    }
}
