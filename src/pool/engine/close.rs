//! A pool's close protocol: the control block is freed by whoever finishes last, the close
//! (when the last handle drops) or the drop of the last buffer still alive then.
//!
//! # Protocol
//!
//! Before the close, nothing counts live buffers in a shared place: each thread counts the
//! blocks it hands out and gives back in its own cache. The close then:
//!
//! 1. sets `closed` and issues a heavy asymmetric fence, so every operation that starts
//!    afterwards sees the pool closed (see `cache`);
//! 2. waits, cache by cache, for the one operation the owner may be running (a few
//!    instructions; it never waits for a thread to come back), so that every operation that
//!    saw the pool open has ended;
//! 3. sums the caches' counters: `live` blocks are still out;
//! 4. releases every cached block (bins and lists) to the system, and adds `live` to
//!    `remaining`.
//!
//! A buffer dropped after it sees the pool closed releases its block to the system and
//! subtracts one from `remaining` as its very last access to the pool. Those frees may come
//! before step 4 (then `remaining` is negative for a while) or after; either way `remaining`
//! reaches zero exactly once, after the close and every live buffer are done, and whoever
//! brings it there frees the control block. `live` counts exactly the blocks that will take
//! that path: the frees that saw the pool open ended before step 3 and are in the counters.

use std::alloc::Layout;
use std::ptr::{addr_of_mut, NonNull};

use super::cache::ThreadCaches;
use super::inner::PoolInner;
use super::lifecycle::Lifecycle;
use super::lists::SharedLists;
use super::memory::Memory;
use crate::identity::next_identity;
use crate::pool::config::PoolConfig;
use crate::pool::eviction::registry::Evictor;
use crate::pool::observe::books::Books;
use crate::sync::{asymmetric, system, Ordering};

/// Control blocks allocated and not yet freed, in the whole process. Bookkeeping outside any
/// protocol (it counts, it synchronises nothing), hence `std`'s atomic even under loom.
static ALIVE: crate::sync::Tally = crate::sync::Tally::new(0);

/// See [`BufferPool::pools_alive`](crate::pool::BufferPool::pools_alive).
pub(in crate::pool) fn alive() -> usize {
    ALIVE.get() as usize
}

/// A new pool's control block, in memory of its own from the system allocator (never the
/// global allocator, which may be ferropool's own front end). Built in place: it holds a
/// list head per size class and is too large to build on a small stack first.
pub(in crate::pool) fn allocate_control_block(
    config: PoolConfig,
    system_blocks: bool,
) -> NonNull<PoolInner> {
    let layout = Layout::new::<PoolInner>();
    // SAFETY: `PoolInner` is not zero-sized.
    let raw = unsafe { system::alloc(layout) }.cast::<PoolInner>();
    let Some(ptr) = NonNull::new(raw) else {
        std::alloc::handle_alloc_error(layout);
    };
    let p = ptr.as_ptr();
    // SAFETY: `p` is fresh memory for one `PoolInner`; each field is written exactly once,
    // through raw pointers (no reference to the uninitialised whole is made), and the array
    // fields element by element.
    unsafe {
        addr_of_mut!((*p).id).write(next_identity().get());
        addr_of_mut!((*p).caches).write(ThreadCaches::new(config.cached_classes()));
        addr_of_mut!((*p).memory).write(Memory::new(&config, system_blocks));
        addr_of_mut!((*p).books).write(Books::new(config.trace_capacity));
        addr_of_mut!((*p).config).write(config);
        addr_of_mut!((*p).life).write(Lifecycle::new());
        SharedLists::init(addr_of_mut!((*p).lists));
        addr_of_mut!((*p).evictor).write(Evictor::new());
    }
    // Every field is written above: this exhaustive pattern stops compiling when a field is
    // added to `PoolInner`, until it is listed here (and written above).
    let _every_field_written = |inner: PoolInner| {
        let PoolInner {
            id: _,
            config: _,
            life: _,
            memory: _,
            lists: _,
            caches: _,
            books: _,
            evictor: _,
        } = inner;
    };
    ALIVE.add(1);
    ptr
}

/// Drops and frees a control block.
///
/// # Safety
///
/// `pool` came from [`allocate_control_block`], and nothing refers to it any more: every handle
/// is gone, and `remaining` reached zero (no live buffer, the close done).
pub(in crate::pool) unsafe fn destroy(pool: NonNull<PoolInner>) {
    // SAFETY: the caller's contract: last reference to a block from `allocate_control_block`.
    unsafe {
        pool.as_ptr().drop_in_place();
        system::dealloc(pool.as_ptr().cast(), Layout::new::<PoolInner>());
    }
    ALIVE.sub(1);
}

/// Closes the pool (steps 1 to 4 above), and frees its control block if no buffer is alive.
///
/// # Safety
///
/// The last handle of `pool` was just dropped, and the close runs once.
pub(in crate::pool) unsafe fn close(pool: NonNull<PoolInner>) {
    let last = {
        // SAFETY: the pool is alive: `remaining` cannot reach zero before this close adds
        // the live count.
        let inner = unsafe { pool.as_ref() };
        inner.life.mark_closed();
        asymmetric::heavy();
        // Every operation that saw the pool open ends here, so the counts below are final.
        inner.caches.for_each(|cache| cache.wait_out());
        inner.life.wait_out_cacheless();
        let totals = inner
            .caches
            .op_totals(inner.books.cacheless(), Ordering::Acquire);
        let (allocations, frees) = (totals.allocations(), totals.frees);
        // Every owner is out and sees the pool closed: no second heavy fence is needed.
        inner.release_cached_fenced(false);
        inner.memory.trim_pages();
        let live = allocations.wrapping_sub(frees) as i64;
        inner.life.add_live(live)
    };
    if last {
        // SAFETY: no handle is left and no buffer is alive (`remaining` is zero).
        unsafe { destroy(pool) };
    }
}

/// A free after the close, last step: tells the pool one buffer less is out, and frees the
/// pool if that was the last one (and the close is done).
///
/// # Safety
///
/// `pool` is alive, the caller's buffer is one of those counted in `remaining` (its block
/// released by the free that saw the pool closed), and the caller holds no reference into the
/// pool: from the decrement on, this call or another thread's may free it.
pub(in crate::pool) unsafe fn count_out(pool: NonNull<PoolInner>) {
    // SAFETY: the pool is alive until the decrement (the caller's buffer is counted), and
    // `drop_remaining` makes no reference but to the counter itself.
    if unsafe { Lifecycle::drop_remaining(std::ptr::addr_of!((*pool.as_ptr()).life)) } {
        // SAFETY: no handle is left and no buffer is alive (`remaining` is zero).
        unsafe { destroy(pool) };
    }
}
