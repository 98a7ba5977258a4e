//! The model runner shared by the loom test targets.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `f` under loom: preemption bound from `LOOM_MAX_PREEMPTIONS`, else 2; at most
/// `max_branches` branches per execution (loom's default is 1,000); and prints how many
/// executions were explored (`--nocapture` shows it).
pub fn model(max_branches: usize, f: impl Fn() + Send + Sync + 'static) {
    static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.max_branches = max_branches;
    let start = EXECUTIONS.load(Ordering::Relaxed);
    builder.check(move || {
        EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        f()
    });
    let name = std::thread::current().name().unwrap_or("model").to_string();
    println!(
        "loom model {name}: {} executions at preemption bound {:?}",
        EXECUTIONS.load(Ordering::Relaxed) - start,
        builder.preemption_bound
    );
}
