//! `PoolBuffer`: an aligned byte buffer from a pool, which gives itself back when dropped.

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use super::blocks::Record;
use super::inner::{Handout, PoolInner};
use crate::pool::class;
use crate::pool::error::PoolError;

/// An aligned byte buffer from a [`BufferPool`](crate::pool::BufferPool); it returns itself to the
/// pool when dropped, from any thread.
///
/// Its bytes start uninitialised (unless it came from
/// [`alloc_zeroed`](crate::pool::BufferPool::alloc_zeroed)): write them through
/// [`as_uninit_mut`](Self::as_uninit_mut) or [`fill`](Self::fill), after which
/// [`as_bytes`](Self::as_bytes) gives them back.
///
/// ```
/// let pool = ferropool::BufferPool::new();
/// let mut buffer = pool.alloc(8)?;
/// buffer.copy_from_slice(&42u64.to_le_bytes())?;
/// assert_eq!(buffer.as_bytes(), Some(&42u64.to_le_bytes()[..]));
/// std::thread::scope(|s| {
///     s.spawn(move || drop(buffer)); // given back from another thread
/// });
/// assert_eq!(pool.stats().in_use_bytes, 0);
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[repr(transparent)]
pub struct PoolBuffer {
    /// The block, as the engine holds it (a buffer is its block and nothing more: an
    /// evictable value keeps the same block while resident, see [`Handout`]).
    block: Handout,
}

impl PoolBuffer {
    /// Makes the buffer's requested length `len` (at most its capacity), for an in-place
    /// reallocation of a raw block: the block's record and the pool's counters follow, so
    /// `requested_bytes` and snapshots report the new size.
    pub(in crate::pool) fn resize_requested(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        self.block.resize_requested(len);
    }

    /// The block's record, whose address tells blocks apart (a raw block's colour).
    #[inline(always)]
    pub(in crate::pool) fn record_ptr(&self) -> NonNull<Record> {
        self.block.record()
    }

    /// The buffer over a block just handed out.
    #[inline(always)]
    pub(in crate::pool) fn from_block(block: Handout) -> Self {
        Self { block }
    }

    /// The block, for an evictable value to keep while resident.
    pub(in crate::pool) fn into_block(self) -> Handout {
        self.block
    }

    /// The buffer whose block an evictable value keeps (see [`Handout`]).
    pub(in crate::pool) fn of_block(block: &Handout) -> &PoolBuffer {
        // SAFETY: `PoolBuffer` is `repr(transparent)` over `Handout`: the same layout, and
        // a buffer adds nothing to its block.
        unsafe { &*std::ptr::from_ref(block).cast::<PoolBuffer>() }
    }

    /// Requested length in bytes.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let buffer = pool.alloc(1000)?;
    /// assert_eq!(buffer.len(), 1000);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.block.len()
    }

    /// Whether the length is zero.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// assert!(pool.alloc(0)?.is_empty());
    /// assert!(!pool.alloc(1)?.is_empty());
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.block.len() == 0
    }

    /// Bytes the block actually holds (the size class).
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let buffer = pool.alloc(1000)?;
    /// assert_eq!(buffer.capacity(), 1024); // the 1 KiB class
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn capacity(&self) -> usize {
        class::class_size(self.block.class())
    }

    /// Start of the bytes, for reading; aligned to the pool's alignment. As with
    /// [`Vec::as_ptr`], the bytes must not be written through it (nor through a pointer made
    /// from it): use [`as_mut_ptr`](Self::as_mut_ptr). A buffer from
    /// [`alloc_zeroed`](crate::pool::BufferPool::alloc_zeroed) that was never given a way to
    /// be written goes back to the pool known to be zero, and the next `alloc_zeroed` of its
    /// block skips clearing it.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new(); // 64-byte alignment by default
    /// let buffer = pool.alloc(100)?;
    /// assert_eq!(buffer.as_ptr() as usize % 64, 0);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn as_ptr(&self) -> *const u8 {
        self.block.addr().as_ptr()
    }

    /// Start of the bytes, for writing.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let mut buffer = pool.alloc(4)?;
    /// // SAFETY: the buffer holds 4 bytes, all written here.
    /// unsafe {
    ///     buffer.as_mut_ptr().write_bytes(0xff, 4);
    ///     buffer.assume_init();
    /// }
    /// assert_eq!(buffer.as_bytes(), Some(&[0xff; 4][..]));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.block.addr_mut().as_ptr()
    }

    /// The bytes, if all have been written (or the buffer came zeroed).
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let mut buffer = pool.alloc(3)?;
    /// assert_eq!(buffer.as_bytes(), None, "not written yet");
    /// buffer.fill(1);
    /// assert_eq!(buffer.as_bytes(), Some(&[1, 1, 1][..]));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn as_bytes(&self) -> Option<&[u8]> {
        // SAFETY: `len` bytes of the block are ours, and `initialized` says they are written.
        self.block
            .initialized()
            .then(|| unsafe { std::slice::from_raw_parts(self.as_ptr(), self.block.len()) })
    }

    /// The bytes for writing, if all have been written (or the buffer came zeroed).
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let mut buffer = pool.alloc_zeroed(4)?;
    /// if let Some(bytes) = buffer.as_bytes_mut() {
    ///     bytes[..2].copy_from_slice(&[1, 2]);
    /// }
    /// assert_eq!(buffer.as_bytes(), Some(&[1, 2, 0, 0][..]));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        let (ptr, len) = (self.as_mut_ptr(), self.block.len());
        // SAFETY: as in `as_bytes`, and `&mut self` makes the access exclusive.
        self.block
            .initialized()
            .then(|| unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// The bytes as possibly uninitialised memory, for writing. The buffer counts as not
    /// written from here on (a `MaybeUninit` slice may also be used to un-write a byte), until
    /// [`assume_init`](Self::assume_init), [`fill`](Self::fill) or
    /// [`copy_from_slice`](Self::copy_from_slice).
    ///
    /// ```
    /// use std::mem::MaybeUninit;
    /// let pool = ferropool::BufferPool::new();
    /// let mut buffer = pool.alloc(4)?;
    /// buffer.fill(7);
    /// buffer.as_uninit_mut()[3] = MaybeUninit::uninit();
    /// assert!(buffer.as_bytes().is_none(), "no longer known to be written");
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn as_uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        self.block.set_initialized(false);
        // SAFETY: `len` bytes of the block are exclusively ours; `MaybeUninit` makes no claim
        // about their contents, and `initialized` is cleared, so no byte written through it
        // is read as initialised before the caller vouches for all of them.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr().cast(), self.block.len()) }
    }

    /// Declares every byte written.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let mut buffer = pool.alloc(3)?;
    /// for (i, byte) in buffer.as_uninit_mut().iter_mut().enumerate() {
    ///     byte.write(i as u8);
    /// }
    /// // SAFETY: every byte was written above.
    /// unsafe { buffer.assume_init() };
    /// assert_eq!(buffer.as_bytes(), Some(&[0, 1, 2][..]));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    ///
    /// # Safety
    ///
    /// All [`len`](Self::len) bytes must have been initialised (for example through
    /// [`as_uninit_mut`](Self::as_uninit_mut) or [`as_mut_ptr`](Self::as_mut_ptr)).
    pub unsafe fn assume_init(&mut self) {
        self.block.set_initialized(true);
    }

    /// Sets every byte to `byte`.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let mut buffer = pool.alloc(16)?;
    /// buffer.fill(0xab);
    /// assert_eq!(buffer.as_bytes(), Some(&[0xab; 16][..]));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: `len` bytes of the block are exclusively ours.
        unsafe { self.as_mut_ptr().write_bytes(byte, self.block.len()) };
        self.block.set_initialized(true);
    }

    /// Copies `src` into the buffer.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolError};
    /// let pool = BufferPool::new();
    /// let mut buffer = pool.alloc(4)?;
    /// buffer.copy_from_slice(b"abcd")?;
    /// assert_eq!(buffer.as_bytes(), Some(&b"abcd"[..]));
    /// let short = buffer.copy_from_slice(b"ab");
    /// assert_eq!(short, Err(PoolError::LengthMismatch { expected: 4, found: 2 }));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PoolError::LengthMismatch`] unless `src.len() == self.len()`; the buffer is unchanged.
    pub fn copy_from_slice(&mut self, src: &[u8]) -> Result<(), PoolError> {
        if src.len() != self.block.len() {
            return Err(PoolError::LengthMismatch {
                expected: self.block.len(),
                found: src.len(),
            });
        }
        // SAFETY: `src` and our `len` bytes do not overlap (we own ours exclusively).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_mut_ptr(), src.len()) };
        self.block.set_initialized(true);
        Ok(())
    }

    /// A buffer of `size` bytes from the pool this one came from.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolError};
    /// let pool = BufferPool::new();
    /// let first = pool.alloc(64)?;
    /// let second = first.alloc_sibling(128)?; // no pool handle needed
    /// assert_eq!(second.pool_id(), pool.id());
    /// drop(pool);
    /// assert!(matches!(first.alloc_sibling(64), Err(PoolError::Closed)));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`BufferPool::alloc`](crate::pool::BufferPool::alloc), and [`PoolError::Closed`] if the
    /// pool's last handle was dropped.
    pub fn alloc_sibling(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        PoolInner::alloc(self.block.pool(), size, false, true)
    }

    /// The identity of the pool this buffer came from.
    ///
    /// ```
    /// use ferropool::BufferPool;
    /// let (a, b) = (BufferPool::new(), BufferPool::new());
    /// let buffer = a.alloc(64)?;
    /// assert_eq!(buffer.pool_id(), a.id());
    /// assert_ne!(buffer.pool_id(), b.id());
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn pool_id(&self) -> u64 {
        // SAFETY: invariant on `pool`.
        unsafe { self.block.pool().as_ref() }.id
    }
}

impl fmt::Debug for PoolBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("len", &self.block.len())
            .field("capacity", &self.capacity())
            .field("initialized", &self.block.initialized())
            .field("addr", &self.block.addr())
            .finish()
    }
}
