//! The pool's event trace: a bounded ring of events, off unless configured, and the names
//! of the threads that made them. The export to the Chrome Trace Event format is in
//! `chrome`.

use std::cell::Cell;
use std::time::Instant;

use super::counters::CACHELESS;
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
    /// A caller's own moment (see
    /// [`BufferPool::trace_mark`](super::super::BufferPool::trace_mark)).
    Mark,
    /// A span began on the thread (see
    /// [`BufferPool::trace_span`](super::super::BufferPool::trace_span)); the event's `name` is the
    /// span's.
    SpanBegin,
    /// A span of the thread ended; the event's `name` is the span's. The export, like
    /// Perfetto, takes it as the end of the thread's innermost open span: spans nest as
    /// their guards drop in reverse order, as locals do.
    SpanEnd,
    /// The pool evicted an evictable value, to make room for a request the budget refused
    /// or on its owner's request (`bytes` and `class` are its block's; see
    /// [`RetainedValue::evictable`](crate::RetainedValue::evictable)).
    Evict,
}

impl PoolEventKind {
    /// The event's name in the exported trace.
    pub(in crate::pool) fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::Free => "free",
            Self::SystemAlloc => "system_alloc",
            Self::SystemFree => "system_free",
            Self::Trim => "trim",
            Self::Mark => "mark",
            Self::SpanBegin => "span_begin",
            Self::SpanEnd => "span_end",
            Self::Evict => "evict",
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
    /// The operating system's id of that thread (`gettid` on Linux, the thread index
    /// elsewhere): the `tid` of the exported trace, so its tracks are the threads `perf`
    /// and `top -H` show.
    pub os_tid: u32,
    /// The memory tag current on that thread.
    pub tag: Option<MemoryTag>,
    /// For `SpanBegin` and `SpanEnd`, the span's name; empty for the other kinds.
    // (`str` by its full path: serde's derive would borrow a plain `&str` from the input,
    // which then had to live for `'static`; the name is interned instead.)
    #[cfg_attr(feature = "serde", serde(deserialize_with = "deserialize_name"))]
    pub name: &'static std::primitive::str,
    /// After the event: bytes handed out, and bytes held from the system, as the trace
    /// counts them (from its own events, so they start at zero when tracing starts).
    pub in_use_after: u64,
    /// See `in_use_after`.
    pub reserved_after: u64,
}

/// The ring, and running totals for the counter tracks.
pub(in crate::pool) struct Trace {
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
            os_tid: 0,
            tag: None,
            name: "",
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
    pub(in crate::pool) fn new(capacity: usize) -> Self {
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

    pub(in crate::pool) fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    pub(in crate::pool) fn record(
        &self,
        kind: PoolEventKind,
        bytes: u64,
        class: usize,
        thread: u32,
        name: &'static str,
    ) {
        let tag = MemoryTag::from_raw(crate::thread::tag());
        let os_tid = os_tid();
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
            PoolEventKind::Trim
            | PoolEventKind::Mark
            | PoolEventKind::SpanBegin
            | PoolEventKind::SpanEnd
            | PoolEventKind::Evict => {}
        }
        let event = PoolEvent {
            at_ns,
            kind,
            bytes,
            class: class as u32,
            thread,
            os_tid,
            tag,
            name,
            in_use_after: ring.in_use,
            reserved_after: ring.reserved,
        };
        ring.events.push(event);
    }

    /// Records a span's begin or end, made by the calling thread.
    fn record_span(&self, kind: PoolEventKind, name: &'static str) {
        let thread = crate::thread::index().map_or(CACHELESS, |t| t as u32);
        self.record(kind, 0, 0, thread, name);
    }

    pub(in crate::pool) fn events(&self) -> Vec<PoolEvent> {
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

/// The OS id of the calling thread, read once per thread (an allocation-free thread-local
/// afterwards, and a system call while the thread's thread-locals are being destroyed).
pub(in crate::pool) fn os_tid() -> u32 {
    thread_local! {
        static TID: Cell<u32> = const { Cell::new(0) };
    }
    TID.try_with(|cached| match cached.get() {
        0 => {
            let tid = system_tid();
            cached.set(tid);
            tid
        }
        tid => tid,
    })
    .unwrap_or_else(|_| system_tid())
}

#[cfg(all(target_os = "linux", not(miri)))]
fn system_tid() -> u32 {
    // SAFETY: `gettid` has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    tid as u32
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn system_tid() -> u32 {
    // Thread indices start at 0; a tid of 0 means "not read yet" above.
    crate::thread::index_or_zero() as u32 + 1
}

/// Names of exited threads kept for exports (the newest ones).
const EXITED_NAMES: usize = 1024;

/// The names of the named threads that began a span or made a mark, by OS tid: the live
/// ones, and the last [`EXITED_NAMES`] that exited ([`Named`] moves a thread's entry when
/// it exits). So the table holds at most one entry per live thread plus that many, however
/// many threads come and go; a thread exited longer ago shows as `thread <index>`.
/// Process wide, as the OS tids are; bookkeeping outside any pool operation.
pub(in crate::pool) struct ThreadNames {
    live: std::collections::BTreeMap<u32, Box<str>>,
    /// Oldest first.
    exited: std::collections::VecDeque<(u32, Box<str>)>,
}

impl ThreadNames {
    /// The name of the thread with `tid`: the live one's, else the newest exited one's.
    pub(in crate::pool) fn get(&self, tid: u32) -> Option<&str> {
        self.live.get(&tid).map(|name| &**name).or_else(|| {
            let mut exited = self.exited.iter().rev();
            exited.find(|(t, _)| *t == tid).map(|(_, name)| &**name)
        })
    }

    /// The thread with `tid` exited: its name moves to the exited ones, whose room
    /// [`name_this_thread`] reserved (this allocates nothing).
    fn exit(&mut self, tid: u32) {
        if let Some(name) = self.live.remove(&tid) {
            if self.exited.len() == EXITED_NAMES {
                self.exited.pop_front();
            }
            self.exited.push_back((tid, name));
        }
    }
}

static THREAD_NAMES: std::sync::Mutex<ThreadNames> = std::sync::Mutex::new(ThreadNames {
    live: std::collections::BTreeMap::new(),
    exited: std::collections::VecDeque::new(),
});

pub(in crate::pool) fn thread_names() -> std::sync::MutexGuard<'static, ThreadNames> {
    // Each change leaves the table whole: a poisoned lock's table is used as is.
    THREAD_NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A thread's entry in [`THREAD_NAMES`], moved to the exited ones when the thread's
/// thread-locals go.
struct Named(Option<u32>);

impl Drop for Named {
    fn drop(&mut self) {
        if let Some(tid) = self.0 {
            thread_names().exit(tid);
        }
    }
}

/// Puts the calling thread's name in [`THREAD_NAMES`], once per thread: from a span or a
/// mark (the caller's code, never a pool operation, which may run inside the global
/// allocator). A thread without a name, or one whose thread-locals are being destroyed,
/// is not entered.
pub(in crate::pool) fn name_this_thread() {
    thread_local! {
        static NAMED: std::cell::RefCell<Option<Named>> = const { std::cell::RefCell::new(None) };
    }
    let _ = NAMED.try_with(|named| {
        let Ok(mut named) = named.try_borrow_mut() else {
            return;
        };
        if named.is_some() || crate::thread::index().is_none() {
            return;
        }
        // The table's entries are bookkeeping: never in a pool.
        let _bookkeeping = crate::thread::Bookkeeping::open();
        let name = std::thread::current().name().map(Box::<str>::from);
        let tid = name.map(|name| {
            let tid = os_tid();
            let mut names = thread_names();
            names.live.insert(tid, name);
            // The exited names' room, all of it now: a thread's exit moves its name there
            // while its thread-locals are being destroyed, where no bookkeeping scope can be
            // opened, so the queue must never grow then (it grew in the pool).
            let room = EXITED_NAMES.saturating_sub(names.exited.len());
            names.exited.reserve_exact(room);
            tid
        });
        *named = Some(Named(tid));
    });
}

/// A span name read back from a serialized event: stored once per name for the whole
/// process, as a [`MemoryTag`]'s name is ([`super::tag::intern`]).
#[cfg(feature = "serde")]
fn deserialize_name<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<&'static str, D::Error> {
    use serde::Deserialize as _;
    let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
    Ok(if name.is_empty() {
        ""
    } else {
        super::tag::intern(&name)
    })
}

/// An open span of the trace (see
/// [`BufferPool::trace_span`](super::super::BufferPool::trace_span)): it began when it was made, on
/// this thread, and ends when it drops. Spans on a thread nest: the exported trace (`B`/`E` events)
/// closes the innermost open span at each end, so guards dropped out of order (an explicit `drop`
/// of an outer guard) show swapped ends. It stays on the thread that began it (the span is on that
/// thread's track):
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// let pool = ferropool::BufferPool::new();
/// send(pool.trace_span("step"));
/// ```
///
/// ```
/// use ferropool::{BufferPool, PoolEventKind};
/// let pool = BufferPool::new();
/// pool.enable_trace(16);
/// {
///     let _step = pool.trace_span("step");
///     let _forward = pool.trace_span("forward"); // spans nest
/// }
/// let kinds: Vec<_> = pool.trace_events().iter().map(|e| (e.kind, e.name)).collect();
/// assert_eq!(kinds, [
///     (PoolEventKind::SpanBegin, "step"),
///     (PoolEventKind::SpanBegin, "forward"),
///     (PoolEventKind::SpanEnd, "forward"),
///     (PoolEventKind::SpanEnd, "step"),
/// ]);
/// ```
#[must_use = "the span ends when the guard drops"]
pub struct SpanGuard<'a> {
    /// The trace the span began in (`None`: tracing was off, and the span records nothing).
    trace: Option<&'a Trace>,
    name: &'static str,
    /// Not `Send`: the span ends on the thread that began it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl<'a> SpanGuard<'a> {
    /// Begins a span in `trace`, the pool's trace if tracing is on.
    pub(in crate::pool) fn begin(trace: Option<&'a Trace>, name: &'static str) -> Self {
        if let Some(trace) = trace {
            name_this_thread();
            trace.record_span(PoolEventKind::SpanBegin, name);
        }
        Self {
            trace,
            name,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for SpanGuard<'_> {
    fn drop(&mut self) {
        if let Some(trace) = self.trace {
            trace.record_span(PoolEventKind::SpanEnd, self.name);
        }
    }
}

impl std::fmt::Debug for SpanGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanGuard")
            .field("name", &self.name)
            .field("recording", &self.trace.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests;
