//! The trace's tests: the ring, the thread names, the spans and the export.

use crate::pool::BufferPool;
use serde_json::Value;

/// The OS tid of the calling thread, read here without the trace's cache.
fn gettid() -> u64 {
    #[cfg(all(target_os = "linux", not(miri)))]
    // SAFETY: `gettid` has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() } as u64;
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let tid = super::os_tid() as u64;
    tid
}

/// The name table keeps live threads and the newest exited ones only, and a reused tid
/// shows its newest thread's name.
#[test]
fn thread_names_stay_bounded_and_follow_a_reused_tid() {
    let mut names = super::ThreadNames {
        live: Default::default(),
        exited: Default::default(),
    };
    names.live.insert(5, "first".into());
    names.exit(5);
    assert_eq!(
        names.get(5),
        Some("first"),
        "an exited thread keeps its name"
    );
    names.live.insert(5, "second".into());
    assert_eq!(names.get(5), Some("second"));
    names.exit(5);
    assert_eq!(names.get(5), Some("second"), "the newest thread of a tid");
    for tid in 100..100 + super::EXITED_NAMES as u32 {
        names.live.insert(tid, "short-lived".into());
        names.exit(tid);
    }
    assert_eq!(names.exited.len(), super::EXITED_NAMES);
    assert!(names.live.is_empty());
    assert_eq!(names.get(5), None, "the oldest exited names go");
}

/// Spans on two threads come out of `trace_json` as `B`/`E` pairs on each thread's OS
/// tid, each thread with its `thread_name`, and the whole parses as JSON.
#[test]
fn trace_spans_export_on_os_tids_with_thread_names() {
    let pool = BufferPool::new();
    assert!(pool.enable_trace(1024));
    let tids: Vec<(String, &str, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = [
            ("worker \"a\"\n", "forward"),
            ("worker-b", "backward (replay)"),
        ]
        .into_iter()
        .map(|(thread, span)| {
            let pool = &pool;
            std::thread::Builder::new()
                .name(thread.into())
                .spawn_scoped(scope, move || {
                    let _span = pool.trace_span(span);
                    drop(pool.alloc(4096).unwrap());
                    (thread.to_owned(), span, gettid())
                })
                .unwrap()
        })
        .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let json: Value = serde_json::from_str(&pool.trace_json()).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().unwrap();
    for (thread, span, tid) in tids {
        let on = |ph: &str| {
            events
                .iter()
                .filter(|e| e["ph"] == ph && e["tid"] == tid)
                .collect::<Vec<_>>()
        };
        let (begins, ends) = (on("B"), on("E"));
        assert_eq!(begins.len(), 1, "one span began on {thread:?} (tid {tid})");
        assert_eq!(ends.len(), 1, "and ended");
        assert_eq!(begins[0]["name"], span);
        let (begin, end) = (begins[0]["ts"].as_f64(), ends[0]["ts"].as_f64());
        let allocs: Vec<_> = on("i")
            .into_iter()
            .filter(|e| e["name"] == "alloc")
            .map(|e| e["ts"].as_f64())
            .collect();
        assert_eq!(
            allocs.len(),
            1,
            "the thread's allocation is on its track too"
        );
        assert!(
            begin <= allocs[0] && allocs[0] <= end,
            "{span}: the allocation made inside the span lies inside it on the timeline"
        );
        let names = on("M");
        assert_eq!(names.len(), 1, "one thread_name for tid {tid}: {names:?}");
        assert_eq!(names[0]["name"], "thread_name");
        assert_eq!(names[0]["args"]["name"], thread.as_str());
    }
    // The process, once, on tid 0, named after the pool every record carries.
    let process: Vec<_> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .collect();
    assert_eq!(process.len(), 1, "{process:?}");
    let pid = process[0]["pid"].as_u64().unwrap();
    assert_eq!(process[0]["tid"], 0);
    assert_eq!(process[0]["args"]["name"], format!("ferropool pool {pid}"));
    assert!(events.iter().all(|e| e["pid"] == pid), "one pool, one pid");
}

/// A thread without a name (and one that made no span or mark) shows as
/// `thread <index>`.
#[test]
fn an_unnamed_thread_shows_its_index() {
    let pool = BufferPool::new();
    assert!(pool.enable_trace(64));
    let (tid, index) = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                drop(pool.alloc(4096).unwrap());
                (gettid(), pool.trace_events()[1].thread)
            })
            .join()
            .unwrap()
    });
    let json: Value = serde_json::from_str(&pool.trace_json()).unwrap();
    let named: Vec<_> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name" && e["tid"] == tid)
        .map(|e| e["args"]["name"].clone())
        .collect();
    assert_eq!(named, [Value::from(format!("thread {index}"))]);
}

/// When the ring has dropped a span's begin, the export leaves out its end too: every
/// `E` on a track closes a `B` before it.
#[test]
fn an_end_whose_begin_the_ring_dropped_is_left_out() {
    let pool = BufferPool::new();
    assert!(pool.enable_trace(8));
    let outer = pool.trace_span("outer");
    for _ in 0..8 {
        drop(pool.alloc(4096).unwrap()); // pushes "outer"'s begin out of the ring
    }
    drop(pool.trace_span("inner"));
    drop(outer);
    let events = pool.trace_events();
    let ends = events
        .iter()
        .filter(|e| e.kind == super::PoolEventKind::SpanEnd);
    assert_eq!(ends.count(), 2, "the ring still holds both ends");
    let json: Value = serde_json::from_str(&pool.trace_json()).unwrap();
    let phases: Vec<(&str, &str)> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "B" || e["ph"] == "E")
        .map(|e| (e["ph"].as_str().unwrap(), e["name"].as_str().unwrap()))
        .collect();
    assert_eq!(phases, [("B", "inner"), ("E", "inner")]);
}

/// `write_trace_json` streams the document `trace_json` returns.
#[test]
fn the_streamed_trace_is_the_returned_one() {
    let pool = BufferPool::new();
    assert!(pool.enable_trace(64));
    drop(pool.trace_span("step"));
    drop(pool.alloc(4096).unwrap());
    let mut streamed = Vec::new();
    pool.write_trace_json(&mut streamed).unwrap();
    assert_eq!(String::from_utf8(streamed).unwrap(), pool.trace_json());
}

/// A writer that fails (a full disk) is an error of `write_trace_json`, even behind the
/// caller's own buffer: the document is flushed before it returns.
#[test]
fn a_failing_writer_is_an_error_even_behind_a_buffer() {
    struct Full;
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let pool = BufferPool::new();
    assert!(pool.enable_trace(64));
    drop(pool.alloc(4096).unwrap());
    let error = pool
        .write_trace_json(std::io::BufWriter::new(Full))
        .expect_err("nothing reached the disk");
    assert_eq!(error.to_string(), "disk full");
}

/// A span event read back with serde has its name (interned, once per name).
#[cfg(feature = "serde")]
#[test]
fn trace_span_events_round_trip_through_serde() {
    let pool = BufferPool::new();
    pool.enable_trace(16);
    drop(pool.trace_span("optimizer"));
    let events = pool.trace_events();
    let json = serde_json::to_string(&events).unwrap();
    let back: Vec<super::PoolEvent> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, events);
    let again: Vec<super::PoolEvent> = serde_json::from_str(&json).unwrap();
    assert!(
        std::ptr::eq(back[0].name, again[0].name),
        "one copy per name"
    );
}
