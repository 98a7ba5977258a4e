//! `allocator_api2::alloc::Allocator` for pools (feature `allocator-api2`): collections from
//! `allocator-api2` and `hashbrown` live in a pool, under its budget and in its statistics.

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator};

use super::raw::{self, MAX_ALIGN};
use crate::pool::BufferPool;

/// Allocates blocks for collections from the pool: blocks are raw pool blocks whose header
/// says where they belong, so `deallocate` finds the block from the pointer in O(1) without a
/// lock. `&BufferPool` is an allocator too (`allocator-api2` implements it for references),
/// and so is an owned handle (`Vec<T, BufferPool>` keeps its pool open). A refusal (the
/// budget, the system, an alignment above 4096) is an [`AllocError`]; the budget's
/// refusals count in the pool's statistics.
///
/// ```
/// use allocator_api2::vec::Vec;
/// use ferropool::{BufferPool, PoolConfig};
///
/// let pool = BufferPool::with_config(PoolConfig {
///     budget: Some(1 << 20),
///     ..PoolConfig::default()
/// })?;
/// let mut weights: Vec<f32, &BufferPool> = Vec::with_capacity_in(1024, &pool);
/// weights.extend((0..1024).map(|i| i as f32));
/// assert!(pool.stats().in_use_bytes >= 4096);
/// // A vector the budget cannot hold is refused, not aborted.
/// let mut huge: Vec<f32, &BufferPool> = Vec::new_in(&pool);
/// assert!(huge.try_reserve(1 << 20).is_err());
/// # Ok::<(), ferropool::PoolError>(())
/// ```
// SAFETY: `allocate` returns a block of at least `layout.size()` bytes aligned to
// `layout.align()` that stays valid until `deallocate` (the pool outlives its blocks: a live
// block keeps its pool alive); `deallocate` returns exactly a block `allocate` made (its
// header names it); zero-sized layouts get a dangling aligned pointer and are not freed.
unsafe impl Allocator for BufferPool {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        allocate_block(self, layout, false)
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        allocate_block(self, layout, true)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: the caller's contract: `ptr` came from `allocate` with this layout, so
            // it is a raw pool block.
            unsafe { raw::dealloc_raw(ptr) };
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old_layout.size() != 0 && old_layout.align() == new_layout.align() {
            // SAFETY: a raw pool block from `allocate` (the caller's contract), in use.
            let capacity = unsafe { raw::raw_capacity(ptr) };
            if raw::resizes_in_place(capacity, new_layout.size(), false) {
                // SAFETY: a raw pool block in use, which holds `new_layout.size()` bytes.
                let ptr = unsafe { raw::resize_raw(ptr, new_layout.align(), new_layout.size()) };
                return Ok(NonNull::slice_from_raw_parts(ptr, capacity));
            }
        }
        // SAFETY: the caller's contract; `old_layout.size() <= new_layout.size()`.
        unsafe { move_block(self, ptr, old_layout, new_layout, old_layout.size()) }
    }

    /// Shrinks in place: the block keeps its bytes, and no new memory is asked for (which
    /// the budget could refuse). This is `raw::resizes_in_place` without a move, which a
    /// shrink always meets; only a larger alignment than the block has moves it.
    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old_layout: Layout,
        new_layout: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old_layout.size() == 0 {
            // A dangling block: nothing was allocated, nothing is.
            return Ok(NonNull::slice_from_raw_parts(ptr, 0));
        }
        if new_layout.size() == 0 {
            // SAFETY: the caller's contract: a block from `allocate` with `old_layout`.
            unsafe { self.deallocate(ptr, old_layout) };
            return allocate_block(self, new_layout, false); // a dangling pointer, nothing held
        }
        if new_layout.align() <= old_layout.align()
            || ptr.addr().get().is_multiple_of(new_layout.align())
        {
            // SAFETY: a raw pool block from `allocate` (the caller's contract), in use; it
            // holds `new_layout.size() <= old_layout.size()` bytes.
            let (ptr, capacity) = unsafe {
                let ptr = raw::resize_raw(ptr, new_layout.align(), new_layout.size());
                (ptr, raw::raw_capacity(ptr))
            };
            return Ok(NonNull::slice_from_raw_parts(ptr, capacity));
        }
        // SAFETY: the caller's contract; `new_layout.size() <= old_layout.size()`.
        unsafe { move_block(self, ptr, old_layout, new_layout, new_layout.size()) }
    }
}

/// Moves a block of `pool` to a new one for `new_layout`, copying its first `bytes`.
///
/// # Safety
///
/// `ptr` came from `pool`'s `allocate` with `old_layout` and is not used afterwards; both
/// layouts hold at least `bytes`.
unsafe fn move_block(
    pool: &BufferPool,
    ptr: NonNull<u8>,
    old_layout: Layout,
    new_layout: Layout,
    bytes: usize,
) -> Result<NonNull<[u8]>, AllocError> {
    let moved = allocate_block(pool, new_layout, false)?;
    // SAFETY: both blocks hold `bytes` bytes (the caller's contract) and are distinct; the
    // old one is given back once, after the copy.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr.as_ptr(), moved.cast().as_ptr(), bytes);
        pool.deallocate(ptr, old_layout);
    }
    Ok(moved)
}

/// A block for `layout` from `pool`: with the capacity it really has, or, zeroed, with the
/// layout's size (only those bytes are zeroed, and the whole block returned must be).
fn allocate_block(
    pool: &BufferPool,
    layout: Layout,
    zeroed: bool,
) -> Result<NonNull<[u8]>, AllocError> {
    if layout.size() == 0 {
        // A dangling pointer with the layout's alignment: zero-sized blocks are never read.
        let dangling =
            NonNull::new(std::ptr::without_provenance_mut(layout.align())).ok_or(AllocError)?;
        return Ok(NonNull::slice_from_raw_parts(dangling, 0));
    }
    if layout.align() > MAX_ALIGN {
        return Err(AllocError);
    }
    // Evicting, as every door of a pool handle does (see `RetainedValue::evictable`).
    let ptr = raw::alloc_raw(pool.inner, layout, zeroed, true).map_err(|_| AllocError)?;
    if zeroed {
        return Ok(NonNull::slice_from_raw_parts(ptr, layout.size()));
    }
    // SAFETY: just allocated by `alloc_raw`.
    let capacity = unsafe { raw::raw_capacity(ptr) };
    Ok(NonNull::slice_from_raw_parts(ptr, capacity))
}
