//! The model runner shared by the loom test targets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Runs `f` under loom: preemption bound from `LOOM_MAX_PREEMPTIONS`, else 2; at most
/// `max_branches` branches per execution (loom's default is 1,000); and prints how many
/// executions were explored (`--nocapture` shows it).
pub(crate) fn model(max_branches: usize, f: impl Fn() + Send + Sync + 'static) {
    model_within(usize::MAX, max_branches, f);
}

/// [`model`] with the preemption bound at most `max_preemptions`, for a model whose race
/// needs fewer preemptions than its state space can afford at the suite's bound.
pub(crate) fn model_within(
    max_preemptions: usize,
    max_branches: usize,
    f: impl Fn() + Send + Sync + 'static,
) {
    // One counter per model: models may run on parallel test threads.
    let executions = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&executions);
    let mut builder = loom::model::Builder::new();
    let bound = builder.preemption_bound.unwrap_or(2).min(max_preemptions);
    builder.preemption_bound = Some(bound);
    builder.max_branches = max_branches;
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f()
    });
    let name = std::thread::current().name().unwrap_or("model").to_string();
    println!(
        "loom model {name}: {} executions at preemption bound {:?}",
        executions.load(Ordering::Relaxed),
        builder.preemption_bound
    );
}
