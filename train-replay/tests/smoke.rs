//! The main job end to end, small: a short training on the pool with the trace and the plot
//! written, and the three-way comparison. (A trace read through the pool that serves the
//! global allocator once deadlocked here.)

use std::process::Command;

/// Runs the main job with `args` (a subcommand first, if any) and a small model.
fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_train-replay"))
        .args(args)
        .args([
            "--steps", "6", "--batch", "32", "--model", "mlp", "--hidden", "64", "--layers", "4",
        ])
        .output()
        .expect("the main job runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn trains_on_the_pool_and_writes_the_trace_and_the_plot() {
    let dir = std::env::temp_dir().join(format!("train-replay-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (trace, plot) = (dir.join("trace.json"), dir.join("timeline.svg"));
    let text = run(&[
        "--trace",
        trace.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(text.contains("peak live bytes"), "{text}");
    assert!(text.contains("(falling)"), "the loss falls: {text}");
    let json = std::fs::read_to_string(&trace).unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    // Each step, and its phases, is a span (a `B`/`E` pair) on a named thread's track.
    let begins = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "B" && e["name"] == name)
            .count()
    };
    for span in ["step", "forward", "loss", "backward"] {
        assert_eq!(begins(span), 6, "a {span:?} span per step");
    }
    // 5 layers, each updated as soon as the backward pass has its gradients.
    assert_eq!(
        begins("optimizer (layer)"),
        5 * 6,
        "an update span per layer"
    );
    // 5 layers, every second input kept: 3 segments a step.
    assert_eq!(
        begins("backward (segment)"),
        3 * 6,
        "a span per segment the backward pass replays"
    );
    let ends = events.iter().filter(|e| e["ph"] == "E").count();
    assert_eq!(ends, 4 * 6 + 3 * 6 + 5 * 6, "every span ended");
    // The run is driven from one worker: every step on the same track, named.
    let steps: Vec<_> = events
        .iter()
        .filter(|e| e["ph"] == "B" && e["name"] == "step")
        .collect();
    assert!(
        steps.iter().all(|s| s["tid"] == steps[0]["tid"]),
        "the steps run on one thread"
    );
    assert!(
        events.iter().any(|e| e["ph"] == "M"
            && e["name"] == "thread_name"
            && e["tid"] == steps[0]["tid"]
            && e["args"]["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("worker"))),
        "the steps run on a worker, named"
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.contains("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compares_the_pool_with_glibc_and_mimalloc() {
    let text = run(&["compare", "--rounds", "2"]);
    for column in [
        "ferropool",
        "Vec<f32> glibc",
        "Vec<f32> mimalloc",
        "steps/s",
        "peak RSS",
    ] {
        assert!(text.contains(column), "no {column:?} in:\n{text}");
    }
}

#[test]
fn a_pool_run_prints_its_figures_as_one_json_line_and_calls_glibc_never() {
    let text = run(&["train", "--json"]);
    let line: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    assert_eq!(line["allocator"], "pool-mimalloc", "{text}");
    assert!(line["steps_per_s"].as_f64().unwrap() > 0.0, "{text}");
    // Small requests go to mimalloc under the pool's front end, large ones to the pool, so
    // none of the process's calls reaches glibc; the pool itself goes to glibc only for a
    // block it has not cached: in a run this short, a few in the timed half (blocks a thread
    // had not needed yet; up to 1.7 a step in 25 runs), never a step's worth (a pool that
    // kept no block across steps makes about 34 calls a step here).
    assert_eq!(line["glibc_calls_per_step"].as_f64(), Some(0.0), "{text}");
    let reservations = line["pool_system_calls_per_step"].as_f64().unwrap();
    assert!(reservations < 5.0, "{text}");
    assert!(
        line["mimalloc_calls_per_step"].as_f64().unwrap() > 0.0,
        "{text}"
    );
}
