//! Allocation by layout, for Rust's allocator interfaces (`GlobalAlloc`, `Allocator`): the
//! caller gets a pointer and later gives back the pointer and the same layout, nothing else.
//!
//! A block allocated this way holds a header, just before the caller's pointer, that records what a
//! [`PoolBuffer`] would hold (the pool, the block's record, class and length). The pointer is the
//! first address with the layout's alignment that leaves room for the header before it. Giving it
//! back reads the header at the address `ptr - HEADER`, through the block's provenance (below):
//! O(1), no lock, no lookup table.
//!
//! # Whose pointer reaches the header
//!
//! Never the caller's. To the compiler the pointer a global allocator returns is a new object
//! of exactly `layout.size()` bytes (rustc marks `__rust_alloc` as an allocation function, and
//! LLVM treats its result as a fresh, uninitialised object of that size), and `dealloc` ends
//! it. A pointer derived from the caller's may address those bytes and nothing else: a header
//! read at `caller's pointer - HEADER` is an access outside its object, undefined behaviour,
//! and the optimiser, once `dealloc` is inlined behind `__rust_alloc`, reads it as a load
//! of the new object's never-written bytes (an undefined value, so the branch on the header's
//! kind is undefined and the whole path unreachable). So the header is reached with the
//! *block's* provenance, which the allocator owns: every block handed out has its provenance
//! exposed ([`hand_out`]), and the header is found from the caller's address alone
//! ([`header_of`], `with_exposed_provenance`), never by offsetting the caller's pointer.

// Raw blocks serve the `GlobalAlloc` and `Allocator` front ends, which loom builds leave
// out (loom's atomics cannot back a process-wide allocator): parts of this file go unused.
#![cfg_attr(loom, allow(unused_imports, dead_code))]

use std::alloc::Layout;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use crate::pool::class;
use crate::pool::engine::blocks::Record;
use crate::pool::engine::buffer::PoolBuffer;
use crate::pool::engine::inner::PoolInner;
use crate::pool::error::PoolError;

/// What a raw block's header records: where the block came from, and what giving it back
/// needs.
#[repr(C)]
struct Header {
    body: Body,
    /// Which field of `body` is in use: [`POOLED`] (with the block's colour in its low bits,
    /// see [`COLOUR_BITS`]) or [`FALLBACK`]. Last, so it sits right before the caller's
    /// pointer.
    kind: usize,
}

/// A header's body, as `Header::kind` says.
#[repr(C)]
union Body {
    /// A pool block: the buffer, as a `PoolBuffer` would hold it (whose fields it is).
    pooled: ManuallyDrop<PoolBuffer>,
    /// A block of the fallback allocator (see [`alloc_fallback`]).
    fallback: Fallback,
}

/// A block a front end took from its fallback allocator in place of the pool.
#[derive(Clone, Copy)]
#[repr(C)]
pub(in crate::pool) struct Fallback {
    /// The start of the block (the header and padding come before the caller's pointer).
    pub(in crate::pool) base: *mut u8,
    /// The layout the block was allocated with.
    pub(in crate::pool) layout: Layout,
}

/// `Header::kind` of a pool block, with its colour in [`COLOUR_BITS`].
const POOLED: usize = 0x504F_0000; // "PO", then the colour
/// The bits of a pool block's `Header::kind` that hold its colour (see [`colour`]).
const COLOUR_BITS: usize = 0xFFFF;
/// `Header::kind` of a fallback block.
const FALLBACK: usize = 0x4641_4C4C; // "FALL"

/// The largest alignment a raw allocation serves (larger ones would waste most of a block).
pub(in crate::pool) const MAX_ALIGN: usize = 4096;

/// The rule for resizing a raw pool block in place, for both front ends: the new size fits
/// the block from the caller's pointer on (`capacity` bytes), and, if the front end may
/// move the bytes at no risk (`PoolAllocator::realloc`, whose fallback serves what the
/// budget refuses), it uses at least half of the block, so that a block shrunk below half
/// goes back for a smaller one. The `Allocator` implementation cannot fall back: a move
/// asks the pool for memory its budget may refuse, so it keeps every block that fits
/// (`grow` and `shrink`).
pub(in crate::pool) fn resizes_in_place(capacity: usize, new_size: usize, may_move: bool) -> bool {
    new_size <= capacity && (!may_move || new_size >= capacity / 2)
}

/// Bytes of the header, which sits right before the caller's pointer.
const HEADER: usize = std::mem::size_of::<Header>();

/// The header of the raw block whose caller's pointer has address `addr`, as a pointer with
/// the block's provenance (exposed by [`hand_out`]), not the caller's: the caller's pointer
/// may address its `layout.size()` bytes only (see the module's docs). Making it is safe;
/// using it needs a block still in use whose caller's pointer has that address.
#[inline(always)]
fn header_of(addr: usize) -> *mut Header {
    // `addr >= HEADER` for every caller's pointer (the header lies before it in its block);
    // for any other address the pointer is dangling, and only made, never used.
    std::ptr::with_exposed_provenance_mut(addr.wrapping_sub(HEADER))
}

/// Writes `header` before the caller's pointer `ptr`, which is derived from the block's own
/// pointer, and exposes the block's provenance, so that [`header_of`] can reach the header
/// from the caller's address alone.
///
/// # Safety
///
/// `[ptr - HEADER, ptr)` lies in a block the caller owns, and `ptr` carries that block's
/// provenance (it is not a pointer some caller of an allocator got back).
#[inline(always)]
unsafe fn hand_out(ptr: *mut u8, header: Header) {
    // SAFETY: the caller's contract: the header's bytes are in the block, ours; written
    // unaligned (the pointer has only the layout's alignment).
    let at = unsafe { ptr.sub(HEADER) }.cast::<Header>();
    // SAFETY: as above.
    unsafe { at.write_unaligned(header) };
    // The provenance `header_of` will pick: the block's, which covers the header.
    at.expose_provenance();
}

/// Bytes a raw block needs beyond the layout's size: the header, and the padding to the
/// layout's alignment after it.
#[inline]
fn overhead(layout: Layout) -> usize {
    HEADER + layout.align() - 1
}

/// The caller's pointer in a block starting at `start`: the first address with `align`
/// that leaves room for the header before it.
#[inline]
fn user_pointer(start: *mut u8, align: usize) -> *mut u8 {
    let offset = (start.addr() + HEADER).next_multiple_of(align) - start.addr();
    debug_assert!(offset >= HEADER && offset - HEADER < align);
    start.wrapping_add(offset)
}

/// Bytes between two colours of raw blocks (see [`colour`]).
const COLOUR_STEP: usize = 512;
/// How many colours raw blocks take: `COLOURS * COLOUR_STEP` is a page.
const COLOURS: usize = 8;

/// The colour of a raw block of `total` bytes (header and padding included) in `buffer`,
/// for a caller that asked for alignment `align`: extra bytes before the caller's pointer,
/// a multiple of [`COLOUR_STEP`] within the block's capacity past `total`. Each block has
/// its own, from its record's place in the block table (consecutive blocks take
/// consecutive colours), reduced to the colours its spare bytes hold.
///
/// Why: blocks of one class sit at one offset within their pages (large blocks are mapped
/// pages), so a kernel that reads two buffers and writes a third walks streams whose
/// addresses agree in their low 12 bits: loads then wait on stores they seem to overlap
/// (4K aliasing), and the streams share cache sets. Offsets 512 bytes apart avoid both
/// (see DESIGN.md).
#[inline(always)]
fn colour(buffer: &PoolBuffer, total: usize, align: usize) -> usize {
    if align > COLOUR_STEP {
        return 0;
    }
    // Records sit side by side in the block table.
    let record = buffer.record_ptr().addr().get() / std::mem::size_of::<Record>();
    let colour = record % COLOURS;
    let fits = (buffer.capacity() - total) / COLOUR_STEP;
    // A mask, and a division only where fewer colours fit than there are.
    let colour = if colour <= fits {
        colour
    } else {
        colour % (fits + 1)
    };
    colour * COLOUR_STEP
}

/// Where a raw block came from, read from its header (one read: the caller frees or looks at
/// the block from this copy).
pub(in crate::pool) enum Origin {
    /// The pool, with the block's buffer: dropping it (`ManuallyDrop::into_inner`) gives the
    /// block back; a copy only looked at must not be dropped.
    Pooled(ManuallyDrop<PoolBuffer>),
    /// The fallback allocator, with this block.
    Fallback(Fallback),
}

impl Origin {
    /// Bytes the block can hold for its caller's pointer `ptr` without moving (`None` for a
    /// fallback block, which never grows in place).
    pub(in crate::pool) fn pooled_capacity(&self, ptr: NonNull<u8>) -> Option<usize> {
        match self {
            Origin::Pooled(buffer) => {
                Some(buffer.capacity() - (ptr.addr().get() - buffer.as_ptr().addr()))
            }
            Origin::Fallback(_) => None,
        }
    }
}

/// Reads the origin of a raw block.
///
/// # Safety
///
/// `ptr` came from [`alloc_raw`] or [`alloc_fallback`] and is still in use; a
/// `Pooled` buffer returned is dropped at most once, and only when the block is given back.
pub(in crate::pool) unsafe fn origin(ptr: NonNull<u8>) -> Origin {
    // SAFETY: both writers put a `Header` right before `ptr`, in the same block (the caller's
    // contract), through `hand_out`, which exposed the block's provenance: `header_of` makes
    // a pointer with it (never one derived from `ptr`, whose object ends at `ptr`); read
    // unaligned (the pointer has only the layout's alignment).
    let header = unsafe { header_of(ptr.addr().get()).read_unaligned() };
    // SAFETY: `kind` says which field `body` holds.
    unsafe {
        match header.kind {
            FALLBACK => Origin::Fallback(header.body.fallback),
            _ => Origin::Pooled(header.body.pooled),
        }
    }
}

/// Allocates a raw block for `layout` (non-zero size, alignment at most [`MAX_ALIGN`]) from
/// `allocate` (a fallback allocator's `alloc` or `alloc_zeroed`), with a header that says
/// so: [`origin`] then tells it from a pool block. Null if `allocate` fails or the size
/// overflows.
pub(in crate::pool) fn alloc_fallback(
    layout: Layout,
    allocate: impl FnOnce(Layout) -> *mut u8,
) -> *mut u8 {
    let Some(total) = layout.size().checked_add(overhead(layout)) else {
        return std::ptr::null_mut();
    };
    let Ok(block) = Layout::from_size_align(total, layout.align()) else {
        return std::ptr::null_mut();
    };
    let base = allocate(block);
    if base.is_null() {
        return base;
    }
    let ptr = user_pointer(base, layout.align());
    // SAFETY: `ptr - base >= HEADER` and `ptr + layout.size() <= base + total`: the header
    // and the caller's bytes lie inside the fresh block, which is ours; `ptr` is derived
    // from `base`, the block's own pointer.
    unsafe {
        hand_out(
            ptr,
            Header {
                body: Body {
                    fallback: Fallback {
                        base,
                        layout: block,
                    },
                },
                kind: FALLBACK,
            },
        );
    }
    ptr
}

/// A raw block for `layout` (non-zero size, alignment at most [`MAX_ALIGN`]). With
/// `evict`, a request the budget refuses evicts values as [`BufferPool::alloc`]'s does
/// (the `Allocator` front end); without, it fails (the global allocator's front end,
/// which must not run eviction inside the process's allocator).
///
/// [`BufferPool::alloc`]: super::super::BufferPool::alloc
pub(in crate::pool) fn alloc_raw(
    this: NonNull<PoolInner>,
    layout: Layout,
    zeroed: bool,
    evict: bool,
) -> Result<NonNull<u8>, PoolError> {
    let total = layout
        .size()
        .checked_add(overhead(layout))
        .ok_or(PoolError::TooLarge {
            requested: layout.size(),
            max: class::MAX_SIZE,
        })?;
    let mut buffer = PoolInner::alloc(this, total, zeroed, evict)?;
    let colour = colour(&buffer, total, layout.align());
    let ptr = user_pointer(buffer.as_mut_ptr(), layout.align()).wrapping_add(colour);
    if zeroed && colour > 0 {
        // SAFETY: `[total, total + colour)` of the block (`colour` fits its capacity
        // past `total`), which the pool zeroed only up to `total`; the block is ours.
        unsafe { buffer.as_mut_ptr().add(total).write_bytes(0, colour) };
    }
    // SAFETY: `ptr - start >= HEADER` and `ptr + layout.size() <= start + total + colour
    // <= start + capacity`, the block's bytes, exclusively ours; `ptr` is derived from the
    // buffer's own pointer. The header goes in `[ptr - HEADER, ptr)`.
    unsafe {
        hand_out(
            ptr,
            Header {
                body: Body {
                    pooled: ManuallyDrop::new(buffer),
                },
                kind: POOLED | colour,
            },
        );
    }
    // SAFETY: `ptr` lies in the block, past its start (`HEADER` bytes at least), so it is
    // not null.
    Ok(unsafe { NonNull::new_unchecked(ptr) })
}

/// Gives back a raw pool block (for the `Allocator` front end, whose blocks are all pool
/// blocks).
///
/// # Safety
///
/// `ptr` came from [`alloc_raw`](alloc_raw) and is not used afterwards.
#[cfg(feature = "allocator-api2")]
pub(in crate::pool) unsafe fn dealloc_raw(ptr: NonNull<u8>) {
    // SAFETY: the caller's contract; the buffer is dropped once, here.
    if let Origin::Pooled(buffer) = unsafe { origin(ptr) } {
        drop(ManuallyDrop::into_inner(buffer));
    } else {
        debug_assert!(false, "a fallback block given back as a pool block");
    }
}

/// Bytes a raw pool block can hold for its caller's pointer without moving.
///
/// # Safety
///
/// `ptr` came from [`alloc_raw`](alloc_raw) and is still in use.
#[cfg(feature = "allocator-api2")]
pub(in crate::pool) unsafe fn raw_capacity(ptr: NonNull<u8>) -> usize {
    // SAFETY: the caller's contract; the copy is only looked at (never dropped).
    unsafe { origin(ptr) }.pooled_capacity(ptr).unwrap_or(0)
}

/// Records that a raw pool block now holds `new_size` bytes with alignment `align` for
/// its caller, in place (an in-place `realloc`, `grow` or `shrink`): its requested length
/// in the header and in the pool's counters, what an allocation of that layout counts.
/// Returns the caller's pointer made anew from the block's own pointer: the caller's
/// may address only its old size (see the module's docs), the one returned the whole
/// block from it on.
///
/// # Safety
///
/// `ptr` came from [`alloc_raw`](alloc_raw) and is still in use; `new_size` fits
/// the block (its pooled capacity for `ptr` is at least `new_size`), and nothing else
/// uses the block meanwhile.
pub(in crate::pool) unsafe fn resize_raw(
    ptr: NonNull<u8>,
    align: usize,
    new_size: usize,
) -> NonNull<u8> {
    // The header, through the block's provenance (see `origin`).
    let at = header_of(ptr.addr().get());
    // SAFETY: `alloc_raw` wrote the header right before `ptr`, in the same block (the
    // caller's contract); it is written back below, the block ours meanwhile.
    let mut header = unsafe { at.read_unaligned() };
    // SAFETY: a pool block's header holds its buffer.
    let buffer = unsafe { &mut *header.body.pooled };
    // The buffer's length counts the header and padding beside the caller's bytes, as
    // an allocation of `new_size` with `align` counts them (`overhead`), whatever earlier
    // resizes counted; at least what lies before the pointer (after a shrink to a smaller
    // alignment), less the colour, which the length never counts.
    let colour = header.kind & COLOUR_BITS;
    let prefix = ptr.addr().get() - buffer.as_ptr().addr() - colour;
    let overhead = HEADER.saturating_add(align - 1).max(prefix);
    let len = overhead.saturating_add(new_size);
    buffer.resize_requested(len.min(buffer.capacity()));
    let resized = buffer.as_mut_ptr().with_addr(ptr.addr().get());
    // SAFETY: the same place, in the block; the copy read above is forgotten in favour of
    // this one (the header owns the buffer).
    unsafe { at.write_unaligned(header) };
    // SAFETY: the address of `ptr`, which is not null.
    unsafe { NonNull::new_unchecked(resized) }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pool::class::{class_of, class_size};
    use crate::pool::BufferPool;

    #[test]
    fn a_colour_fits_the_block_past_the_callers_bytes() {
        let pool = BufferPool::new();
        let mut totals: Vec<usize> = (1..100).map(|k| k * 777).collect();
        for class in 0..=class_of(4 << 20).unwrap() {
            let size = class_size(class);
            totals.extend([size - 1, size, size + 1]);
            totals.extend([COLOUR_STEP, 7 * COLOUR_STEP].map(|less| size.saturating_sub(less)));
        }
        for total in totals.into_iter().filter(|&t| t > 0 && t <= 4 << 20) {
            let buffer = pool.alloc(total).unwrap();
            let offset = colour(&buffer, total, 64);
            assert_eq!(offset % COLOUR_STEP, 0, "total {total}");
            assert!(
                offset <= buffer.capacity() - total,
                "total {total}: colour {offset} in a block of {}",
                buffer.capacity()
            );
            assert_eq!(
                colour(&buffer, total, 4096),
                0,
                "none above the step's alignment"
            );
        }
    }

    #[test]
    fn raw_blocks_of_one_class_differ_in_colour_and_keep_their_bytes_in_their_block() {
        let pool = BufferPool::new();
        let layout = Layout::from_size_align(64 << 10, 64).unwrap();
        // Blocks written in full, then given back: the zeroed ones below reuse them.
        let dirty: Vec<NonNull<u8>> = (0..8)
            .map(|_| alloc_raw(pool.inner, layout, false, false).unwrap())
            .collect();
        for ptr in dirty {
            // SAFETY: from `alloc_raw`, given back once, here; the block is ours meanwhile.
            if let Origin::Pooled(mut buffer) = unsafe { origin(ptr) } {
                let (start, capacity) = (buffer.as_mut_ptr(), buffer.capacity());
                // SAFETY: the whole block; the header is not read again.
                unsafe { start.write_bytes(0xAA, capacity) };
                drop(ManuallyDrop::into_inner(buffer));
            }
        }
        let blocks: Vec<NonNull<u8>> = (0..8)
            .map(|_| alloc_raw(pool.inner, layout, true, false).unwrap())
            .collect();
        // Where each caller's pointer sits in its block (the blocks themselves may sit
        // anywhere in their pages, wherever the system put them).
        let mut offsets: Vec<usize> = blocks
            .iter()
            .map(|&ptr| {
                // SAFETY: from `alloc_raw`, in use; the copy is only looked at.
                let origin = unsafe { origin(ptr) };
                match origin {
                    Origin::Pooled(buffer) => ptr.as_ptr() as usize - buffer.as_ptr() as usize,
                    Origin::Fallback(_) => unreachable!("a pool block"),
                }
            })
            .collect();
        offsets.sort_unstable();
        offsets.dedup();
        assert!(offsets.len() >= 4, "offsets within the blocks: {offsets:?}");
        let zeros = vec![0u8; layout.size()];
        for &ptr in &blocks {
            // SAFETY: from `alloc_raw`, in use; the copy is only looked at.
            let capacity = unsafe { origin(ptr) }.pooled_capacity(ptr).unwrap();
            assert!(
                capacity >= layout.size(),
                "{capacity} for {}",
                layout.size()
            );
            // SAFETY: `layout.size()` zeroed bytes from `ptr` (asked for zeroed).
            let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), layout.size()) };
            assert!(bytes == zeros, "a zeroed block's bytes are zero");
        }
        for ptr in blocks {
            // SAFETY: from `alloc_raw`, given back once.
            if let Origin::Pooled(buffer) = unsafe { origin(ptr) } {
                drop(ManuallyDrop::into_inner(buffer));
            }
        }
        assert_eq!(pool.stats().in_use_bytes, 0);
    }
}
