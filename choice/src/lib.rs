//! A process's global allocator, chosen when the process starts by an environment variable:
//! glibc (`std::alloc::System`), mimalloc, or ferropool's [`PoolAllocator`] in front of
//! either. One binary then runs the same work under each allocator, as child processes that
//! get the variable set: the main job's `compare` and `sweep`, and `runtime-bench --compare`.
//!
//! The binary declares one [`ChosenAllocator`] in its library (so that its code can ask
//! which allocator runs) and makes a reference to it the global allocator:
//!
//! ```no_run
//! use ferropool::PoolAllocator;
//! use ferropool_choice::{Choice, ChosenAllocator};
//!
//! // SAFETY: the global allocator: its first use is the process's first allocation,
//! // before any thread can change the environment.
//! pub static ALLOCATOR: ChosenAllocator = unsafe {
//!     ChosenAllocator::new(
//!         c"MY_BENCH_ALLOCATOR",
//!         Choice::PoolMimalloc,
//!         PoolAllocator::MIN_THRESHOLD,
//!         true, // count the calls that reach glibc and mimalloc
//!     )
//! };
//!
//! #[global_allocator]
//! static GLOBAL: &ChosenAllocator = &ALLOCATOR;
//!
//! fn main() {
//!     println!("running on {}", ALLOCATOR.choice().name());
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::CStr;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use ferropool::PoolAllocator;
use mimalloc::MiMalloc;

/// Which allocator a process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Choice {
    /// The system allocator (glibc on Linux).
    Glibc = 1,
    /// mimalloc.
    Mimalloc = 2,
    /// ferropool's `PoolAllocator` over glibc: the pool from the threshold up, glibc below.
    Pool = 3,
    /// ferropool's `PoolAllocator` over mimalloc.
    PoolMimalloc = 4,
}

impl Choice {
    /// Every choice.
    pub const ALL: [Choice; 4] = [
        Choice::Glibc,
        Choice::Mimalloc,
        Choice::Pool,
        Choice::PoolMimalloc,
    ];

    /// The value of the variable that selects it.
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

    /// The choice a value of the variable names (`system` is glibc too).
    pub fn from_name(value: &[u8]) -> Option<Self> {
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

/// No choice made yet (the process has not allocated).
const UNSET: u8 = 0;

/// A global allocator that picks one of the [`Choice`]s on the process's first allocation,
/// from an environment variable, and keeps it: every block goes back to the allocator that
/// made it. Make `&'static ChosenAllocator` the `#[global_allocator]` (see the crate docs).
pub struct ChosenAllocator {
    /// The variable read on the first allocation.
    variable: &'static CStr,
    /// The choice when the variable is unset or names no allocator.
    default: Choice,
    /// [`UNSET`], then the chosen [`Choice`] as `u8`, never changed again.
    choice: AtomicU8,
    /// Whether the variable named no allocator.
    unknown: AtomicBool,
    pool: PoolAllocator,
    pool_mimalloc: PoolAllocator<MiMalloc>,
    /// Whether to count the calls that reach glibc and mimalloc (a shared counter each:
    /// contended when threads allocate at once, so off where that matters).
    count_calls: bool,
    glibc_calls: AtomicU64,
    mimalloc_calls: AtomicU64,
}

impl fmt::Debug for ChosenAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChosenAllocator")
            .field("variable", &self.variable)
            .field("choice", &self.choice())
            .finish_non_exhaustive()
    }
}

impl ChosenAllocator {
    /// An allocator chosen by `variable` (`default` when unset or unknown); the pool
    /// choices serve requests of `pool_threshold` bytes and more from ferropool's
    /// process-wide pool (at least [`PoolAllocator::MIN_THRESHOLD`]). With `count_calls`,
    /// it counts the calls that reach glibc and mimalloc.
    ///
    /// # Safety
    ///
    /// Its first use (an allocation, or [`choice`](Self::choice) and the other readers)
    /// reads the environment with `getenv`, which does not take the lock that
    /// `std::env::set_var` takes: no thread may change the environment meanwhile. As the
    /// `#[global_allocator]` that is met, as the process's first allocation comes before
    /// `main` starts a thread; any other use must make sure of it.
    pub const unsafe fn new(
        variable: &'static CStr,
        default: Choice,
        pool_threshold: usize,
        count_calls: bool,
    ) -> Self {
        Self {
            variable,
            default,
            choice: AtomicU8::new(UNSET),
            unknown: AtomicBool::new(false),
            pool: PoolAllocator::with_fallback(System, pool_threshold),
            pool_mimalloc: PoolAllocator::with_fallback(MiMalloc, pool_threshold),
            count_calls,
            glibc_calls: AtomicU64::new(0),
            mimalloc_calls: AtomicU64::new(0),
        }
    }

    /// The allocator this process uses.
    pub fn choice(&self) -> Choice {
        Choice::from_u8(self.chosen())
    }

    /// The environment variable that chooses.
    pub fn variable(&self) -> &'static str {
        self.variable.to_str().unwrap_or("")
    }

    /// Whether the variable held a value that names no allocator (the default runs then).
    pub fn unknown_value(&self) -> bool {
        self.chosen();
        self.unknown.load(Ordering::Relaxed)
    }

    /// The error to end the process with when the variable held a value that names no
    /// allocator: the variable and the names it takes. `None` when it named one, or was unset.
    pub fn unknown_value_error(&self) -> Option<String> {
        self.unknown_value().then(|| {
            let names: Vec<&str> = Choice::ALL.iter().map(|choice| choice.name()).collect();
            format!(
                "{} names no allocator ({})",
                self.variable(),
                names.join(", ")
            )
        })
    }

    /// Calls that reached glibc so far (0 unless counting).
    pub fn glibc_calls(&self) -> u64 {
        self.glibc_calls.load(Ordering::Relaxed)
    }

    /// Calls that reached mimalloc so far (0 unless counting; for the pool over mimalloc,
    /// its requests under the threshold).
    pub fn mimalloc_calls(&self) -> u64 {
        self.mimalloc_calls.load(Ordering::Relaxed)
    }

    /// Decides on the first call (before anything else allocates), reading the environment
    /// with `getenv`, which does not allocate.
    #[inline]
    fn chosen(&self) -> u8 {
        let choice = self.choice.load(Ordering::Relaxed);
        if choice != UNSET {
            return choice;
        }
        // SAFETY: no thread changes the environment during the first use (`new`'s contract).
        let choice = match unsafe { ferropool_figures::getenv(self.variable) } {
            None => self.default,
            Some(bytes) => Choice::from_name(bytes).unwrap_or_else(|| {
                self.unknown.store(true, Ordering::Relaxed);
                self.default
            }),
        };
        let _ =
            self.choice
                .compare_exchange(UNSET, choice as u8, Ordering::Relaxed, Ordering::Relaxed);
        self.choice.load(Ordering::Relaxed)
    }

    /// Counts a call for `layout` that `choice` sends to glibc or mimalloc.
    #[inline]
    fn count(&self, layout: Layout, choice: Choice) {
        if !self.count_calls {
            return;
        }
        let below = |threshold: usize| layout.size() < threshold || layout.align() > 4096;
        let counter = match choice {
            Choice::Glibc => &self.glibc_calls,
            Choice::Mimalloc => &self.mimalloc_calls,
            Choice::Pool if below(self.pool.threshold()) => &self.glibc_calls,
            Choice::PoolMimalloc if below(self.pool_mimalloc.threshold()) => &self.mimalloc_calls,
            Choice::Pool | Choice::PoolMimalloc => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call goes to one allocator, chosen once before the first allocation and never
// changed, so each block goes back to the allocator it came from.
unsafe impl GlobalAlloc for &'static ChosenAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let choice = self.choice();
        self.count(layout, choice);
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match choice {
                Choice::Glibc => System.alloc(layout),
                Choice::Mimalloc => MiMalloc.alloc(layout),
                Choice::Pool => self.pool.alloc(layout),
                Choice::PoolMimalloc => self.pool_mimalloc.alloc(layout),
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let choice = self.choice();
        self.count(layout, choice);
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match choice {
                Choice::Glibc => System.alloc_zeroed(layout),
                Choice::Mimalloc => MiMalloc.alloc_zeroed(layout),
                Choice::Pool => self.pool.alloc_zeroed(layout),
                Choice::PoolMimalloc => self.pool_mimalloc.alloc_zeroed(layout),
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on to the allocator that made the block.
        unsafe {
            match self.choice() {
                Choice::Glibc => System.dealloc(ptr, layout),
                Choice::Mimalloc => MiMalloc.dealloc(ptr, layout),
                Choice::Pool => self.pool.dealloc(ptr, layout),
                Choice::PoolMimalloc => self.pool_mimalloc.dealloc(ptr, layout),
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let choice = self.choice();
        // SAFETY: the caller's contract: the new size fits `isize` once aligned.
        self.count(
            unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) },
            choice,
        );
        // SAFETY: the caller's contract, passed on to the allocator that made the block.
        unsafe {
            match choice {
                Choice::Glibc => System.realloc(ptr, layout, new_size),
                Choice::Mimalloc => MiMalloc.realloc(ptr, layout, new_size),
                Choice::Pool => self.pool.realloc(ptr, layout, new_size),
                Choice::PoolMimalloc => self.pool_mimalloc.realloc(ptr, layout, new_size),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_values_are_refused() {
        for choice in Choice::ALL {
            assert_eq!(Choice::from_name(choice.name().as_bytes()), Some(choice));
            assert_eq!(Choice::from_u8(choice as u8), choice);
        }
        assert_eq!(Choice::from_name(b"system"), Some(Choice::Glibc));
        assert_eq!(Choice::from_name(b"jemalloc"), None);
        assert!(Choice::Pool.is_pool() && Choice::PoolMimalloc.is_pool());
        assert!(!Choice::Glibc.is_pool() && !Choice::Mimalloc.is_pool());
    }

    #[test]
    fn an_allocator_serves_and_counts_what_it_chose() {
        // Not the global allocator: a value of its own, whose variable is unset.
        // SAFETY: no test of this crate changes the environment.
        static UNDER_TEST: ChosenAllocator = unsafe {
            ChosenAllocator::new(
                c"FERROPOOL_CHOICE_TEST_UNSET_VARIABLE",
                Choice::Mimalloc,
                PoolAllocator::MIN_THRESHOLD,
                true,
            )
        };
        let allocator: &'static ChosenAllocator = &UNDER_TEST;
        assert_eq!(allocator.choice(), Choice::Mimalloc);
        assert!(!allocator.unknown_value());
        let layout = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: a non-zero layout; the block goes back with the same layout.
        unsafe {
            let block = allocator.alloc(layout);
            assert!(!block.is_null());
            block.write_bytes(7, 100);
            allocator.dealloc(block, layout);
        }
        assert_eq!(
            (allocator.mimalloc_calls(), allocator.glibc_calls()),
            (1, 0)
        );
    }
}
