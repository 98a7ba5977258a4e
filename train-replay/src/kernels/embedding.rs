//! Token and position embeddings: each row of the input is its token's row of the token
//! table plus its position's row of the position table; the gradients are sums over the rows
//! of each token and each position, taken in row order, so the results do not depend on how
//! the work is split.

use std::mem::MaybeUninit;

use rayon::prelude::*;

/// Token rows per task of the backward pass.
const TOKENS_PER_TASK: usize = 8;

/// `out[r] = wte[tokens[r]] + wpe[r % seq]` for every row (`c` columns; every element
/// written), split over the current rayon pool's threads.
///
/// # Panics
///
/// If an operand is too short for its shape, a token is past `wte`'s rows or `seq` is past
/// `wpe`'s.
pub fn forward(
    tokens: &[u32],
    seq: usize,
    c: usize,
    wte: &[f32],
    wpe: &[f32],
    out: &mut [MaybeUninit<f32>],
) {
    let rows = tokens.len();
    assert!(
        rows.checked_mul(c).is_some_and(|len| out.len() >= len)
            && seq.checked_mul(c).is_some_and(|len| wpe.len() >= len)
            && tokens.iter().all(|&t| (t as usize + 1)
                .checked_mul(c)
                .is_some_and(|e| e <= wte.len())),
        "operands too short for their shapes"
    );
    if rows == 0 || c == 0 || seq == 0 {
        return;
    }
    out[..rows * c]
        .par_chunks_mut(c)
        .zip(tokens.par_iter())
        .enumerate()
        .for_each(|(r, (out, &token))| {
            let (word, place) = (&wte[token as usize * c..][..c], &wpe[r % seq * c..][..c]);
            for ((o, &w), &p) in out.iter_mut().zip(word).zip(place) {
                o.write(w + p);
            }
        });
}

/// Adds each row of `dx` to its token's row of `dwte` (row by row in order, each token's
/// rows on one task) and writes each position's sum over the sequences to `dwpe` (sequence by
/// sequence in order). `dwpe` has `seq` rows of `c`.
///
/// # Panics
///
/// If an operand is too short for its shape or a token is past `dwte`'s rows.
pub fn backward(
    tokens: &[u32],
    seq: usize,
    c: usize,
    dx: &[f32],
    dwte: &mut [f32],
    dwpe: &mut [MaybeUninit<f32>],
) {
    let rows = tokens.len();
    assert!(
        rows.checked_mul(c).is_some_and(|len| dx.len() >= len)
            && seq.checked_mul(c).is_some_and(|len| dwpe.len() >= len)
            && tokens.iter().all(|&t| (t as usize + 1)
                .checked_mul(c)
                .is_some_and(|e| e <= dwte.len())),
        "operands too short for their shapes"
    );
    if c == 0 || seq == 0 {
        return;
    }
    dwte.par_chunks_mut(TOKENS_PER_TASK * c)
        .enumerate()
        .for_each(|(i, table)| {
            let first = i * TOKENS_PER_TASK;
            let ids = first..first + table.len() / c;
            for (row, &token) in dx.chunks_exact(c).zip(tokens) {
                let token = token as usize;
                if ids.contains(&token) {
                    super::elementwise::add_into(&mut table[(token - first) * c..][..c], row);
                }
            }
        });
    let sequences = rows / seq;
    dwpe[..seq * c]
        .par_chunks_mut(c)
        .enumerate()
        .for_each(|(t, out)| {
            out.iter_mut().for_each(|o| {
                o.write(0.0);
            });
            // SAFETY: every element was just written.
            let out = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
            for b in 0..sequences {
                super::elementwise::add_into(out, &dx[(b * seq + t) * c..][..c]);
            }
        });
}
