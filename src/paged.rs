//! `PagedTable<T>`: a table indexed by `u32` whose pages are allocated on demand and double in
//! size, so that an index finds its page with one `leading_zeros` and a page, once allocated,
//! never moves. The arena keeps its slots and list links in such tables, the pool its block
//! records.

use std::alloc::Layout;
use std::ptr::{self, NonNull};

use crate::sync::{system, AtomicPtr, Ordering};

/// A table of up to `u32::MAX` elements in doubling pages: page `k` holds `first << k`
/// elements and starts at index `(first << k) - first`.
pub(crate) struct PagedTable<T> {
    /// `log2` of the length of page 0.
    shift: u32,
    /// Pages in use: enough that the last one reaches index `u32::MAX - 1`.
    page_count: usize,
    /// Page `k`, or null.
    ///
    /// Invariant: a non-null page came from [`allocate`] with `page_len(k)` initialised
    /// elements and stays allocated until [`take_page`](Self::take_page) hands it to a
    /// caller or the table drops; so a reference obtained through `&self` stays valid while
    /// no `take_page` runs, and callers of `take_page` keep their own readers safe (the
    /// arena defers the free past an epoch grace period).
    pages: [AtomicPtr<T>; MAX_PAGES],
}

/// Where an element lies in a [`PagedTable`]: its page, and its offset in the page.
pub(crate) type Place = (usize, usize);

/// Pages of a table whose first page holds one element (the most any table needs).
const MAX_PAGES: usize = 33;

/// A page taken out of a table: its elements, owned by whoever holds this.
pub(crate) struct Page<T> {
    base: NonNull<T>,
    len: usize,
}

// SAFETY: a `Page` owns its elements as a `Box<[T]>` would.
unsafe impl<T: Send> Send for Page<T> {}

impl<T> Page<T> {
    /// The elements.
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: `base` holds `len` initialised elements owned by `self` (see `take_page`).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }
}

impl<T> Drop for Page<T> {
    fn drop(&mut self) {
        // SAFETY: from `allocate` with this length (invariant on `PagedTable::pages`), and
        // owned by `self` alone.
        unsafe { free(self.base.as_ptr(), self.len) };
    }
}

/// A page of `len` elements, `init(offset)` each, from the system allocator (never the global
/// allocator, which may be ferropool's own front end). Aborts the process if the system
/// refuses the memory, as `Box::new` does (see [`try_allocate`]).
pub(crate) fn allocate<T>(len: usize, init: impl FnMut(usize) -> T) -> *mut T {
    try_allocate(len, init).unwrap_or_else(|refused| refused.end_process())
}

/// The system refused a page: its layout, or `None` if its size does not fit in `isize`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refused(Option<Layout>);

impl Refused {
    /// Ends the process as a refused `Box::new` does (or panics, for a size past `isize`).
    #[cold]
    fn end_process(self) -> ! {
        match self.0 {
            Some(layout) => std::alloc::handle_alloc_error(layout),
            None => panic!("a page's size does not fit in isize"),
        }
    }
}

/// [`allocate`], with a refusal returned instead of ending the process.
pub(crate) fn try_allocate<T>(
    len: usize,
    mut init: impl FnMut(usize) -> T,
) -> Result<*mut T, Refused> {
    let layout = Layout::array::<T>(len).map_err(|_| Refused(None))?;
    if layout.size() == 0 {
        return Ok(NonNull::dangling().as_ptr());
    }
    // SAFETY: the layout has a non-zero size.
    let base = unsafe { system::alloc(layout) }.cast::<T>();
    if base.is_null() {
        return Err(Refused(Some(layout)));
    }
    for offset in 0..len {
        // SAFETY: `offset < len`, inside the fresh allocation, written once.
        unsafe { base.add(offset).write(init(offset)) };
    }
    Ok(base)
}

/// Makes `at` point to an array of `len` elements (`init(offset)` each, from [`allocate`])
/// unless it points to one already: another thread may win the race, and then its array
/// stays and ours is dropped. `at` must only ever hold null or such an array.
pub(crate) fn publish_once<T>(at: &AtomicPtr<T>, len: usize, init: impl FnMut(usize) -> T) {
    if let Err(refused) = try_publish_once(at, len, init) {
        refused.end_process();
    }
}

/// [`publish_once`], with a refusal returned instead of ending the process (`at` is then
/// left as it was).
pub(crate) fn try_publish_once<T>(
    at: &AtomicPtr<T>,
    len: usize,
    init: impl FnMut(usize) -> T,
) -> Result<(), Refused> {
    if !at.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    let fresh = try_allocate(len, init)?;
    if at
        .compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // SAFETY: `fresh` came from `try_allocate` above with this length and was never
        // published, so it is still ours alone.
        unsafe { free(fresh, len) };
    }
    Ok(())
}

/// Drops and frees a page from [`allocate`].
///
/// # Safety
///
/// `base` came from `allocate::<T>(len, ..)` and nothing uses the page afterwards.
pub(crate) unsafe fn free<T>(base: *mut T, len: usize) {
    // SAFETY: `len` initialised elements (the caller's contract).
    unsafe { ptr::drop_in_place(ptr::slice_from_raw_parts_mut(base, len)) };
    let layout = Layout::array::<T>(len).expect("page sizes fit in isize");
    if layout.size() != 0 {
        // SAFETY: allocated with this layout by `allocate`.
        unsafe { system::dealloc(base.cast(), layout) };
    }
}

impl<T> PagedTable<T> {
    /// An empty table whose first page holds `first_page_len` elements (a power of two).
    pub(crate) fn new(first_page_len: u32) -> Self {
        debug_assert!(first_page_len.is_power_of_two());
        let shift = first_page_len.trailing_zeros();
        Self {
            shift,
            page_count: MAX_PAGES - shift as usize,
            pages: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
        }
    }

    /// The number of pages the table can have.
    pub(crate) fn page_count(&self) -> usize {
        self.page_count
    }

    #[inline(always)]
    fn first_page_len(&self) -> u64 {
        1 << self.shift
    }

    /// Page number and offset of `index`.
    #[inline(always)]
    pub(crate) fn locate(&self, index: u32) -> Place {
        let shifted = u64::from(index) + self.first_page_len();
        let page = (63 - shifted.leading_zeros() - self.shift) as usize;
        let offset = (shifted - (self.first_page_len() << page)) as usize;
        (page, offset)
    }

    /// The first index of page `page`.
    pub(crate) fn page_start(&self, page: usize) -> u64 {
        (self.first_page_len() << page) - self.first_page_len()
    }

    /// Elements in page `page`.
    pub(crate) fn page_len(&self, page: usize) -> usize {
        (self.first_page_len() << page) as usize
    }

    /// Whether page `page` is allocated.
    pub(crate) fn has_page(&self, page: usize) -> bool {
        !self.pages[page].load(Ordering::Acquire).is_null()
    }

    /// The elements of page `page`, if it is allocated.
    #[inline]
    pub(crate) fn page(&self, page: usize) -> Option<&[T]> {
        let base = self.pages[page].load(Ordering::Acquire);
        // SAFETY: a non-null page holds `page_len(page)` elements and stays allocated while
        // `&self` lives and no `take_page` hands it out (invariant on `pages`).
        (!base.is_null()).then(|| unsafe { std::slice::from_raw_parts(base, self.page_len(page)) })
    }

    /// The element at `index`, if its page is allocated.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        // SAFETY: this table's own `locate`.
        unsafe { self.get_place(self.locate(index)) }
    }

    /// The element at `place`, a [`Place`] that [`locate`](Self::locate) gave, of this table
    /// or of another one with the same first page length (tables laid out alike share one
    /// `locate` this way), if its page is allocated.
    ///
    /// # Safety
    ///
    /// `place` came from `locate` on a table whose first page holds as many elements as
    /// this one's, so that its offset lies within its page.
    #[inline]
    pub(crate) unsafe fn get_place(&self, (page, offset): Place) -> Option<&T> {
        let base = self.pages[page].load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        debug_assert!(offset < self.page_len(page), "a place from another layout");
        // SAFETY: `offset < page_len(page)` (the caller's contract: `locate` on a table of
        // this layout), and the page stays allocated while `&self` lives and no `take_page`
        // hands it out (invariant on `pages`).
        Some(unsafe { &*base.add(offset) })
    }

    /// [`get_place`](Self::get_place) where the caller knows the page to be allocated.
    ///
    /// # Safety
    ///
    /// As for `get_place`.
    ///
    /// # Panics
    ///
    /// If the page is not allocated, which is a bug in the caller.
    #[inline]
    pub(crate) unsafe fn at_place(&self, place: Place) -> &T {
        // SAFETY: the caller's contract, passed on.
        match unsafe { self.get_place(place) } {
            Some(element) => element,
            None => unallocated_page(place.0),
        }
    }

    /// Whether `other` lays its elements out as this table does (the same first page
    /// length), so that a place one's `locate` gives is valid in the other.
    pub(crate) fn same_layout<U>(&self, other: &PagedTable<U>) -> bool {
        self.shift == other.shift
    }

    /// The element at `index`, whose page the caller knows to be allocated.
    ///
    /// # Panics
    ///
    /// If the page is not allocated, which is a bug in the caller.
    #[inline]
    pub(crate) fn at(&self, index: u32) -> &T {
        // SAFETY: this table's own `locate`.
        unsafe { self.at_place(self.locate(index)) }
    }

    /// Allocates page `page` with `init(offset)` for each element unless it is allocated
    /// already (another thread may win the race: then its page stays and ours is dropped).
    pub(crate) fn ensure_page(&self, page: usize, init: impl FnMut(usize) -> T) {
        publish_once(&self.pages[page], self.page_len(page), init);
    }

    /// [`ensure_page`](Self::ensure_page), with a refusal of the memory returned (the page
    /// is then still unallocated) instead of ending the process.
    pub(crate) fn try_ensure_page(
        &self,
        page: usize,
        init: impl FnMut(usize) -> T,
    ) -> Result<(), Refused> {
        try_publish_once(&self.pages[page], self.page_len(page), init)
    }

    /// Unlinks page `page` and hands it to the caller, or `None` if it is not allocated.
    ///
    /// # Safety
    ///
    /// References into the page obtained earlier through `&self` may still be in use: the
    /// caller must keep the returned page alive until none is (the arena waits out every
    /// thread-cache operation in flight and then defers its drop past an epoch grace
    /// period, or holds exclusive access).
    pub(crate) unsafe fn take_page(&self, page: usize) -> Option<Page<T>> {
        let base = self.pages[page].swap(ptr::null_mut(), Ordering::AcqRel);
        NonNull::new(base).map(|base| Page {
            base,
            len: self.page_len(page),
        })
    }

    /// Elements in allocated pages.
    pub(crate) fn allocated(&self) -> u64 {
        (0..self.page_count)
            .filter(|&k| self.has_page(k))
            .map(|k| self.page_len(k) as u64)
            .sum()
    }
}

#[cold]
#[inline(never)]
fn unallocated_page(page: usize) -> ! {
    panic!("internal error: page {page} of a paged table is not allocated")
}

impl<T> Drop for PagedTable<T> {
    fn drop(&mut self) {
        for page in 0..self.page_count {
            // SAFETY: `&mut self`: no reference into the table remains.
            drop(unsafe { self.take_page(page) });
        }
    }
}

impl<T> std::fmt::Debug for PagedTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedTable")
            .field("first_page_len", &self.first_page_len())
            .field("allocated", &self.allocated())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn locate_maps_indices_to_doubling_pages() {
        let table: PagedTable<u8> = PagedTable::new(4);
        assert_eq!(table.locate(0), (0, 0));
        assert_eq!(table.locate(3), (0, 3));
        assert_eq!(table.locate(4), (1, 0));
        assert_eq!(table.locate(11), (1, 7));
        assert_eq!(table.locate(12), (2, 0));
        let (last_page, _) = table.locate(u32::MAX - 1);
        assert!(last_page < table.page_count());
        for k in 0..table.page_count() {
            assert_eq!(table.locate(table.page_start(k) as u32), (k, 0));
        }
        let table: PagedTable<u8> = PagedTable::new(1);
        assert_eq!(table.locate(0), (0, 0));
        assert_eq!(table.locate(1), (1, 0));
        assert!(table.locate(u32::MAX - 1).0 < table.page_count());
    }

    /// A place from `locate` of one table is in range in every table of the same first page
    /// length (what `get_place` and `at_place` rely on), for every length an arena accepts,
    /// at every page's edges and at the top of the index space.
    #[test]
    fn a_place_fits_every_table_of_its_layout() {
        for shift in 0..=16u32 {
            let len = 1u32 << shift;
            let a: PagedTable<u8> = PagedTable::new(len);
            let b: PagedTable<u64> = PagedTable::new(len);
            assert!(a.same_layout(&b));
            let mut probes = vec![0u32, 1, u32::MAX - 1, u32::MAX, u32::MAX - 2];
            for k in 0..a.page_count() {
                let start = a.page_start(k);
                for d in [-1i64, 0, 1] {
                    let i = start as i64 + d;
                    if (0..=u32::MAX as i64).contains(&i) {
                        probes.push(i as u32);
                    }
                }
                let end = start + a.page_len(k) as u64 - 1;
                if end <= u64::from(u32::MAX) {
                    probes.push(end as u32);
                }
            }
            for i in probes {
                let (page, offset) = a.locate(i);
                assert!(page < a.page_count(), "len {len} index {i}: page {page}");
                assert!(page < b.page_count());
                assert!(offset < a.page_len(page), "len {len} index {i}");
                assert_eq!(b.locate(i), (page, offset));
                assert_eq!(a.page_start(page) + offset as u64, u64::from(i));
            }
            // The last usable index (u32::MAX - 1) lies in the last page.
            assert!(a.locate(u32::MAX - 1).0 < a.page_count());
            // Allocated in one, not the other: `get_place` says None instead of reading.
            a.ensure_page(1, |_| 7);
            let place = a.locate(a.page_start(1) as u32 + (a.page_len(1) as u32 - 1));
            // SAFETY: (test) same layout.
            assert_eq!(unsafe { a.get_place(place) }, Some(&7));
            // SAFETY: (test) same layout.
            assert!(unsafe { b.get_place(place) }.is_none());
            if len == 1 << 16 {
                assert!(!PagedTable::<u8>::new(1).same_layout(&a));
            }
        }
    }

    #[test]
    fn pages_are_allocated_once_and_taken_whole() {
        let table: PagedTable<u32> = PagedTable::new(2);
        assert!(table.get(5).is_none());
        table.ensure_page(1, |offset| offset as u32 + 10);
        table.ensure_page(1, |_| 99); // already there: kept
        assert_eq!(*table.at(2), 10);
        assert_eq!(*table.at(5), 13);
        assert_eq!(table.allocated(), 4);
        // SAFETY: (test) no reference into page 1 is alive.
        let page = unsafe { table.take_page(1) }.unwrap();
        assert_eq!(page.as_slice(), &[10, 11, 12, 13]);
        assert!(table.get(2).is_none());
        table.ensure_page(1, |_| 7);
        assert_eq!(*table.at(2), 7, "a page taken can be allocated again");
        drop(page);
    }
}
