//! The crate-level error: what the runtime-facing surface (retained values, checkpoint
//! chains) reports, wrapping the typed error of each layer below.
//!
//! Every layer owns its error type ([`ArenaError`], [`PoolError`], [`TensorError`],
//! [`GroupError`]), which converts into [`Error`] with `?`. The runtime's own failures are
//! reported through [`Error::runtime_state`], which names the operation, the phase, and
//! what went wrong.

use std::fmt;

use crate::arena::ArenaError;
use crate::group::GroupError;
use crate::pool::PoolError;
use crate::tensor::TensorError;

/// The crate-level result type.
///
/// ```
/// use ferropool::{Result, Tensor};
/// fn first(tensor: &Tensor) -> Result<f32> {
///     Ok(tensor.as_slice::<f32>()?[0]) // a `TensorError` converts with `?`
/// }
/// assert_eq!(first(&Tensor::from_slice(&[2.5f32], &[1])?)?, 2.5);
/// # Ok::<(), ferropool::Error>(())
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which phase of the runtime an error was raised in.
///
/// ```
/// use ferropool::{Error, ErrorPhase};
/// let error = Error::runtime_state("Runtime::release", ErrorPhase::Teardown, "still shared");
/// assert!(matches!(error, Error::RuntimeState { phase: ErrorPhase::Teardown, .. }));
/// assert_eq!(ErrorPhase::Teardown.to_string(), "teardown");
/// ```
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

/// The crate-level error.
///
/// ```
/// use ferropool::{Error, Tensor, TensorError};
/// fn build() -> ferropool::Result<Tensor> {
///     Ok(Tensor::from_slice(&[1.0f32; 5], &[2, 3])?)
/// }
/// assert!(matches!(build(), Err(Error::Tensor(TensorError::ShapeMismatch { .. }))));
/// ```
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
        /// The typed error of the layer below that caused it, if one did.
        #[source]
        source: Option<GroupError>,
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
    /// let e =
    ///     Error::runtime_state("RetainedValue::tensor_read", ErrorPhase::Execution, "stale slot");
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
            source: None,
        }
    }

    /// An [`Error::RuntimeState`] caused by a group error, which it keeps as its
    /// [`source`](std::error::Error::source).
    ///
    /// ```
    /// use ferropool::{Error, ErrorPhase, GroupError};
    /// let cause = GroupError::Shared { handles: 2 };
    /// let e = Error::runtime_state_from(
    ///     "Runtime::replay",
    ///     ErrorPhase::Execution,
    ///     "cannot extend the saved group",
    ///     cause.clone(),
    /// );
    /// let source = std::error::Error::source(&e).unwrap();
    /// assert_eq!(source.downcast_ref::<GroupError>(), Some(&cause));
    /// ```
    pub fn runtime_state_from(
        operation: &'static str,
        phase: ErrorPhase,
        message: impl Into<String>,
        source: GroupError,
    ) -> Self {
        Self::RuntimeState {
            operation,
            phase,
            message: message.into(),
            source: Some(source),
        }
    }
}
