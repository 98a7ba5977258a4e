//! Softmax cross-entropy over a vocabulary, fused with its gradient: each row of logits
//! becomes, in place, the gradient of the mean loss (`(softmax - one-hot) / rows`), and the
//! row's loss is written apart. Rows are independent, so the results do not depend on how the
//! work is split; the mean is summed in row order.

use rayon::prelude::*;

use super::simd::{exp, vectorized, Lanes};

/// Rows per task.
const ROWS_PER_TASK: usize = 32;

vectorized! {
    /// Rows of [`cross_entropy`].
    fn rows_loss(logits: &mut [f32], vocab: usize, targets: &[u32], losses: &mut [f32], scale: f32, grad: bool) {
        for ((row, &target), loss) in logits.chunks_exact_mut(vocab).zip(targets).zip(losses) {
            let max = Lanes::max_of(row);
            let target = target as usize;
            let picked = row[target];
            for v in row.iter_mut() {
                *v = exp(*v - max);
            }
            let sum = Lanes::sum_of(row, |v| v);
            *loss = max + sum.ln() - picked;
            if grad {
                let inverse = scale / sum;
                row.iter_mut().for_each(|v| *v *= inverse);
                row[target] -= scale;
            }
        }
    }
}

/// The mean softmax cross-entropy of the `rows` rows of `vocab` logits against `targets`
/// (each below `vocab`), summed in row order in `f64`; with `grad`, each row of `logits`
/// becomes the mean loss's gradient with respect to it. `losses` (one per row) is scratch.
/// Split over the current rayon pool's threads.
///
/// # Panics
///
/// If an operand is too short for its shape or a target is not below `vocab`.
pub fn cross_entropy(
    rows: usize,
    vocab: usize,
    logits: &mut [f32],
    targets: &[u32],
    losses: &mut [f32],
    grad: bool,
) -> f32 {
    let scale = grad.then(|| 1.0 / rows as f32);
    cross_entropy_rows(rows, vocab, logits, targets, losses, scale);
    mean(&losses[..rows])
}

/// The softmax cross-entropy of each of the `rows` rows of `vocab` logits against `targets`
/// (each below `vocab`), written to `losses`; with `scale`, each row of `logits` becomes
/// `scale` times the loss's gradient with respect to it (`1 / rows of the whole batch`: the
/// mean's gradient, for a batch whose rows come a chunk at a time). Rows are independent:
/// the results do not depend on how the rows are cut. Split over the current rayon pool's
/// threads.
///
/// # Panics
///
/// If an operand is too short for its shape or a target is not below `vocab`.
pub fn cross_entropy_rows(
    rows: usize,
    vocab: usize,
    logits: &mut [f32],
    targets: &[u32],
    losses: &mut [f32],
    scale: Option<f32>,
) {
    let len = rows.checked_mul(vocab).expect("rows * vocab overflows");
    assert!(
        logits.len() >= len && targets.len() >= rows && losses.len() >= rows,
        "operands too short for their shapes"
    );
    assert!(
        targets[..rows].iter().all(|&t| (t as usize) < vocab),
        "a target past the vocabulary"
    );
    if rows == 0 || vocab == 0 {
        return;
    }
    let (scale, grad) = (scale.unwrap_or(0.0), scale.is_some());
    logits[..len]
        .par_chunks_mut(ROWS_PER_TASK * vocab)
        .zip(targets[..rows].par_chunks(ROWS_PER_TASK))
        .zip(losses[..rows].par_chunks_mut(ROWS_PER_TASK))
        .for_each(|((logits, targets), losses)| {
            rows_loss(logits, vocab, targets, losses, scale, grad);
        });
}

/// The mean of `losses`, summed in order in `f64` (0 for none).
pub fn mean(losses: &[f32]) -> f32 {
    if losses.is_empty() {
        return 0.0;
    }
    (losses.iter().map(|&l| l as f64).sum::<f64>() / losses.len() as f64) as f32
}
