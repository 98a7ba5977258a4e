//! The process's global allocator, chosen when the process starts: ferropool's
//! [`PoolAllocator`] (the default), the system allocator (glibc), or mimalloc. `compare`
//! runs the same training in three child processes, one per allocator, through the
//! environment variable [`VARIABLE`]; one binary, so `cargo run` builds everything it needs.
//!
//! The pool's front end composes: requests below its 4 KiB threshold (the GEMM's per-call
//! flag vectors, the retention's small nodes) go to mimalloc under it, so no call of a
//! steady-state step reaches glibc.
//!
//! It also counts the calls that reach glibc and those that reach mimalloc: every call of the
//! process for those two choices, and for the pool the calls below its threshold (the pool
//! counts its own calls to the system in its statistics).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use ferropool::PoolAllocator;

/// The environment variable that picks the allocator: `pool`, `glibc` or `mimalloc`.
pub const VARIABLE: &str = "TRAIN_REPLAY_ALLOCATOR";
/// [`VARIABLE`] for `getenv`.
const VARIABLE_C: &std::ffi::CStr = c"TRAIN_REPLAY_ALLOCATOR";

/// The pool's front end, serving requests of 4 KiB and more (GEMM packing buffers and the
/// training's temporaries all come from the pool) over mimalloc for the smaller ones.
const POOL: PoolAllocator<mimalloc::MiMalloc> =
    PoolAllocator::with_fallback(mimalloc::MiMalloc, PoolAllocator::MIN_THRESHOLD);

const UNSET: u8 = 0;
const USE_POOL: u8 = 1;
const USE_GLIBC: u8 = 2;
const USE_MIMALLOC: u8 = 3;

static CHOICE: AtomicU8 = AtomicU8::new(UNSET);
static GLIBC_CALLS: AtomicU64 = AtomicU64::new(0);
static MIMALLOC_CALLS: AtomicU64 = AtomicU64::new(0);

/// Which allocator this process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// ferropool's `PoolAllocator` in front of the process-wide pool.
    Pool,
    /// The system allocator (glibc on Linux).
    Glibc,
    /// mimalloc.
    Mimalloc,
}

impl Choice {
    /// The value of [`VARIABLE`] that selects it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::Glibc => "glibc",
            Self::Mimalloc => "mimalloc",
        }
    }
}

/// The allocator this process uses.
pub fn choice() -> Choice {
    match chosen() {
        USE_GLIBC => Choice::Glibc,
        USE_MIMALLOC => Choice::Mimalloc,
        _ => Choice::Pool,
    }
}

/// Calls that reached glibc so far.
pub fn glibc_calls() -> u64 {
    GLIBC_CALLS.load(Ordering::Relaxed)
}

/// Calls that reached mimalloc so far (for the pool: its small requests).
pub fn mimalloc_calls() -> u64 {
    MIMALLOC_CALLS.load(Ordering::Relaxed)
}

/// Decides the allocator on the first call (before anything else allocates), reading the
/// environment with `getenv`, which does not allocate.
#[inline]
fn chosen() -> u8 {
    let choice = CHOICE.load(Ordering::Relaxed);
    if choice != UNSET {
        return choice;
    }
    // SAFETY: the value is read before anything can change the environment (no other
    // thread runs yet).
    let choice = match unsafe { ferropool_figures::getenv(VARIABLE_C) } {
        Some(b"glibc" | b"system") => USE_GLIBC,
        Some(b"mimalloc") => USE_MIMALLOC,
        _ => USE_POOL,
    };
    let _ = CHOICE.compare_exchange(UNSET, choice, Ordering::Relaxed, Ordering::Relaxed);
    CHOICE.load(Ordering::Relaxed)
}

/// The global allocator of the `train-replay` binary.
#[derive(Debug)]
pub struct Selected;

impl Selected {
    #[inline]
    fn count(layout: Layout, choice: u8) {
        let counter = match choice {
            USE_GLIBC => &GLIBC_CALLS,
            USE_MIMALLOC => &MIMALLOC_CALLS,
            _ if layout.size() < POOL.threshold() || layout.align() > 4096 => &MIMALLOC_CALLS,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call goes to one allocator, chosen once before the first allocation and never
// changed, so each block goes back to the allocator it came from.
unsafe impl GlobalAlloc for Selected {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let choice = chosen();
        Self::count(layout, choice);
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match choice {
                USE_GLIBC => System.alloc(layout),
                USE_MIMALLOC => mimalloc::MiMalloc.alloc(layout),
                _ => POOL.alloc(layout),
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let choice = chosen();
        Self::count(layout, choice);
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match choice {
                USE_GLIBC => System.alloc_zeroed(layout),
                USE_MIMALLOC => mimalloc::MiMalloc.alloc_zeroed(layout),
                _ => POOL.alloc_zeroed(layout),
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on to the allocator that made the block.
        unsafe {
            match chosen() {
                USE_GLIBC => System.dealloc(ptr, layout),
                USE_MIMALLOC => mimalloc::MiMalloc.dealloc(ptr, layout),
                _ => POOL.dealloc(ptr, layout),
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let choice = chosen();
        // SAFETY: the caller's contract: the new size fits `isize` once aligned.
        Self::count(
            unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) },
            choice,
        );
        // SAFETY: the caller's contract, passed on to the allocator that made the block.
        unsafe {
            match choice {
                USE_GLIBC => System.realloc(ptr, layout, new_size),
                USE_MIMALLOC => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                _ => POOL.realloc(ptr, layout, new_size),
            }
        }
    }
}
