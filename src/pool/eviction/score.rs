//! The seam for the eviction's score. A *policy* is one module that provides two items, and
//! nothing else in the eviction knows how values are weighed:
//!
//! - `fn score(cost, bytes, staleness) -> f64`, a value's score for the one-at-a-time step:
//!   the lowest goes first;
//! - `fn weight(cost, staleness) -> f64`, a value's weight in a window: the lightest window
//!   goes first (its bytes are capped by the request, not weighed).
//!
//! Each takes the recompute cost (evicted inputs included, at least 1), the block's bytes and
//! the staleness (pool clock ticks since the last pin, at least 1), and answers a finite,
//! positive number that never rises as the value grows staler or larger, nor falls as it
//! grows costlier.
//!
//! The pool uses [`dtr`] (Dynamic Tensor Rematerialization's score). [`lru`] (least recently
//! used: staleness alone) is a second policy for the tests, which hold both to the contract
//! above.

mod dtr;
#[cfg(all(test, not(loom)))]
mod lru;

pub(super) use dtr::{score, weight};

#[cfg(all(test, not(loom)))]
mod tests {
    /// The contract of a policy module (see the module docs), checked over a grid of costs,
    /// sizes and staleness.
    macro_rules! holds_the_contract {
        ($policy:ident) => {{
            use super::$policy::{score, weight};
            let values = [1.0, 2.0, 3.0, 64.0, 4096.0, 1e6, 1e12];
            for &cost in &values {
                for &bytes in &values {
                    for &stale in &values {
                        let s = score(cost, bytes, stale);
                        let w = weight(cost, stale);
                        assert!(s.is_finite() && s > 0.0, "{cost} {bytes} {stale}");
                        assert!(w.is_finite() && w > 0.0, "{cost} {stale}");
                        assert!(score(cost, bytes, stale * 2.0) <= s, "staler");
                        assert!(score(cost, bytes * 2.0, stale) <= s, "larger");
                        assert!(score(cost * 2.0, bytes, stale) >= s, "costlier");
                        assert!(weight(cost, stale * 2.0) <= w, "staler");
                        assert!(weight(cost * 2.0, stale) >= w, "costlier");
                    }
                }
            }
        }};
    }

    #[test]
    fn the_pools_policy_holds_the_contract() {
        holds_the_contract!(dtr);
    }

    #[test]
    fn a_second_policy_holds_the_contract() {
        holds_the_contract!(lru);
    }
}
