//! The one synchronisation shim of the crate.
//!
//! Every atomic, `Arc` and `UnsafeCell` the crate touches comes from here, so that under
//! `--cfg loom` the model checker sees every shared access. Nothing else in `src/` imports
//! `std::sync::atomic`, `std::sync::Arc` or `std::cell::UnsafeCell`.
//!
//! crossbeam-epoch is re-exported as [`epoch`]: with `--cfg crossbeam_loom` and its `loom`
//! feature it runs on loom as well, which is what makes the arena models meaningful.
//!
//! The system allocator calls of the pool also come from here: loom's versions track every
//! block, so a model that strands one fails.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex};
#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex};
#[cfg(not(loom))]
pub(crate) use std::thread_local;

pub(crate) use crossbeam_epoch as epoch;

/// The system allocator, as the pool calls it. Under loom these are loom's tracking wrappers,
/// so a model fails with "Allocation leaked" if any pool block is never returned.
#[cfg(loom)]
pub(crate) use loom::alloc::{alloc, alloc_zeroed, dealloc};
#[cfg(not(loom))]
pub(crate) use std::alloc::{alloc, alloc_zeroed, dealloc};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `std`'s `UnsafeCell` behind loom's closure-based API (`with` / `with_mut`), so the same
/// code compiles against both.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with an exclusive raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A process-wide unique, non-zero identity for an arena (or any other owner of keys).
///
/// This counter deliberately uses `std`'s atomic even under loom: an identity is handed out
/// once at construction and never synchronises anything, so it is not part of any protocol a
/// model checks (and loom atomics cannot live in a `static`).
pub(crate) fn next_identity() -> std::num::NonZeroU64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // 2^64 constructions cannot happen in the life of a process; wrapping to 0 would need them.
    std::num::NonZeroU64::new(id).expect("identity counter overflowed 64 bits")
}

/// A small number for the calling thread (0, 1, 2, ... in the order threads first ask), to
/// spread threads over sharded lists. Like `next_identity`, it is bookkeeping outside any
/// protocol: threads may share a number's shard; sharding only spreads contention.
///
/// Under loom the numbering restarts with every execution (the counter is a per-execution
/// `lazy_static`), so that replaying a schedule replays the shards.
#[inline]
pub(crate) fn thread_shard() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};
    #[cfg(not(loom))]
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    #[cfg(not(loom))]
    std::thread_local! {
        // No destructor, so this is readable even while thread-locals are being destroyed.
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    #[cfg(loom)]
    loom::lazy_static! {
        static ref NEXT: AtomicUsize = AtomicUsize::new(0);
    }
    #[cfg(loom)]
    loom::thread_local! {
        static SHARD: Cell<usize> = Cell::new(usize::MAX);
    }
    SHARD.with(|shard| {
        if shard.get() == usize::MAX {
            shard.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        shard.get()
    })
}

/// Records the address of an allocation the crate keeps for the rest of the process on
/// purpose (a pool's control block), so that leak checkers (LeakSanitizer, Miri) find it
/// reachable instead of reporting it. Like `next_identity`, this is bookkeeping outside any
/// protocol a model checks, so it uses `std`'s mutex even under loom.
pub(crate) fn keep_reachable(address: usize) {
    static KEPT: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    KEPT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(address);
}
