//! The least budget a fitted run needs, found by dry steps at budgets between the one the
//! run was refused at and what it holds without evicting anything.

use anyhow::anyhow;

use ferropool::{BufferPool, PoolConfig};

use crate::args::Args;
use crate::backend::{OverBudget, PoolBackend};
use crate::show::bytes;

/// The error of a run fitted to a budget that could not hold it even with every evictable
/// tensor evicted: one message that names the least budget the run needs, found by trying
/// steps of the same run at budgets between the one refused and what the run holds without
/// evicting anything, plus `outside`, the share of `--budget` set aside for what stays
/// outside the training's pool (whole MiB, so the least stays exact to the MiB).
pub fn below_least(
    backend: &PoolBackend,
    args: &Args,
    outside: u64,
    refused: &anyhow::Error,
) -> anyhow::Error {
    let budget = args.budget.unwrap_or(u64::MAX);
    let share = format!(
        "{:.2} for the training's pool after {:.2} set aside for what stays outside it (the \
         products' panel, the product tiles of {} thread(s) and the attention scratch of the \
         tasks they run at once, small allocations)",
        bytes(budget.saturating_sub(outside)),
        bytes(outside),
        args.threads()
    );
    match least_budget(backend, args, budget.saturating_sub(outside)) {
        Ok(least) => {
            let least = least.saturating_add(outside);
            let mib = least / LEAST_STEP;
            anyhow!(
                "--budget {:.2} ({share}) is below the least this run needs, {mib} MiB ({:.2}): \
                 even with every kept tensor that may be recomputed evicted, the tensors a step \
                 reads at once do not fit. Raise --budget to at least {mib}MiB, or lower \
                 --batch or the model's size.",
                bytes(budget),
                bytes(least),
            )
        }
        // The search itself failed (a refusal that is not the budget's): the first error.
        Err(error) => {
            let refused = match refused.downcast_ref::<OverBudget>() {
                Some(over) => over.message_of(budget, outside),
                None => format!("{refused:#}"),
            };
            anyhow!("{refused} (and finding the least budget failed: {error:#})")
        }
    }
}

/// Steps each try runs: the first step and one in steady state (every later step repeats it).
const TRY_STEPS: usize = 2;
/// The search's resolution.
const LEAST_STEP: u64 = 1 << 20;

/// The least budget (a whole number of MiB) at which [`TRY_STEPS`] dry steps of this run complete
/// (see [`build`](crate::model::build)'s dry models), by bisection between `refused` (which failed)
/// and the peak a run without eviction reserves. What a budget holds depends only on the order of
/// the step's requests, which a dry step keeps, and on where the pool places its blocks, which a
/// fresh pool per try keeps as a run's: so the run completes at the MiB named and fails a MiB
/// below. A dry step writes nothing: its zeros come from pages the pool knows to be zero, so a
/// try neither clears nor touches the memory it reserves (a search takes about a tenth of a
/// second and a few tens of MiB, at any budget). `backend`'s pool lends its configuration.
fn least_budget(backend: &PoolBackend, args: &Args, refused: u64) -> anyhow::Result<u64> {
    let config = args.config()?;
    // The run's own threads (a dry step runs no kernel, but takes its buffers as a run on
    // them would).
    let workers = crate::model::workers(args.threads())?;
    // Whether `TRY_STEPS` steps of a fresh run complete under `budget`: each try on a pool of
    // its own, as a run starts, since where blocks lie (which the eviction's window reads)
    // follows what the pool held before.
    let fits = |budget: Option<u64>| -> anyhow::Result<(bool, u64)> {
        let trial_backend = PoolBackend {
            pool: BufferPool::with_config(PoolConfig {
                budget,
                ..backend.pool.config().clone()
            })?,
        };
        // The parameters and the optimiser's state come from the budget too.
        // Driven from one worker, as a run is (`train`): where the pool places a step's
        // blocks then does not follow the scheduling.
        let outcome = workers.install(|| {
            crate::model::build(&trial_backend, &workers, &config, true)
                .and_then(|mut model| (0..TRY_STEPS).try_for_each(|_| model.step().map(drop)))
        });
        let peak = trial_backend.pool.stats().peak_reserved_bytes;
        match outcome {
            Ok(()) => Ok((true, peak)),
            Err(error) if error.is::<OverBudget>() => Ok((false, peak)),
            Err(error) => Err(error),
        }
    };
    // Without a budget nothing is evicted or refused (a failure is another error, passed up),
    // and that try's peak always fits.
    let (_, unbounded) = fits(None)?;
    // MiB that do not fit: at most `refused`, which failed (a budget need not be whole MiB).
    let mut low = refused / LEAST_STEP;
    let mut high = unbounded.div_ceil(LEAST_STEP).max(low + 1); // MiB that fit
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        // Saturating: a budget within a MiB of `u64::MAX` has no whole MiB above it.
        if fits(Some(middle.saturating_mul(LEAST_STEP)))?.0 {
            high = middle;
        } else {
            low = middle;
        }
    }
    Ok(high.saturating_mul(LEAST_STEP))
}
