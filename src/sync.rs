//! The one synchronisation shim of the crate.
//!
//! Every atomic, `Arc` and `UnsafeCell` the crate touches comes from here, so that under
//! `--cfg loom` the model checker sees every shared access. Nothing else in `src/` imports
//! `std::sync::atomic`, `std::sync::Arc` or `std::cell::UnsafeCell`.
//!
//! crossbeam-epoch is re-exported as [`epoch`]: with `--cfg crossbeam_loom` and its `loom`
//! feature it runs on loom as well, which is what makes the arena models meaningful.
//!
//! So do the system allocator calls of the crate's internals (loom's versions track every
//! block, so a model that strands one fails) and the asymmetric fences of the pool's
//! thread caches.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread_local;

pub(crate) use crossbeam_epoch as epoch;

/// A count outside every protocol (pools alive, identities handed out, front end fallbacks,
/// a pool's evictions by class): it synchronises nothing, so it is `std`'s atomic even under
/// loom (loom would reset it per execution and explore its accesses for nothing).
#[derive(Debug)]
pub(crate) struct Tally(std::sync::atomic::AtomicU64);

impl Tally {
    pub(crate) const fn new(start: u64) -> Self {
        Self(std::sync::atomic::AtomicU64::new(start))
    }

    /// Adds `n`; returns the value before.
    pub(crate) fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed)
    }

    /// Subtracts `n`.
    pub(crate) fn sub(&self, n: u64) {
        self.0.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A thread's identity (loom's own threads' under loom).
#[cfg(loom)]
pub(crate) use loom::thread::ThreadId;
#[cfg(not(loom))]
pub(crate) use std::thread::ThreadId;

/// The calling thread's identity.
pub(crate) fn thread_id() -> ThreadId {
    #[cfg(loom)]
    return loom::thread::current().id();
    #[cfg(not(loom))]
    std::thread::current().id()
}

/// Lets other threads run while this one waits for a short critical section of another.
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

/// The system allocator, as the crate's internals call it: `System` directly, never the
/// global allocator (which may be ferropool's own front end), so no internal allocation
/// recurses into it. Under loom these are loom's tracking wrappers, so a model fails with
/// "Allocation leaked" if any block or page is never returned.
pub(crate) mod system {
    use std::alloc::Layout;

    /// Allocates `layout` (non-zero size) from the system.
    ///
    /// # Safety
    ///
    /// As [`std::alloc::GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline]
    pub(crate) unsafe fn alloc(layout: Layout) -> *mut u8 {
        #[cfg(loom)]
        return if super::system_grants(layout) {
            // SAFETY: the caller's contract is loom's.
            unsafe { loom::alloc::alloc(layout) }
        } else {
            std::ptr::null_mut()
        };
        #[cfg(not(loom))]
        // SAFETY: the caller's contract is `GlobalAlloc::alloc`'s.
        unsafe {
            std::alloc::GlobalAlloc::alloc(&std::alloc::System, layout)
        }
    }

    /// Allocates `layout` (non-zero size) zeroed from the system.
    ///
    /// # Safety
    ///
    /// As [`std::alloc::GlobalAlloc::alloc_zeroed`].
    #[inline]
    pub(crate) unsafe fn alloc_zeroed(layout: Layout) -> *mut u8 {
        #[cfg(loom)]
        return if super::system_grants(layout) {
            // SAFETY: the caller's contract is loom's.
            unsafe { loom::alloc::alloc_zeroed(layout) }
        } else {
            std::ptr::null_mut()
        };
        #[cfg(not(loom))]
        // SAFETY: the caller's contract is `GlobalAlloc::alloc_zeroed`'s.
        unsafe {
            std::alloc::GlobalAlloc::alloc_zeroed(&std::alloc::System, layout)
        }
    }

    /// Returns `ptr` to the system.
    ///
    /// # Safety
    ///
    /// As [`std::alloc::GlobalAlloc::dealloc`]: `ptr` came from [`alloc`] or [`alloc_zeroed`]
    /// with this `layout` and is not used afterwards.
    #[inline]
    pub(crate) unsafe fn dealloc(ptr: *mut u8, layout: Layout) {
        #[cfg(loom)]
        // SAFETY: the caller's contract is loom's.
        return unsafe { loom::alloc::dealloc(ptr, layout) };
        #[cfg(not(loom))]
        // SAFETY: the caller's contract is `GlobalAlloc::dealloc`'s.
        unsafe {
            std::alloc::GlobalAlloc::dealloc(&std::alloc::System, ptr, layout)
        }
    }
}

/// The global allocator (whatever the program installed), as the pool calls it for its
/// blocks. Under loom, loom's tracking wrappers.
pub(crate) mod global {
    #[cfg(loom)]
    pub(crate) use super::system::{alloc, alloc_zeroed, dealloc};
    #[cfg(not(loom))]
    pub(crate) use std::alloc::{alloc, alloc_zeroed, dealloc};
}

/// Under loom: whether the system would grant `layout` now (asked, then given back). Loom
/// tracks every pointer its allocator returns, a null one too, and a second refusal then
/// fails its bookkeeping ("pointer already tracked"): a request the system refuses must be
/// answered before loom sees it.
#[cfg(loom)]
fn system_grants(layout: std::alloc::Layout) -> bool {
    use std::alloc::{GlobalAlloc, System};
    // SAFETY: `layout` has a non-zero size (the callers' contract); the block, if any, is
    // given back at once with the same layout.
    unsafe {
        let probe = System.alloc(layout);
        if probe.is_null() {
            return false;
        }
        System.dealloc(probe, layout);
    }
    true
}

/// Asymmetric fences: a pair of fences for a Dekker-style handshake between a *frequent* side
/// (a thread's own operations on its thread cache) and a *rare* side (a thread draining another
/// thread's cache, or closing the pool).
///
/// Each side stores its flag, fences, then loads the other's: afterwards at least one of the
/// two sees the other's store. With plain `SeqCst` fences on both sides that is the usual
/// store-load ordering. On Linux the frequent side gets away with a compiler fence when the
/// rare side issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every running
/// thread of the process execute a full memory barrier before it returns: the frequent side
/// then pays nothing on its hot path, the rare side a few microseconds. Where `membarrier` is
/// unavailable (another OS, an old kernel, a sandbox that forbids it, Miri), both sides use
/// `SeqCst` fences. Under loom both are `SeqCst` fences, which is what the models check.
pub(crate) mod asymmetric {
    #[cfg(not(loom))]
    use std::sync::atomic::{compiler_fence, AtomicU8, Ordering};

    #[cfg(not(loom))]
    const UNKNOWN: u8 = 0;
    #[cfg(not(loom))]
    const MEMBARRIER: u8 = 1;
    #[cfg(not(loom))]
    const FENCES: u8 = 2;

    /// Which implementation this process uses; decided once, by [`init`], before any fence
    /// of either side runs (the pool calls it when it is created). Never changes afterwards.
    #[cfg(not(loom))]
    static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);

    /// Decides the implementation (registers with `membarrier` where it can). Idempotent.
    pub(crate) fn init() {
        #[cfg(not(loom))]
        if MODE.load(Ordering::Acquire) == UNKNOWN {
            let mode = if platform::register() {
                MEMBARRIER
            } else {
                FENCES
            };
            let _ = MODE.compare_exchange(UNKNOWN, mode, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The frequent side's fence.
    #[inline(always)]
    pub(crate) fn light() {
        #[cfg(loom)]
        loom::sync::atomic::fence(loom::sync::atomic::Ordering::SeqCst);
        #[cfg(not(loom))]
        if MODE.load(Ordering::Relaxed) == MEMBARRIER {
            compiler_fence(Ordering::SeqCst);
        } else {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    #[cfg(all(test, not(loom)))]
    std::thread_local! {
        /// Heavy fences issued by this thread (unit tests count them).
        static HEAVY_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// Heavy fences the calling thread issued so far (unit tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn heavy_fences_here() -> u64 {
        HEAVY_HERE.with(std::cell::Cell::get)
    }

    /// The rare side's fence.
    pub(crate) fn heavy() {
        #[cfg(all(test, not(loom)))]
        HEAVY_HERE.with(|count| count.set(count.get() + 1));
        #[cfg(loom)]
        loom::sync::atomic::fence(loom::sync::atomic::Ordering::SeqCst);
        #[cfg(not(loom))]
        {
            std::sync::atomic::fence(Ordering::SeqCst);
            if MODE.load(Ordering::Relaxed) == MEMBARRIER {
                platform::barrier();
            }
        }
    }

    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    mod platform {
        const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

        /// Registers the process for private expedited barriers; whether that worked.
        pub(super) fn register() -> bool {
            // SAFETY: membarrier takes two integer arguments and touches no memory of ours.
            let registered = unsafe {
                libc::syscall(
                    libc::SYS_membarrier,
                    MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                    0,
                )
            } == 0;
            // Check that a barrier works too: some sandboxes register and then refuse.
            // SAFETY: as above.
            registered
                && unsafe {
                    libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0)
                } == 0
        }

        /// A full memory barrier on every running thread of the process.
        pub(super) fn barrier() {
            // SAFETY: as in `register`. It cannot fail once registered (checked there).
            let done =
                unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) };
            debug_assert_eq!(done, 0, "membarrier failed after a successful registration");
        }
    }

    #[cfg(all(not(all(target_os = "linux", not(miri))), not(loom)))]
    mod platform {
        pub(super) fn register() -> bool {
            false
        }

        pub(super) fn barrier() {}
    }
}

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
