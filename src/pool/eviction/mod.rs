//! Eviction under the budget: an evictable value as the pool sees it (`value`), the registry
//! that holds them and chooses what to evict (`registry`), the score it weighs them by
//! (`score`, a seam with one policy for the pool), and Coop's window search (`window`).

pub(super) mod registry;
mod score;
pub(crate) mod value;
mod window;
