//! Memory advice for large blocks fresh from the system: transparent huge pages and
//! pre-faulting (Linux `madvise`; elsewhere pre-faulting touches each page).

const PAGE: usize = 4096;

/// Applies the configured advice to the block `[addr, addr + len)`.
///
/// # Safety
///
/// `addr` points to a block of `len` bytes that the caller owns and has not handed out
/// (with pre-faulting and no `madvise`, a zero is written to each of its pages), with the
/// block's provenance.
pub(in crate::pool) unsafe fn advise(addr: *mut u8, len: usize, huge_pages: bool, prefault: bool) {
    // The whole pages inside the block, as offsets from `addr` (the pointer keeps its
    // provenance).
    let first = addr.addr().next_multiple_of(PAGE) - addr.addr();
    let last = ((addr.addr() + len) & !(PAGE - 1)).saturating_sub(addr.addr());
    if last <= first {
        return;
    }
    // SAFETY: `first < last <= len`: inside the caller's block.
    let start = unsafe { addr.add(first) };
    let populated = platform::advise(start, last - first, huge_pages, prefault);
    if prefault && !populated {
        // Write one zero byte per page: the block is ours, its contents are unspecified
        // (a zeroed block stays zeroed).
        for offset in (0..len).step_by(PAGE) {
            // SAFETY: `offset < len`, inside the caller's block.
            unsafe { addr.add(offset).write_volatile(0) };
        }
    }
}

#[cfg(all(target_os = "linux", not(miri)))]
mod platform {
    /// Returns whether the kernel populated the range.
    pub(in crate::pool) fn advise(
        start: *mut u8,
        len: usize,
        huge_pages: bool,
        prefault: bool,
    ) -> bool {
        let range = start.cast::<libc::c_void>();
        if huge_pages {
            // Advice only: failure (THP off, or an old kernel) leaves ordinary pages.
            // SAFETY: a page-aligned range inside a block the caller owns; madvise with
            // MADV_HUGEPAGE changes no contents.
            let _ = unsafe { libc::madvise(range, len, libc::MADV_HUGEPAGE) };
        }
        // SAFETY: as above; MADV_POPULATE_WRITE faults the pages in without changing contents.
        prefault && unsafe { libc::madvise(range, len, libc::MADV_POPULATE_WRITE) } == 0
    }
}

/// Elsewhere (and under Miri, which cannot call `madvise`): no advice; pre-faulting touches
/// each page.
#[cfg(any(not(target_os = "linux"), miri))]
mod platform {
    pub(in crate::pool) fn advise(_: *mut u8, _: usize, _: bool, _: bool) -> bool {
        false
    }
}
