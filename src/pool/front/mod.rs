//! The pool's front ends: the global allocator (`global`), raw allocation calls (`raw`), the
//! `allocator-api2` implementation (`allocator_api`), and the retain layer's door to the
//! eviction (`evictable`).

#[cfg(feature = "allocator-api2")]
mod allocator_api;
pub(crate) mod evictable;
pub(super) mod global;
pub(super) mod raw;
