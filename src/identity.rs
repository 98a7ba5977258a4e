//! Identities: a process-wide unique, non-zero number for each arena, group and pool, so that
//! a key, slot or buffer from one of them is told apart from another's.

use std::num::NonZeroU64;

/// A new identity.
///
/// This counter deliberately uses `std`'s atomic even under loom: an identity is handed out
/// once at construction and never synchronises anything, so it is not part of any protocol a
/// model checks (and loom atomics cannot live in a `static`).
pub(crate) fn next_identity() -> NonZeroU64 {
    static NEXT: crate::sync::Tally = crate::sync::Tally::new(1);
    let id = NEXT.add(1);
    // 2^64 constructions cannot happen in the life of a process; wrapping to 0 would need them.
    NonZeroU64::new(id).expect("identity counter overflowed 64 bits")
}
