//! The pool's front ends: the global allocator (`global`), raw allocation calls (`raw`), and
//! the `allocator-api2` implementation (`allocator_api`).

#[cfg(feature = "allocator-api2")]
mod allocator_api;
pub(super) mod global;
pub(super) mod raw;
