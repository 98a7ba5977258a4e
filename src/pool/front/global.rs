//! The process-wide pool, and `PoolAllocator`: a `#[global_allocator]` front end that serves
//! large allocations from it.

// Under loom the `GlobalAlloc` front end is compiled out (loom's atomics cannot back a
// process-wide allocator), which leaves parts of this file unused.
#![cfg_attr(loom, allow(unused_imports, dead_code))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::mem::ManuallyDrop;
use std::ptr::{self, NonNull};

use super::raw::{self, Origin, MAX_ALIGN};
use crate::pool::config::PoolConfig;
use crate::pool::error::PoolError;
use crate::pool::BufferPool;

#[cfg(not(loom))]
static GLOBAL: std::sync::OnceLock<BufferPool> = std::sync::OnceLock::new();

impl BufferPool {
    /// The process-wide pool, created on first use (with [`PoolConfig::default`] unless
    /// [`configure_global`](Self::configure_global) came first). It is never closed. Its
    /// blocks come from the system allocator directly, so that [`PoolAllocator`] can serve
    /// from it.
    ///
    /// ```
    /// use ferropool::BufferPool;
    /// let buffer = BufferPool::global().alloc(4096)?;
    /// assert_eq!(buffer.pool_id(), BufferPool::global().id());
    /// assert!(BufferPool::global().stats().in_use_bytes >= 4096);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    #[cfg(not(loom))]
    pub fn global() -> &'static BufferPool {
        GLOBAL.get_or_init(|| {
            BufferPool::build(PoolConfig::default(), true)
                .expect("the default configuration is valid")
        })
    }

    /// The default pool of the current loom execution.
    #[cfg(loom)]
    pub fn global() -> &'static BufferPool {
        loom::lazy_static! {
            static ref GLOBAL: BufferPool =
                BufferPool::build(PoolConfig::default(), true).unwrap();
        }
        &GLOBAL
    }

    /// Sets the configuration of the process-wide pool, before its first use (by
    /// [`global`](Self::global), [`Tensor::from_slice`](crate::Tensor::from_slice) and
    /// friends, or [`PoolAllocator`]).
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig};
    /// BufferPool::configure_global(PoolConfig {
    ///     budget: Some(8 << 30),
    ///     ..PoolConfig::default()
    /// })?;
    /// assert_eq!(BufferPool::global().config().budget, Some(8 << 30));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PoolError::AlreadyInitialized`] if the pool is in use already;
    /// [`PoolError::InvalidConfig`] for a bad field.
    #[cfg(not(loom))]
    pub fn configure_global(config: PoolConfig) -> Result<(), PoolError> {
        let pool = BufferPool::build(config, true)?;
        GLOBAL.set(pool).map_err(|_| PoolError::AlreadyInitialized)
    }
}

/// A global allocator that serves allocations of at least a threshold from the process-wide
/// [`BufferPool`] and the rest from a fallback allocator `F` ([`System`] by default, or any
/// other `GlobalAlloc`, such as mimalloc's, for the small objects).
///
/// Install it to put the large allocations of every crate into the pool: `Vec`s of tensor
/// data, a GEMM's packing buffers, `ndarray` arrays. They are then cached and reused like the
/// pool's own buffers (no page faults once warm), count against the pool's budget and show in
/// its statistics ([`PoolAllocator::pool`]).
///
/// ```
/// use ferropool::PoolAllocator;
///
/// #[global_allocator]
/// static ALLOCATOR: PoolAllocator = PoolAllocator::new(); // 64 KiB and more go to the pool
///
/// fn main() {
///     // 4 MiB: from the pool. (`black_box`: an allocation the program never observes need
///     // not happen at all, by `GlobalAlloc`'s contract.)
///     let big = std::hint::black_box(vec![0f32; 1 << 20]);
///     drop(big); // cached for the next one
///     assert!(PoolAllocator::pool().stats().allocations >= 1);
/// }
/// ```
///
/// With another allocator for what stays below the threshold (any `GlobalAlloc` whose
/// constructor is `const`):
///
/// ```
/// use std::alloc::System;
/// use ferropool::PoolAllocator;
///
/// #[global_allocator]
/// static ALLOCATOR: PoolAllocator<System> = PoolAllocator::with_fallback(System, 1 << 20);
/// # fn main() { assert_eq!(ALLOCATOR.threshold(), 1 << 20); }
/// ```
///
/// # When to use it
///
/// When a program's memory is dominated by large, repeated allocations made through Rust's
/// standard collections or by libraries it does not control (the pattern of a training
/// loop). Not when allocations are mostly small (they go to the fallback anyway, for one
/// extra comparison each), nor when the program must give memory back to the system as soon
/// as it is freed (the pool caches it; call `PoolAllocator::pool().trim()` at quiet moments,
/// or set a budget with [`BufferPool::configure_global`]).
///
/// # Behaviour
///
/// - A request goes to the pool when its size is at least the threshold and its alignment at
///   most 4096; the same rule on `dealloc` and `realloc` sends it back to where it came from.
/// - Such a request the pool refuses (its budget, or the system) is served by the fallback
///   allocator instead, never aborted for the budget: the refusal counts in the pool's
///   statistics (`budget_failures`) and in [`fallback_allocations`](Self::fallback_allocations).
///   A global allocator cannot return an error, so a budget on the process-wide pool limits
///   what the pool holds, not what the program may allocate. (Code that wants the error
///   allocates from the pool itself: [`BufferPool::alloc`], `Tensor`s.) Those blocks carry a
///   header that says where they came from, so they go back there.
/// - The pool's own bookkeeping (its tables, its trace ring, and the exports it builds:
///   `trace_events`, `trace_json`, `write_trace_json` with its writer, `snapshot`,
///   `class_stats`, `memory_by_tag`) never comes
///   from the pool it describes and never counts against its budget.
/// - `realloc` within the pool keeps the block when the new size still fits it (and uses at
///   least half of it), and the pool's `requested_bytes` follows; otherwise it moves the
///   bytes.
#[derive(Clone, Copy)]
pub struct PoolAllocator<F = System> {
    threshold: usize,
    fallback: F,
}

/// Requests of at least a threshold that the pool refused and the fallback served, in the
/// whole process (bookkeeping outside any protocol).
static FALLBACKS: crate::sync::Tally = crate::sync::Tally::new(0);

impl PoolAllocator {
    /// The default threshold: 64 KiB.
    pub const DEFAULT_THRESHOLD: usize = 64 << 10;
    /// The smallest threshold: 4 KiB. (Below it, the pool's bookkeeping would be served by
    /// the pool.)
    pub const MIN_THRESHOLD: usize = 4 << 10;

    /// A front end with the default threshold, over [`System`].
    ///
    /// ```
    /// use ferropool::PoolAllocator;
    /// static ALLOCATOR: PoolAllocator = PoolAllocator::new(); // usable in a `static`
    /// assert_eq!(ALLOCATOR.threshold(), PoolAllocator::DEFAULT_THRESHOLD);
    /// ```
    pub const fn new() -> Self {
        Self::with_threshold(Self::DEFAULT_THRESHOLD)
    }

    /// A front end over [`System`] that sends requests of at least `threshold` bytes (at
    /// least [`MIN_THRESHOLD`](Self::MIN_THRESHOLD)) to the pool.
    ///
    /// ```
    /// use ferropool::PoolAllocator;
    /// static ALLOCATOR: PoolAllocator = PoolAllocator::with_threshold(1 << 20); // 1 MiB and more
    /// assert_eq!(ALLOCATOR.threshold(), 1 << 20);
    /// assert_eq!(PoolAllocator::with_threshold(0).threshold(), PoolAllocator::MIN_THRESHOLD);
    /// ```
    pub const fn with_threshold(threshold: usize) -> Self {
        Self::with_fallback(System, threshold)
    }

    /// The pool every `PoolAllocator` serves from: [`BufferPool::global`].
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolAllocator};
    /// let pool = PoolAllocator::pool(); // whether the allocator is installed or not
    /// assert!(std::ptr::eq(pool, BufferPool::global()));
    /// ```
    #[cfg(not(loom))]
    pub fn pool() -> &'static BufferPool {
        BufferPool::global()
    }

    /// Requests of at least the threshold that the pool refused (its budget, the system, or
    /// a size past its largest class) and a fallback allocator served instead, since the
    /// process started (all `PoolAllocator`s together). Requests nobody could serve are not
    /// counted.
    ///
    /// ```
    /// let before = ferropool::PoolAllocator::fallback_allocations();
    /// assert!(ferropool::PoolAllocator::fallback_allocations() >= before);
    /// ```
    pub fn fallback_allocations() -> u64 {
        FALLBACKS.get()
    }
}

impl<F> PoolAllocator<F> {
    /// A front end that sends requests of at least `threshold` bytes (at least
    /// [`PoolAllocator::MIN_THRESHOLD`]) to the pool and the rest to `fallback`.
    ///
    /// ```
    /// use std::alloc::System;
    /// use ferropool::PoolAllocator;
    /// static ALLOCATOR: PoolAllocator<System> = PoolAllocator::with_fallback(System, 256 << 10);
    /// assert_eq!(ALLOCATOR.threshold(), 256 << 10);
    /// ```
    pub const fn with_fallback(fallback: F, threshold: usize) -> Self {
        Self {
            threshold: if threshold < PoolAllocator::MIN_THRESHOLD {
                PoolAllocator::MIN_THRESHOLD
            } else {
                threshold
            },
            fallback,
        }
    }

    /// The threshold.
    ///
    /// ```
    /// let allocator = ferropool::PoolAllocator::default();
    /// assert_eq!(allocator.threshold(), 64 << 10);
    /// ```
    pub const fn threshold(&self) -> usize {
        self.threshold
    }

    /// The fallback allocator.
    ///
    /// ```
    /// let allocator = ferropool::PoolAllocator::new();
    /// let _system: &std::alloc::System = allocator.fallback();
    /// ```
    pub const fn fallback(&self) -> &F {
        &self.fallback
    }

    #[inline(always)]
    fn pooled(&self, layout: Layout) -> bool {
        layout.size() >= self.threshold && layout.align() <= MAX_ALIGN
    }
}

#[cfg(not(loom))]
impl<F: GlobalAlloc> PoolAllocator<F> {
    /// A block for a pooled layout: from the pool, or from the fallback (with a header that
    /// says so) while the calling thread builds the pool's own bookkeeping, or when the pool
    /// refuses.
    fn allocate(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let tried_pool = !crate::thread::in_bookkeeping();
        if tried_pool {
            // Never evicting: eviction must not run inside the process's allocator.
            let pool = BufferPool::global().inner;
            if let Ok(ptr) = raw::alloc_raw(pool, layout, zeroed, false) {
                return ptr.as_ptr();
            }
        }
        let served = raw::alloc_fallback(layout, |block| {
            // SAFETY: `block` has a non-zero size (it holds the header).
            unsafe {
                if zeroed {
                    self.fallback.alloc_zeroed(block)
                } else {
                    self.fallback.alloc(block)
                }
            }
        });
        if tried_pool && !served.is_null() {
            FALLBACKS.add(1);
        }
        served
    }

    /// Gives back a block of a pooled layout to where it came from.
    ///
    /// # Safety
    ///
    /// `ptr` came from [`allocate`](Self::allocate) and is not used afterwards.
    unsafe fn deallocate(&self, ptr: NonNull<u8>) {
        // SAFETY: the caller's contract: a raw block with its header, given back once here.
        match unsafe { raw::origin(ptr) } {
            Origin::Pooled(buffer) => drop(ManuallyDrop::into_inner(buffer)),
            // SAFETY: a block of the fallback with that layout (its header says so).
            Origin::Fallback(block) => unsafe { self.fallback.dealloc(block.base, block.layout) },
        }
    }
}

impl Default for PoolAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl<F> std::fmt::Debug for PoolAllocator<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolAllocator")
            .field("threshold", &self.threshold)
            .field("fallback", &std::any::type_name::<F>())
            .finish()
    }
}

#[cfg(not(loom))]
// SAFETY: every block handed out is either the fallback's or a raw block, decided by the
// layout alone (`pooled`); a raw block's header says whether the pool or the fallback holds
// it, so each comes back to where it came from; raw blocks hold at least `layout.size()`
// bytes aligned to `layout.align()` (see `raw.rs`).
unsafe impl<F: GlobalAlloc> GlobalAlloc for PoolAllocator<F> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.pooled(layout) {
            self.allocate(layout, false)
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.fallback.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if self.pooled(layout) {
            self.allocate(layout, true)
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.fallback.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.pooled(layout) {
            // SAFETY: `pooled(layout)` held when it was allocated (same layout): it is a raw
            // block; `ptr` is non-null (allocation succeeded).
            unsafe { self.deallocate(NonNull::new_unchecked(ptr)) }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.fallback.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract: `new_size`, rounded to the alignment, fits `isize`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (self.pooled(layout), self.pooled(new_layout)) {
            // SAFETY: the caller's contract, passed on.
            (false, false) => unsafe { self.fallback.realloc(ptr, layout, new_size) },
            (true, true)
                if {
                    // SAFETY: a raw block (see `dealloc`), still in use; the copy is only
                    // looked at.
                    let block = unsafe { raw::origin(NonNull::new_unchecked(ptr)) };
                    // SAFETY: as above: `ptr` is non-null.
                    block
                        .pooled_capacity(unsafe { NonNull::new_unchecked(ptr) })
                        .is_some_and(|capacity| raw::resizes_in_place(capacity, new_size, true))
                } =>
            {
                // SAFETY: a raw pool block that holds `new_size` bytes; the caller gives it
                // to us for the call.
                unsafe { raw::resize_raw(NonNull::new_unchecked(ptr), layout.align(), new_size) }
                    .as_ptr()
            }
            _ => {
                // SAFETY: `new_layout` has a non-zero size (the caller's contract).
                let moved = unsafe { self.alloc(new_layout) };
                if !moved.is_null() {
                    // SAFETY: both blocks hold at least the smaller size; they are distinct.
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                moved
            }
        }
    }
}
