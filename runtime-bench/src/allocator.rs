//! The process's global allocator, chosen when the process starts by the environment variable
//! [`VARIABLE`]: glibc (`std::alloc::System`), mimalloc, ferropool's [`PoolAllocator`] over
//! glibc (its default configuration), or the pool over mimalloc. One binary, so `--compare`
//! runs the same training under each allocator as child processes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use ferropool::PoolAllocator;
use mimalloc::MiMalloc;

/// The environment variable that picks the allocator.
pub const VARIABLE: &str = "RUNTIME_BENCH_ALLOCATOR";
/// [`VARIABLE`] for `getenv`.
const VARIABLE_C: &std::ffi::CStr = c"RUNTIME_BENCH_ALLOCATOR";

/// The pool's default front end: requests of 64 KiB and more from the pool, the rest from
/// glibc.
const POOL: PoolAllocator = PoolAllocator::new();
/// The same threshold, over mimalloc.
const POOL_MIMALLOC: PoolAllocator<MiMalloc> =
    PoolAllocator::with_fallback(MiMalloc, PoolAllocator::DEFAULT_THRESHOLD);

/// Which allocator this process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Choice {
    /// The system allocator (glibc on Linux).
    Glibc = 1,
    /// mimalloc.
    Mimalloc = 2,
    /// ferropool's `PoolAllocator::new()`: the pool from 64 KiB, glibc below.
    Pool = 3,
    /// ferropool's pool from 64 KiB, mimalloc below.
    PoolMimalloc = 4,
}

impl Choice {
    /// Every choice, in the order `--compare` alternates them.
    pub const ALL: [Choice; 4] = [
        Choice::Glibc,
        Choice::Mimalloc,
        Choice::Pool,
        Choice::PoolMimalloc,
    ];

    /// The value of [`VARIABLE`] that selects it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Glibc => "glibc",
            Self::Mimalloc => "mimalloc",
            Self::Pool => "pool",
            Self::PoolMimalloc => "pool-mimalloc",
        }
    }

    /// Whether ferropool's pool serves the large requests.
    pub fn is_pool(self) -> bool {
        matches!(self, Self::Pool | Self::PoolMimalloc)
    }

    fn from_bytes(value: &[u8]) -> Option<Self> {
        Some(match value {
            b"glibc" | b"system" => Self::Glibc,
            b"mimalloc" => Self::Mimalloc,
            b"pool" => Self::Pool,
            b"pool-mimalloc" => Self::PoolMimalloc,
            _ => return None,
        })
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Glibc,
            2 => Self::Mimalloc,
            3 => Self::Pool,
            _ => Self::PoolMimalloc,
        }
    }
}

const UNSET: u8 = 0;
/// Set when [`VARIABLE`] held a value none of the choices has (the pool is used then, and
/// `main` refuses to run).
static UNKNOWN: AtomicU8 = AtomicU8::new(0);
static CHOICE: AtomicU8 = AtomicU8::new(UNSET);

/// The allocator this process uses.
pub fn choice() -> Choice {
    Choice::from_u8(chosen())
}

/// Whether [`VARIABLE`] held a value that names no allocator.
pub fn unknown_value() -> bool {
    UNKNOWN.load(Ordering::Relaxed) != 0
}

/// Decides the allocator on the first call (before anything else allocates), reading the
/// environment with `getenv`, which does not allocate. Unset means the pool, as in the main
/// job.
#[inline]
fn chosen() -> u8 {
    let choice = CHOICE.load(Ordering::Relaxed);
    if choice != UNSET {
        return choice;
    }
    // SAFETY: the value is read before anything can change the environment (the first
    // allocation of the process happens before `main` starts any thread).
    let choice = match unsafe { ferropool_figures::getenv(VARIABLE_C) } {
        None => Choice::Pool,
        Some(bytes) => Choice::from_bytes(bytes).unwrap_or_else(|| {
            UNKNOWN.store(1, Ordering::Relaxed);
            Choice::Pool
        }),
    };
    let _ = CHOICE.compare_exchange(UNSET, choice as u8, Ordering::Relaxed, Ordering::Relaxed);
    CHOICE.load(Ordering::Relaxed)
}

/// The global allocator of the `runtime-bench` binary.
#[derive(Debug)]
pub struct Selected;

// SAFETY: every call goes to one allocator, chosen once before the first allocation and never
// changed, so each block goes back to the allocator it came from.
unsafe impl GlobalAlloc for Selected {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match Choice::from_u8(chosen()) {
                Choice::Glibc => System.alloc(layout),
                Choice::Mimalloc => MiMalloc.alloc(layout),
                Choice::Pool => POOL.alloc(layout),
                Choice::PoolMimalloc => POOL_MIMALLOC.alloc(layout),
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match Choice::from_u8(chosen()) {
                Choice::Glibc => System.alloc_zeroed(layout),
                Choice::Mimalloc => MiMalloc.alloc_zeroed(layout),
                Choice::Pool => POOL.alloc_zeroed(layout),
                Choice::PoolMimalloc => POOL_MIMALLOC.alloc_zeroed(layout),
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on to the allocator that made the block.
        unsafe {
            match Choice::from_u8(chosen()) {
                Choice::Glibc => System.dealloc(ptr, layout),
                Choice::Mimalloc => MiMalloc.dealloc(ptr, layout),
                Choice::Pool => POOL.dealloc(ptr, layout),
                Choice::PoolMimalloc => POOL_MIMALLOC.dealloc(ptr, layout),
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on to the allocator that made the block.
        unsafe {
            match Choice::from_u8(chosen()) {
                Choice::Glibc => System.realloc(ptr, layout, new_size),
                Choice::Mimalloc => MiMalloc.realloc(ptr, layout, new_size),
                Choice::Pool => POOL.realloc(ptr, layout, new_size),
                Choice::PoolMimalloc => POOL_MIMALLOC.realloc(ptr, layout, new_size),
            }
        }
    }
}
