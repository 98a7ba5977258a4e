//! Errors: one crate-level [`Error`] and a typed error per module.
//!
//! Every fallible operation returns its module's typed error (for example [`ArenaError`]);
//! those convert into [`Error`] with `?`. The runtime-facing surface reports through
//! [`Error::runtime_state`], which names the operation, the phase, and what went wrong.

use std::fmt;

use crate::tensor::DType;

/// The crate-level result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which phase of the runtime an error was raised in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorPhase {
    /// While building or validating a value (construction, layout checks).
    Construction,
    /// While running a step: reads, retention, replay.
    Execution,
    /// While releasing or reclaiming memory.
    Teardown,
}

impl fmt::Display for ErrorPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Construction => "construction",
            Self::Execution => "execution",
            Self::Teardown => "teardown",
        })
    }
}

/// Errors of [`SlotArena`](crate::SlotArena).
///
/// Every variant says what was asked for and what the arena had instead; an operation that
/// returns one of these has left the arena unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArenaError {
    /// The key's slot holds no value of the key's generation: it was removed, or removed and
    /// reused (the slot is now at `current_generation`).
    #[error(
        "slot {index} generation {generation} is not present \
         (the slot is at generation {current_generation}, {state})"
    )]
    Stale {
        /// The key's slot index.
        index: u32,
        /// The key's generation.
        generation: u32,
        /// The slot's generation now.
        current_generation: u32,
        /// `"occupied"`, `"vacant"`, `"awaiting reclamation"` or `"retired"`.
        state: &'static str,
    },
    /// The key's slot index was never allocated by this arena (or its page was released).
    #[error("slot {index} is out of range (the arena has {capacity} slots allocated)")]
    OutOfRange {
        /// The key's slot index.
        index: u32,
        /// Slots the arena has allocated pages for.
        capacity: u64,
    },
    /// The key was issued by another arena.
    #[error("the key belongs to arena #{key_arena}, not to this arena #{arena}")]
    ForeignKey {
        /// The identity of the arena that issued the key.
        key_arena: u64,
        /// The identity of this arena.
        arena: u64,
    },
    /// The epoch guard was pinned on another collector (or is `unprotected`), so it cannot
    /// protect this arena's records.
    #[error(
        "the epoch guard belongs to another collector; pin with SlotArena::pin \
         or with a handle registered on the arena's collector"
    )]
    ForeignGuard,
    /// A configuration field is out of range.
    #[error("invalid arena configuration: {field} = {value}, expected {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What the field accepts.
        expected: &'static str,
    },
    /// Every addressable slot index is in use.
    #[error("the arena is full: all {capacity} slot indices are in use")]
    Full {
        /// The number of addressable slots.
        capacity: u64,
    },
}

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

/// Errors of tensors, layouts and views.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// A typed access asked for one element type; the tensor holds another.
    #[error("dtype mismatch: asked for {expected}, the tensor holds {found}")]
    DTypeMismatch {
        /// The type asked for.
        expected: DType,
        /// The tensor's type.
        found: DType,
    },
    /// The data's element count does not match the shape.
    #[error("shape {shape:?} holds {expected_elements} elements, got {found_elements}")]
    ShapeMismatch {
        /// The shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected_elements: usize,
        /// Elements given.
        found_elements: usize,
    },
    /// A layout reaches past the end of its buffer.
    #[error("the layout needs {needed} elements, the buffer holds {available}")]
    OutOfBounds {
        /// Elements the layout reaches.
        needed: usize,
        /// Elements the buffer holds.
        available: usize,
    },
    /// A layout is malformed (rank mismatch, bad permutation or range, overflow).
    #[error("invalid layout: {reason}")]
    InvalidLayout {
        /// What is wrong.
        reason: String,
    },
    /// An index has the wrong rank or exceeds the shape.
    #[error("index {index:?} is out of range for shape {shape:?}")]
    IndexOutOfRange {
        /// The index.
        index: Vec<usize>,
        /// The shape.
        shape: Vec<usize>,
    },
    /// The operation needs a contiguous layout.
    #[error("{operation} needs a contiguous layout")]
    NotContiguous {
        /// The operation.
        operation: &'static str,
    },
    /// The operation needs pooled elements, and got a caller-owned external payload.
    #[error("{operation} needs pooled elements, but the tensor holds an {dtype} payload")]
    ExternalDType {
        /// The operation.
        operation: &'static str,
        /// The external dtype.
        dtype: DType,
    },
    /// The pool refused a buffer.
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// Errors of [`AllocationGroup`](crate::AllocationGroup). A failed operation leaves the group
/// unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The slot was issued by another group.
    #[error("slot {slot} belongs to group #{slot_group}, not to group #{group}")]
    ForeignSlot {
        /// The slot, as `Key(..)` text.
        slot: String,
        /// The group that issued it.
        slot_group: u64,
        /// This group.
        group: u64,
    },
    /// The slot's descriptor was removed (or never existed in this group's arena).
    #[error("the descriptor is gone: {0}")]
    Stale(#[from] ArenaError),
    /// A caller-owned payload cannot live in an allocation group.
    #[error("an {dtype} payload is caller-owned and cannot join an allocation group")]
    ExternalPayload {
        /// Its dtype.
        dtype: DType,
    },
    /// The operation changes the group, and other handles share it.
    #[error("the group is shared by {handles} handles; changing it needs the only handle")]
    Shared {
        /// Handles sharing the group.
        handles: usize,
    },
    /// The descriptor's buffer is also viewed by other descriptors.
    #[error("{aliases} other descriptor(s) view the same buffer")]
    Aliased {
        /// How many.
        aliases: usize,
    },
    /// A layout or typed access failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// The crate-level error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A runtime operation found state it cannot work with.
    #[error("{operation} failed during {phase}: {message}")]
    RuntimeState {
        /// The operation that failed, as `Type::method`.
        operation: &'static str,
        /// The phase it failed in.
        phase: ErrorPhase,
        /// What went wrong.
        message: String,
    },
    /// An arena operation failed.
    #[error(transparent)]
    Arena(#[from] ArenaError),
    /// A pool operation failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A group operation failed.
    #[error(transparent)]
    Group(#[from] GroupError),
}

impl Error {
    /// Builds an [`Error::RuntimeState`].
    ///
    /// ```
    /// use ferropool::{Error, ErrorPhase};
    /// let e = Error::runtime_state("RetainedValue::tensor_read", ErrorPhase::Execution, "stale slot");
    /// assert_eq!(e.to_string(), "RetainedValue::tensor_read failed during execution: stale slot");
    /// ```
    pub fn runtime_state(
        operation: &'static str,
        phase: ErrorPhase,
        message: impl Into<String>,
    ) -> Self {
        Self::RuntimeState {
            operation,
            phase,
            message: message.into(),
        }
    }
}
