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

/// Lets other threads run while this one waits for a short critical section of another.
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

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
