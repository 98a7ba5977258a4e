//! Allocation by layout, for Rust's allocator interfaces (`GlobalAlloc`, `Allocator`): the
//! caller gets a pointer and later gives back the pointer and the same layout, nothing else.
//!
//! A block allocated this way holds a header, just before the caller's pointer, that records
//! what a [`PoolBuffer`] would hold (the pool, the block's record, class and length). The pointer is
//! the first address with the layout's alignment that leaves room for the header before it.
//! Giving it back reads the header at `ptr - HEADER`: O(1), no lock, no lookup table.

// Raw blocks serve the `GlobalAlloc` and `Allocator` front ends, which loom builds leave
// out (loom's atomics cannot back a process-wide allocator): parts of this file go unused.
#![cfg_attr(loom, allow(unused_imports, dead_code))]

use std::alloc::Layout;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::buffer::PoolBuffer;
use super::{PoolError, PoolInner};

/// What a raw block's header records.
#[repr(C)]
struct Header {
    /// The buffer, as it would be held by a `PoolBuffer` (whose fields it is).
    buffer: ManuallyDrop<PoolBuffer>,
}

/// The largest alignment a raw allocation serves (larger ones would waste most of a block).
pub(super) const MAX_ALIGN: usize = 4096;

/// Bytes of the header, which sits right before the caller's pointer.
const HEADER: usize = std::mem::size_of::<Header>();

/// Bytes a raw block needs beyond the layout's size: the header, and the padding to the
/// layout's alignment after it.
#[inline]
fn overhead(layout: Layout) -> usize {
    HEADER + layout.align() - 1
}

impl PoolInner {
    /// A raw block for `layout` (non-zero size, alignment at most [`MAX_ALIGN`]).
    pub(super) fn alloc_raw(
        this: NonNull<PoolInner>,
        layout: Layout,
        zeroed: bool,
    ) -> Result<NonNull<u8>, PoolError> {
        let total = layout
            .size()
            .checked_add(overhead(layout))
            .ok_or(PoolError::TooLarge {
                requested: layout.size(),
                max: super::class::MAX_SIZE,
            })?;
        let mut buffer = PoolInner::alloc(this, total, zeroed)?;
        let start = buffer.as_mut_ptr();
        let offset = (start as usize + HEADER).next_multiple_of(layout.align()) - start as usize;
        debug_assert!(offset >= HEADER && offset - HEADER < layout.align());
        // SAFETY: `offset + layout.size() <= total`, the block's bytes, exclusively ours. The
        // header goes in `[ptr - HEADER, ptr)`, inside the block (`offset >= HEADER`), written
        // unaligned (the pointer has only the layout's alignment).
        unsafe {
            let ptr = start.add(offset);
            ptr.sub(HEADER).cast::<Header>().write_unaligned(Header {
                buffer: ManuallyDrop::new(buffer),
            });
            Ok(NonNull::new_unchecked(ptr))
        }
    }

    /// Gives back a raw block.
    ///
    /// # Safety
    ///
    /// `ptr` came from [`alloc_raw`](Self::alloc_raw) and is not used afterwards.
    pub(super) unsafe fn dealloc_raw(ptr: NonNull<u8>) {
        // SAFETY: `alloc_raw` wrote the header right before `ptr`, in the same block (the
        // caller's contract); it is read once, and the buffer dropped, here.
        let header = unsafe { ptr.as_ptr().sub(HEADER).cast::<Header>().read_unaligned() };
        drop(ManuallyDrop::into_inner(header.buffer));
    }

    /// Bytes a raw block can hold for `layout` without moving.
    ///
    /// # Safety
    ///
    /// As [`dealloc_raw`](Self::dealloc_raw), but the block stays in use.
    pub(super) unsafe fn raw_capacity(ptr: NonNull<u8>) -> usize {
        // SAFETY: as in `dealloc_raw`; the copy is only looked at (never dropped).
        let header = unsafe { ptr.as_ptr().sub(HEADER).cast::<Header>().read_unaligned() };
        let start = header.buffer.as_ptr() as usize;
        header.buffer.capacity() - (ptr.as_ptr() as usize - start)
    }
}
