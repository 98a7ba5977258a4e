//! A per-step scratch arena on bumpalo for short-lived small allocations, reset in O(1).

/// A bump arena for a replay step's short-lived allocations (for example the spine of a
/// chain while it is copied). Allocation is a pointer bump; [`reset`](Self::reset) frees
/// everything at once and keeps the memory for the next step.
///
/// ```
/// use ferropool::ScratchArena;
/// let mut scratch = ScratchArena::new();
/// let squares = scratch.alloc_slice_fill_iter((1..5).map(|i| i * i));
/// assert_eq!(squares, &[1, 4, 9, 16]);
/// scratch.reset(); // O(1); the chunk is kept
/// assert_eq!(scratch.allocated_bytes_in_use(), 0);
/// ```
#[derive(Debug, Default)]
pub struct ScratchArena {
    bump: bumpalo::Bump,
}

impl ScratchArena {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// An arena with room for `bytes` before it needs another chunk.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            bump: bumpalo::Bump::with_capacity(bytes),
        }
    }

    /// Copies `items` into the arena.
    pub fn alloc_slice_copy<T: Copy>(&self, items: &[T]) -> &mut [T] {
        self.bump.alloc_slice_copy(items)
    }

    /// Collects an iterator of known length into the arena.
    pub fn alloc_slice_fill_iter<T, I>(&self, items: I) -> &mut [T]
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: ExactSizeIterator,
    {
        self.bump.alloc_slice_fill_iter(items)
    }

    /// A slice of `len` items, item `i` being `f(i)`.
    pub fn alloc_slice_fill_with<T>(&self, len: usize, f: impl FnMut(usize) -> T) -> &mut [T] {
        self.bump.alloc_slice_fill_with(len, f)
    }

    /// Frees everything allocated since the last reset, in O(1) (values are not dropped:
    /// keep only types without drop glue here).
    pub fn reset(&mut self) {
        self.bump.reset();
    }

    /// Bytes handed out since the last reset.
    pub fn allocated_bytes_in_use(&self) -> usize {
        self.bump.allocated_bytes() - self.bump.chunk_capacity()
    }

    /// Bytes of memory the arena holds.
    pub fn capacity_bytes(&self) -> usize {
        self.bump.allocated_bytes()
    }
}
