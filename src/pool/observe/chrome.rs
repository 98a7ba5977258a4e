//! The trace in the Chrome Trace Event format (the JSON that Perfetto and `chrome://tracing`
//! open), serialized by `serde_json` from the records below: one `TraceRecord` per exported
//! event, streamed from the ring's events without building the document in memory first.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use serde::ser::{Serialize, SerializeSeq, Serializer};

use super::trace::{thread_names, PoolEvent, PoolEventKind};

/// The whole document: `{"displayTimeUnit":"ns","traceEvents":[...]}`.
#[derive(serde::Serialize)]
struct Document<'a> {
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
    #[serde(rename = "traceEvents")]
    trace_events: TraceRecords<'a>,
}

/// The records of one pool's events, serialized as a sequence as they are made.
struct TraceRecords<'a> {
    pool: u64,
    events: &'a [PoolEvent],
    /// Each thread seen, by OS tid, in the order the threads first appear, with its name.
    threads: Vec<(u32, String)>,
    /// The counter track's name, `"pool <id> memory"`.
    memory_track: String,
}

/// One record of the format; `ph` is its phase letter.
#[derive(serde::Serialize)]
#[serde(tag = "ph")]
enum TraceRecord<'a> {
    /// Metadata: the process's or a thread's name.
    #[serde(rename = "M")]
    Metadata {
        name: &'static str,
        pid: u64,
        tid: u32,
        args: NameArg<'a>,
    },
    /// A span began on the thread.
    #[serde(rename = "B")]
    Begin(Span<'a>),
    /// The thread's innermost open span ended.
    #[serde(rename = "E")]
    End(Span<'a>),
    /// A moment on the thread's track (`s: "t"`: thread scope).
    #[serde(rename = "i")]
    Instant {
        name: &'static str,
        cat: &'static str,
        s: &'static str,
        ts: f64,
        pid: u64,
        tid: u32,
        args: InstantArgs,
    },
    /// A sample of the memory counter track.
    #[serde(rename = "C")]
    Counter {
        name: &'a str,
        ts: f64,
        pid: u64,
        args: CounterArgs,
    },
}

/// A span's begin or end (`cat` is `"span"`).
#[derive(serde::Serialize)]
struct Span<'a> {
    name: &'a str,
    cat: &'static str,
    ts: f64,
    pid: u64,
    tid: u32,
}

#[derive(serde::Serialize)]
struct NameArg<'a> {
    name: &'a str,
}

#[derive(serde::Serialize)]
struct InstantArgs {
    bytes: u64,
    class: u32,
    thread: u32,
    tag: Option<&'static str>,
}

#[derive(serde::Serialize)]
struct CounterArgs {
    in_use: u64,
    cached: u64,
    reserved: u64,
}

impl<'a> TraceRecords<'a> {
    fn new(pool: u64, events: &'a [PoolEvent]) -> Self {
        let mut seen = BTreeSet::new();
        let first_seen: Vec<(u32, u32)> = events
            .iter()
            .filter(|e| seen.insert(e.os_tid))
            .map(|e| (e.os_tid, e.thread))
            .collect();
        // The names are copied out of the table first, so that no other thread waits on it
        // while the document is written.
        let threads = {
            let table = thread_names();
            first_seen
                .into_iter()
                .map(|(tid, index)| {
                    let name = table
                        .get(tid)
                        .map_or_else(|| format!("thread {index}"), str::to_owned);
                    (tid, name)
                })
                .collect()
        };
        Self {
            pool,
            events,
            threads,
            memory_track: format!("pool {pool} memory"),
        }
    }
}

impl Serialize for TraceRecords<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let pid = self.pool;
        let mut seq = serializer.serialize_seq(None)?;
        let process = format!("ferropool pool {pid}");
        seq.serialize_element(&TraceRecord::Metadata {
            name: "process_name",
            pid,
            tid: 0,
            args: NameArg { name: &process },
        })?;
        for (tid, name) in &self.threads {
            seq.serialize_element(&TraceRecord::Metadata {
                name: "thread_name",
                pid,
                tid: *tid,
                args: NameArg { name },
            })?;
        }
        // Spans open on each thread: an end whose begin the ring has already overwritten is
        // left out, so that every exported `E` closes an exported `B`.
        let mut open: BTreeMap<u32, usize> = BTreeMap::new();
        for e in self.events {
            let ts = e.at_ns as f64 / 1000.0;
            let tid = e.os_tid;
            match e.kind {
                PoolEventKind::SpanBegin | PoolEventKind::SpanEnd => {
                    let depth = open.entry(tid).or_default();
                    let span = Span {
                        name: e.name,
                        cat: "span",
                        ts,
                        pid,
                        tid,
                    };
                    let record = if e.kind == PoolEventKind::SpanBegin {
                        *depth += 1;
                        TraceRecord::Begin(span)
                    } else if *depth > 0 {
                        *depth -= 1;
                        TraceRecord::End(span)
                    } else {
                        continue;
                    };
                    seq.serialize_element(&record)?;
                }
                kind => {
                    seq.serialize_element(&TraceRecord::Instant {
                        name: kind.name(),
                        cat: "pool",
                        s: "t",
                        ts,
                        pid,
                        tid,
                        args: InstantArgs {
                            bytes: e.bytes,
                            class: e.class,
                            thread: e.thread,
                            tag: e.tag.map(|tag| tag.name()),
                        },
                    })?;
                    seq.serialize_element(&TraceRecord::Counter {
                        name: &self.memory_track,
                        ts,
                        pid,
                        args: CounterArgs {
                            in_use: e.in_use_after,
                            cached: e.reserved_after.saturating_sub(e.in_use_after),
                            reserved: e.reserved_after,
                        },
                    })?;
                }
            }
        }
        seq.end()
    }
}

/// `events` of pool `pool` as a Chrome trace: an instant event per allocation, free,
/// system call, trim and mark and a `B`/`E` pair per span, on the track of the OS thread
/// that made it; a `thread_name` metadata event per thread seen (its Rust name, or
/// `thread <index>`); and a counter track `"pool <id> memory"` with the bytes in use,
/// cached and reserved after each event. Timestamps are microseconds since the pool was
/// created.
fn document(pool: u64, events: &[PoolEvent]) -> Document<'_> {
    Document {
        display_time_unit: "ns",
        trace_events: TraceRecords::new(pool, events),
    }
}

/// The trace of [`document`] as a string.
pub(in crate::pool) fn to_string(pool: u64, events: &[PoolEvent]) -> String {
    // The records are plain numbers and strings with string keys, written into a `String`:
    // `serde_json` has nothing to report.
    serde_json::to_string(&document(pool, events)).expect("a trace serializes without error")
}

/// Writes the trace of [`document`] to `writer`, through a buffer of its own, flushed
/// before this returns: an error of the last write (a full disk) is reported, not lost in a
/// writer's drop.
pub(in crate::pool) fn write(
    pool: u64,
    events: &[PoolEvent],
    writer: impl io::Write,
) -> io::Result<()> {
    let mut writer = io::BufWriter::with_capacity(64 << 10, writer);
    serde_json::to_writer(&mut writer, &document(pool, events)).map_err(io::Error::from)?;
    io::Write::flush(&mut writer)
}
