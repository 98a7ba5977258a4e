//! The pool's error type.

/// Errors of [`BufferPool`](crate::BufferPool) and [`PoolBuffer`](crate::PoolBuffer).
///
/// A failed allocation leaves the pool's counters and lists as they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// Reserving another block would exceed the pool's byte budget, even after the pool
    /// released what it had cached.
    #[error(
        "a {requested}-byte block would exceed the pool budget of {budget} bytes \
         ({in_use} bytes in use, {cached} cached in other threads' caches); \
         drop live buffers, call trim() on the threads that cache buffers, \
         or raise PoolConfig::budget"
    )]
    BudgetExceeded {
        /// Bytes of the block that was needed (the request rounded up to its class).
        requested: u64,
        /// The configured budget.
        budget: u64,
        /// Bytes in buffers handed out.
        in_use: u64,
        /// Bytes still cached (in other threads' caches, which only they can release).
        cached: u64,
    },
    /// The request is larger than the largest size class.
    #[error("a request of {requested} bytes exceeds the largest size class ({max} bytes)")]
    TooLarge {
        /// Bytes requested.
        requested: usize,
        /// The largest request served.
        max: usize,
    },
    /// The system allocator returned no memory.
    #[error("the system allocator refused {size} bytes aligned to {align}")]
    SystemAllocFailed {
        /// Bytes asked of the system.
        size: usize,
        /// Alignment asked of the system.
        align: usize,
    },
    /// The pool holds 2^32 - 1 blocks and cannot track another.
    #[error("the pool already tracks the maximum of 2^32 - 1 blocks")]
    TooManyBlocks,
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
