//! `PoolBuffer`: an aligned byte buffer from a pool, which gives itself back when dropped.

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use super::blocks::Record;
use super::inner::PoolInner;
use super::{class, lifetime, PoolError};

/// An aligned byte buffer from a [`BufferPool`](super::BufferPool); it returns itself to the
/// pool when dropped, from any thread.
///
/// Its bytes start uninitialised (unless it came from
/// [`alloc_zeroed`](super::BufferPool::alloc_zeroed)): write them through
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
pub struct PoolBuffer {
    /// The block: at least `len` bytes (its class size), aligned to the pool's alignment.
    addr: NonNull<u8>,
    /// Requested bytes.
    len: usize,
    /// The pool. Invariant: alive while this buffer is (a live buffer is counted, and the
    /// pool is freed only once none is; see `lifetime`).
    pool: NonNull<PoolInner>,
    /// The block's record in the pool's block table (which says, among other things, which
    /// thread allocated the block). Invariant: valid while the pool is (records are never
    /// freed before their pool).
    record: NonNull<Record>,
    /// The block's class, and whether all `len` bytes have been written.
    shape: Shape,
}

/// A buffer's class and whether its bytes have all been written, in one word. As a `u16` and
/// a `bool`, moving a buffer (into a `Result`, out of it, into the caller's variable) copied
/// the two with a store each and read them back as one 8-byte word, which the CPU cannot
/// forward from its store buffer: a stall of some 15 cycles that took a quarter of an
/// allocation and free on one thread (AMD Zen 4). One `u64` moves as one store and one load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape(u64);

impl Shape {
    /// Bit set when the bytes have all been written; the class is in the low 32 bits.
    const INITIALIZED: u64 = 1 << 32;

    fn new(class: usize, initialized: bool) -> Self {
        let flag = if initialized { Self::INITIALIZED } else { 0 };
        // Class numbers fit in 16 bits (checked at compile time in `class`).
        Self(class as u64 | flag)
    }

    #[inline]
    fn class(self) -> usize {
        (self.0 & u64::from(u32::MAX)) as usize
    }

    fn initialized(self) -> bool {
        self.0 & Self::INITIALIZED != 0
    }

    fn set_initialized(&mut self, initialized: bool) {
        *self = Self::new(self.class(), initialized);
    }
}

// SAFETY: a `PoolBuffer` owns its bytes exclusively (like a `Box<[u8]>`), and its pool is
// shared through atomics only: dropping it on another thread returns the block from there.
unsafe impl Send for PoolBuffer {}
// SAFETY: `&PoolBuffer` only reads the bytes.
unsafe impl Sync for PoolBuffer {}

impl PoolBuffer {
    /// Makes the buffer's requested length `len` (at most its capacity), for an in-place
    /// reallocation of a raw block: the block's record and the pool's counters follow, so
    /// `requested_bytes` and snapshots report the new size.
    pub(super) fn resize_requested(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        // SAFETY: invariants on `pool` and `record`: both alive while this buffer is.
        let (pool, record) = unsafe { (self.pool.as_ref(), self.record.as_ref()) };
        pool.count_resize(record, self.len, len);
        self.len = len;
    }

    /// The block's record, whose address tells blocks apart (a raw block's colour).
    #[inline(always)]
    pub(super) fn record_ptr(&self) -> NonNull<Record> {
        self.record
    }

    pub(super) fn new(
        pool: NonNull<PoolInner>,
        addr: NonNull<u8>,
        len: usize,
        record: &Record,
        class: usize,
        initialized: bool,
    ) -> Self {
        Self {
            addr,
            len,
            pool,
            record: NonNull::from(record),
            shape: Shape::new(class, initialized),
        }
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
        self.len
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
        self.len == 0
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
        class::class_size(self.shape.class())
    }

    /// Start of the bytes; aligned to the pool's alignment.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new(); // 64-byte alignment by default
    /// let buffer = pool.alloc(100)?;
    /// assert_eq!(buffer.as_ptr() as usize % 64, 0);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn as_ptr(&self) -> *const u8 {
        self.addr.as_ptr()
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
        self.addr.as_ptr()
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
        self.shape
            .initialized()
            .then(|| unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) })
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
        let (ptr, len) = (self.as_mut_ptr(), self.len);
        // SAFETY: as in `as_bytes`, and `&mut self` makes the access exclusive.
        self.shape
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
        self.shape.set_initialized(false);
        // SAFETY: `len` bytes of the block are exclusively ours; `MaybeUninit` makes no claim
        // about their contents, and `initialized` is cleared, so no byte written through it
        // is read as initialised before the caller vouches for all of them.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr().cast(), self.len) }
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
        self.shape.set_initialized(true);
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
        unsafe { self.as_mut_ptr().write_bytes(byte, self.len) };
        self.shape.set_initialized(true);
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
        if src.len() != self.len {
            return Err(PoolError::LengthMismatch {
                expected: self.len,
                found: src.len(),
            });
        }
        // SAFETY: `src` and our `len` bytes do not overlap (we own ours exclusively).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_mut_ptr(), src.len()) };
        self.shape.set_initialized(true);
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
    /// As [`BufferPool::alloc`](super::BufferPool::alloc), and [`PoolError::Closed`] if the
    /// pool's last handle was dropped.
    pub fn alloc_sibling(&self, size: usize) -> Result<PoolBuffer, PoolError> {
        PoolInner::alloc(self.pool, size, false, true)
    }

    /// The block's size class.
    pub(super) fn class(&self) -> usize {
        self.shape.class()
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
        unsafe { self.pool.as_ref() }.id
    }
}

impl Drop for PoolBuffer {
    // Only a call with the buffer's fields as arguments, small enough for the compiler to
    // inline where a buffer dies, so the fields go to the pool in registers (see
    // `give_back`).
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `give_back`'s contract: the fields are this buffer's own (invariants on
        // `pool` and `record`: both alive while it is; `shape` and `len` are its class and
        // length), it is dropped once, and nothing of it is used after this.
        unsafe { give_back(self.pool, self.record, self.shape.class(), self.len) }
    }
}

/// Returns a dropped buffer's block (of `class`, `requested` bytes asked for) to its pool.
///
/// Out of line on purpose. With the free inlined into `Drop`, the drop glue grew too large
/// for the compiler to inline into the caller; it then took the buffer by pointer, so the
/// caller moved the buffer through memory first, storing it a word at a time and loading it
/// back 16 bytes at a time, which the CPU cannot forward from its store buffer (some 40% of
/// an alloc + free on AMD Zen 4). A call taking the fields by value keeps them in registers.
///
/// It runs the free's hot path ([`PoolInner::free_cached`], which makes no call) and leaves
/// everything else to the cold [`give_back_uncached`], so that it saves few registers on the
/// way in: an alloc + free of a cached 4 KiB block went from 16.5-16.7 to 14.6-14.8 ns on
/// an AMD Zen 3 machine when the whole free stopped being this function's body (glibc's
/// `Vec` took 24.3-25.1 ns in the same runs; `benches/README.md`).
///
/// The pool and record come as raw pointers, not references, on purpose: when the pool was
/// closed this call may free both, and a reference argument would outlive them.
///
/// # Safety
///
/// - `pool`, `record`, `class` and `requested` are one live buffer's own fields: the
///   block's record, the class it was handed out with (a wrong class would list the block
///   in a class of larger blocks) and the buffer's current length (the counters take it
///   back);
/// - that buffer is given back by this call alone, exactly once, and never used again;
/// - the caller holds no reference into the pool or its records across the call (this call
///   may free the pool; see [`lifetime::count_out`]).
#[inline(never)]
unsafe fn give_back(
    pool: NonNull<PoolInner>,
    record: NonNull<Record>,
    class: usize,
    requested: usize,
) {
    {
        // SAFETY: the caller's contract: the pool is alive until this buffer is given back.
        let inner = unsafe { pool.as_ref() };
        // SAFETY: the caller's contract; records live as long as their pool.
        let cached = inner.free_cached(unsafe { record.as_ref() }, class, requested);
        if cached {
            return;
        }
    }
    // SAFETY: the caller's contract, passed on whole: `free_cached` changed nothing.
    unsafe { give_back_uncached(pool, record, class, requested) }
}

/// What [`give_back`] leaves to the pool's whole free: a block for the shared lists, a
/// closed pool, a thread on another pool.
///
/// # Safety
///
/// As for [`give_back`].
#[cold]
#[inline(never)]
unsafe fn give_back_uncached(
    pool: NonNull<PoolInner>,
    record: NonNull<Record>,
    class: usize,
    requested: usize,
) {
    let closed = {
        // SAFETY: the caller's contract: the pool is alive until this buffer is given back.
        let inner = unsafe { pool.as_ref() };
        // SAFETY: the caller's contract; records live as long as their pool.
        let record = unsafe { record.as_ref() };
        inner.free(record, class, requested)
    };
    if closed {
        // SAFETY: the pool closed before this free, which released the block; the
        // buffer is still counted, so the pool is alive; the borrows above have ended, and
        // the caller holds none across this call (the contract's last clause).
        unsafe { lifetime::count_out(pool) };
    }
}

impl fmt::Debug for PoolBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("initialized", &self.shape.initialized())
            .field("addr", &self.addr)
            .finish()
    }
}
