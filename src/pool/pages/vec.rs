//! `SysVec<T>`: a growable array of `Copy` elements whose storage comes from the system
//! allocator directly. The page layer keeps its ranges and segments in it: it runs inside
//! the process's global allocator when the pool is ferropool's front end, so its own
//! bookkeeping must not allocate through that allocator (a `Vec` would recurse into it).

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::sync::system;

/// The system refused the memory a `SysVec` needed to grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exhausted;

/// A growable array of `T` in memory from [`system`].
pub(crate) struct SysVec<T: Copy> {
    /// Invariant: `cap` elements allocated from `system::alloc` with `Layout::array::<T>(cap)`
    /// when `cap > 0` (dangling otherwise); the first `len` are initialised.
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
}

// SAFETY: a `SysVec` owns its elements as a `Vec` does.
unsafe impl<T: Copy + Send> Send for SysVec<T> {}
// SAFETY: shared access only reads.
unsafe impl<T: Copy + Sync> Sync for SysVec<T> {}

impl<T: Copy> SysVec<T> {
    pub(crate) const fn new() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
            cap: 0,
        }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: the first `len` elements are initialised (invariant on `ptr`); a dangling,
        // aligned pointer is valid for an empty slice.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_slice_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Makes room for one more element.
    fn reserve_one(&mut self) -> Result<(), Exhausted> {
        if self.len < self.cap {
            return Ok(());
        }
        let cap = self.cap.checked_mul(2).ok_or(Exhausted)?.max(16);
        let layout = Layout::array::<T>(cap).map_err(|_| Exhausted)?;
        // SAFETY: `layout` has a non-zero size (`cap >= 16` and `T` is not zero-sized: the
        // layer's elements are plain records).
        let fresh = NonNull::new(unsafe { system::alloc(layout) }.cast::<T>()).ok_or(Exhausted)?;
        if self.cap > 0 {
            // SAFETY: the old storage holds `len` initialised elements and the new one room
            // for `cap > len`; two distinct allocations do not overlap. The old one came from
            // `system::alloc` with this layout (invariant on `ptr`).
            unsafe {
                fresh
                    .as_ptr()
                    .copy_from_nonoverlapping(self.ptr.as_ptr(), self.len);
                system::dealloc(
                    self.ptr.as_ptr().cast(),
                    Layout::array::<T>(self.cap).expect("the layout it was allocated with"),
                );
            }
        }
        self.ptr = fresh;
        self.cap = cap;
        Ok(())
    }

    /// Inserts `value` at `index` (at most `len`), moving the later elements up.
    pub(crate) fn insert(&mut self, index: usize, value: T) -> Result<(), Exhausted> {
        assert!(index <= self.len, "insert past the end");
        self.reserve_one()?;
        // SAFETY: `index <= len < cap`: moving `len - index` elements up by one stays in the
        // allocation, and slot `index` is then written.
        unsafe {
            let at = self.ptr.as_ptr().add(index);
            at.copy_to(at.add(1), self.len - index);
            at.write(value);
        }
        self.len += 1;
        Ok(())
    }

    /// Removes the element at `index` (below `len`), moving the later elements down.
    pub(crate) fn remove(&mut self, index: usize) -> T {
        assert!(index < self.len, "remove past the end");
        // SAFETY: `index < len`: the element is initialised, and the `len - index - 1` after
        // it move down by one within the initialised part.
        unsafe {
            let at = self.ptr.as_ptr().add(index);
            let value = at.read();
            at.copy_from(at.add(1), self.len - index - 1);
            self.len -= 1;
            value
        }
    }
}

impl<T: Copy> Drop for SysVec<T> {
    fn drop(&mut self) {
        if self.cap > 0 {
            // SAFETY: allocated by `reserve_one` with this layout (invariant on `ptr`); the
            // elements are `Copy`, so nothing needs dropping.
            unsafe {
                system::dealloc(
                    self.ptr.as_ptr().cast(),
                    Layout::array::<T>(self.cap).expect("the layout it was allocated with"),
                );
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::SysVec;

    #[test]
    fn inserts_and_removes_keep_the_order() {
        let mut v = SysVec::<u64>::new();
        for i in 0..100 {
            v.insert(v.as_slice().len(), i * 2).unwrap();
        }
        v.insert(0, 1).unwrap();
        v.insert(50, 3).unwrap();
        assert_eq!(v.as_slice().len(), 102);
        assert_eq!(v.remove(50), 3);
        assert_eq!(v.remove(0), 1);
        let expected: Vec<u64> = (0..100).map(|i| i * 2).collect();
        assert_eq!(v.as_slice(), expected.as_slice());
    }
}
