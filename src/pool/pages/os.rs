//! The page layer's calls to the OS: map a segment, unmap it, purge pages of it, withdraw
//! huge-page advice from it.
//!
//! On Linux: anonymous private `mmap`, `munmap`, `madvise(MADV_DONTNEED)`, after which the
//! pages are no longer resident and read as zeros, and `madvise(MADV_NOHUGEPAGE)`. Elsewhere,
//! under Miri and under loom: segments from the system allocator (zeroed; loom tracks them,
//! so a model that strands one fails), and a purge writes zeros, which keeps the contract (a
//! purged page reads as zeros) without returning memory.

/// The page size the layer works in: every segment, range and block is a multiple of it.
pub(crate) const PAGE: usize = 4096;

#[cfg(all(target_os = "linux", not(miri), not(loom)))]
mod platform {
    use std::ptr::NonNull;

    pub(crate) fn map(len: usize) -> Option<NonNull<u8>> {
        // SAFETY: a new anonymous private mapping; it aliases nothing.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(addr.cast())
    }

    /// # Safety
    ///
    /// `[addr, addr + len)` is a whole segment from [`map`], and nothing uses it afterwards.
    pub(crate) unsafe fn unmap(addr: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract.
        let done = unsafe { libc::munmap(addr.as_ptr().cast(), len) };
        debug_assert_eq!(done, 0, "munmap of a segment failed");
    }

    /// # Safety
    ///
    /// `[addr, addr + len)` is page-aligned, inside a segment from [`map`], and no one uses
    /// its contents (they become zeros).
    pub(crate) unsafe fn purge(addr: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract; MADV_DONTNEED on private anonymous memory drops the
        // pages, which read as zeros afterwards.
        let done = unsafe { libc::madvise(addr.as_ptr().cast(), len, libc::MADV_DONTNEED) };
        debug_assert_eq!(done, 0, "madvise(MADV_DONTNEED) failed");
    }

    /// # Safety
    ///
    /// `[addr, addr + len)` is a whole segment from [`map`].
    pub(crate) unsafe fn no_huge_pages(addr: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract; MADV_NOHUGEPAGE changes no contents (advice only:
        // a kernel without transparent huge pages refuses it, which changes nothing).
        let _ = unsafe { libc::madvise(addr.as_ptr().cast(), len, libc::MADV_NOHUGEPAGE) };
    }
}

#[cfg(any(not(target_os = "linux"), miri, loom))]
mod platform {
    use std::alloc::Layout;
    use std::ptr::NonNull;

    use super::PAGE;
    use crate::sync::system;

    pub(crate) fn map(len: usize) -> Option<NonNull<u8>> {
        let layout = Layout::from_size_align(len, PAGE).ok()?;
        // SAFETY: `len` is above 0 (a segment holds at least one page).
        NonNull::new(unsafe { system::alloc_zeroed(layout) })
    }

    /// # Safety
    ///
    /// `[addr, addr + len)` is a whole segment from [`map`], and nothing uses it afterwards.
    pub(crate) unsafe fn unmap(addr: NonNull<u8>, len: usize) {
        let layout = Layout::from_size_align(len, PAGE).expect("mapped with this layout");
        // SAFETY: the caller's contract: allocated by `map` with this layout.
        unsafe { system::dealloc(addr.as_ptr(), layout) };
    }

    /// # Safety
    ///
    /// `[addr, addr + len)` is inside a segment from [`map`], and no one uses its contents.
    pub(crate) unsafe fn purge(addr: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract: the range is ours and unused.
        unsafe { addr.as_ptr().write_bytes(0, len) };
    }

    /// # Safety
    ///
    /// `[addr, addr + len)` is a whole segment from [`map`]. (No advice here.)
    pub(crate) unsafe fn no_huge_pages(_: NonNull<u8>, _: usize) {}
}

pub(crate) use platform::{map, no_huge_pages, purge, unmap};
