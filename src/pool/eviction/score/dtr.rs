//! The pool's score: Dynamic Tensor Rematerialization's (Kirisame et al., ICLR 2021), the
//! cost of recomputing a value over its bytes times its staleness; a window weighs each of
//! its values by the cost over the staleness (the window's bytes are capped, not weighed).

/// The score of a value of recompute `cost`, `bytes` and `staleness`: the lowest goes first.
#[inline]
pub(in crate::pool) fn score(cost: f64, bytes: f64, staleness: f64) -> f64 {
    cost / (bytes * staleness)
}

/// The weight of a value of recompute `cost` and `staleness` in a window.
#[inline]
pub(in crate::pool) fn weight(cost: f64, staleness: f64) -> f64 {
    cost / staleness
}
