//! Eviction under the budget: an evictable value as the pool sees it (`value`), and the
//! policy that chooses what to evict (`policy`).

pub(super) mod handle;
pub(super) mod policy;
pub(super) mod value;
