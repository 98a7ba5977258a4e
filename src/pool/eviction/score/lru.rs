//! A second score policy, for the seam's tests only: least recently used, staleness alone.
//! It shows what a policy is: these two items and nothing else.

/// The score of a value: the stalest goes first, whatever its cost and bytes.
pub(crate) fn score(_cost: f64, _bytes: f64, staleness: f64) -> f64 {
    1.0 / staleness
}

/// The weight of a value in a window: the stalest window is the lightest.
pub(crate) fn weight(_cost: f64, staleness: f64) -> f64 {
    1.0 / staleness
}
