//! The pool's error type.

use std::fmt;

use super::human_bytes::HumanBytes;

/// Errors of [`BufferPool`](crate::BufferPool) and [`PoolBuffer`](crate::PoolBuffer).
///
/// A failed allocation leaves the pool's counters and lists as they were (but for the cached
/// memory it released while trying).
///
/// ```
/// use ferropool::{BufferPool, PoolError};
/// let pool = BufferPool::new();
/// let Err(error) = pool.alloc(usize::MAX) else { panic!("served more than 1 TiB") };
/// assert!(matches!(error, PoolError::TooLarge { max, .. } if max == 1 << 40));
/// assert!(error.to_string().contains("exceeds the largest size class"), "{error}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Reserving another block would exceed the pool's byte budget, even after the pool
    /// released every cached block, its threads' caches included.
    #[error("{0}")]
    BudgetExceeded(Box<OutOfMemory>),
    /// The system allocator returned no memory.
    #[error("{0}")]
    SystemAllocFailed(Box<OutOfMemory>),
    /// The request is larger than the largest size class.
    #[error("a request of {} exceeds the largest size class ({})", HumanBytes(*requested as u64), HumanBytes(*max as u64))]
    TooLarge {
        /// Bytes requested.
        requested: usize,
        /// The largest request served.
        max: usize,
    },
    /// The pool holds 2^32 - 1 blocks and cannot track another.
    #[error("the pool already tracks the maximum of 2^32 - 1 blocks")]
    TooManyBlocks,
    /// The pool was closed (its last handle dropped); a buffer of it cannot allocate
    /// another.
    #[error("the pool was closed: its last handle was dropped")]
    Closed,
    /// [`BufferPool::configure_global`](crate::BufferPool::configure_global) came after the
    /// process-wide pool's first use.
    #[error("the process-wide pool is in use already; configure it before its first use")]
    AlreadyInitialized,
    /// A copy's source length differs from the buffer's.
    #[error("length mismatch: the buffer holds {expected} bytes, the source {found}")]
    LengthMismatch {
        /// The buffer's length.
        expected: usize,
        /// The source's length.
        found: usize,
    },
    /// A configuration field is out of range.
    #[error("invalid pool configuration: {field} = {value}, expected {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What the field accepts.
        expected: &'static str,
    },
}

/// What the pool held when it could not serve an allocation: the figures a person needs to
/// decide what to do. Its `Display` says it in human units and suggests the next step.
///
/// ```
/// use ferropool::{BufferPool, PoolConfig, PoolError};
/// let config = PoolConfig { budget: Some(1 << 20), ..PoolConfig::default() };
/// let pool = BufferPool::with_config(config)?;
/// let Err(PoolError::BudgetExceeded(oom)) = pool.alloc(3 << 20) else {
///     panic!("3 MiB within a 1 MiB budget")
/// };
/// assert_eq!((oom.block_bytes, oom.budget), (3 << 20, Some(1 << 20)));
/// assert!(oom.to_string().contains("raise PoolConfig::budget"), "{oom}");
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutOfMemory {
    /// Bytes requested.
    pub requested: usize,
    /// The request rounded up to its size class: the block that was needed.
    pub block_bytes: usize,
    /// The pool's budget, if it has one.
    pub budget: Option<u64>,
    /// Bytes handed out.
    pub in_use: u64,
    /// Bytes cached in thread caches before the pool released them to make room.
    pub cached_in_threads: u64,
    /// Bytes cached on the shared lists before the pool released them.
    pub cached_in_lists: u64,
    /// Bytes held from the system when the request failed.
    pub reserved: u64,
    /// The most the pool has held from the system.
    pub peak_reserved: u64,
    /// The largest cached block before the release (0 if none): a request up to its size
    /// could have been served without the system.
    pub largest_cached_block: usize,
    /// Bytes of evictable values (see
    /// [`RetainedValue::evictable`](crate::RetainedValue::evictable)) that reads or
    /// recomputes held pinned, so that the pool could not evict them (part of `in_use`).
    pub evictable_pinned: u64,
    /// Bytes of evictable values resident and unpinned that the pool did not evict (part of
    /// `in_use`): because evicting them could not have made room (then
    /// `short_with_every_eviction` is above 0, and the pool evicted none), or because a
    /// reader pinned them at the instant the pool chose them (rare: the pool looks again).
    pub evictable_unpinned: u64,
    /// The bytes the request would still have lacked under the budget were every unpinned
    /// evictable value evicted: the bytes in use that no eviction frees (plain buffers and
    /// pinned values) plus the block, less the budget. Above 0, the pool evicted nothing for
    /// this request: no eviction could have served it. 0 when eviction could have made room,
    /// and for a pool without a budget.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig, PoolError, Recompute, RetainedValue, Tensor};
    /// let pool = BufferPool::with_config(PoolConfig {
    ///     budget: Some(1 << 20),
    ///     ..PoolConfig::default()
    /// })?;
    /// let plain = pool.alloc(768 << 10)?; // no eviction frees it
    /// let value = Tensor::zeros_in(&pool, ferropool::DType::F32, &[32 << 10])?; // 128 KiB
    /// let recompute = Recompute::new([], |_| unreachable!("never evicted"));
    /// let saved = RetainedValue::evictable(&pool, value, recompute)?;
    /// let Err(PoolError::BudgetExceeded(oom)) = pool.alloc(512 << 10) else { panic!() };
    /// assert_eq!(oom.short_with_every_eviction, 256 << 10);
    /// assert!(saved.is_resident(), "nothing evicted for a request that cannot fit");
    /// assert!(oom.to_string().contains("would still lack 256.00 KiB"), "{oom}");
    /// # drop(plain);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub short_with_every_eviction: u64,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = HumanBytes;
        write!(
            f,
            "out of memory: cannot allocate {} (a block of {})",
            b(self.requested as u64),
            b(self.block_bytes as u64)
        )?;
        match self.budget {
            Some(budget) => write!(f, " within the pool's budget of {}", b(budget))?,
            None => write!(f, " from the system")?,
        }
        write!(
            f,
            ": {} in use, {} reserved (peak {}); {} was cached ({} in thread caches, {} on \
             shared lists, largest block {}) and has been released. ",
            b(self.in_use),
            b(self.reserved),
            b(self.peak_reserved),
            b(self.cached_in_threads + self.cached_in_lists),
            b(self.cached_in_threads),
            b(self.cached_in_lists),
            b(self.largest_cached_block as u64),
        )?;
        if self.evictable_pinned + self.evictable_unpinned > 0 {
            if self.short_with_every_eviction > 0 {
                write!(
                    f,
                    "Evicting every evictable value no read pins would not have made room (the \
                     request would still lack {}), so the pool evicted none; of the bytes in \
                     use, {} are evictable values pinned by reads and {} unpinned. ",
                    b(self.short_with_every_eviction),
                    b(self.evictable_pinned),
                    b(self.evictable_unpinned),
                )?;
            } else {
                write!(
                    f,
                    "Of the bytes in use, {} are evictable values pinned by reads and {} \
                     evictable values a read pinned as the pool chose them. ",
                    b(self.evictable_pinned),
                    b(self.evictable_unpinned),
                )?;
            }
        }
        if self.budget.is_some() {
            write!(
                f,
                "Drop buffers that are no longer needed, or raise PoolConfig::budget."
            )
        } else {
            write!(
                f,
                "Drop buffers that are no longer needed, or lower the memory the process uses."
            )
        }
    }
}
