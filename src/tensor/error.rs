//! The tensor layer's error type.

use super::DType;
use crate::pool::PoolError;

/// Errors of tensors, layouts and views.
///
/// ```
/// use ferropool::{DType, Tensor, TensorError};
/// let t = Tensor::from_slice(&[1.0f32], &[1])?;
/// let err = TensorError::DTypeMismatch { expected: DType::I32, found: DType::F32 };
/// assert_eq!(t.as_slice::<i32>(), Err(err));
/// # Ok::<(), ferropool::TensorError>(())
/// ```
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
    /// An iterator yields more elements than the shape holds (it is not drained to count
    /// them: it may never end).
    #[error("shape {shape:?} holds {expected_elements} elements; the iterator yields more than {expected_elements}")]
    TooManyElements {
        /// The shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected_elements: usize,
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
    #[error("{operation} needs a contiguous layout (copy the elements out with to_vec, or read them one by one with get)")]
    NotContiguous {
        /// The operation.
        operation: &'static str,
    },
    /// A mutable view needs every index to reach an element of its own, and the layout's
    /// strides do not prove it: a zero stride, or axes whose steps overlap (see
    /// [`Layout::check_unaliased`](super::Layout::check_unaliased)).
    #[error(
        "a mutable view needs one element per index, but strides {strides:?} over shape \
         {shape:?} may reach an element from two indices (a zero stride, or a stride shorter \
         than the span of the smaller-strided axes); write it element by element with set"
    )]
    AliasedElements {
        /// The shape.
        shape: Vec<usize>,
        /// The strides.
        strides: Vec<usize>,
    },
    /// The operation needs pooled elements, and got a caller-owned external payload.
    #[error("{operation} needs pooled elements, but the tensor holds an {dtype} payload")]
    ExternalDType {
        /// The operation.
        operation: &'static str,
        /// The external dtype.
        dtype: DType,
    },
    /// A copy of a view's elements out of the pool (into a `Vec`) needs more memory than the
    /// system gives, or more bytes than `usize` counts: a view whose zero strides repeat a
    /// few elements can count far more elements than its buffer holds.
    #[error(
        "copying {elements} elements of {element_bytes} bytes each out of the view: the \
         memory was refused, or the byte count overflows usize"
    )]
    CopyTooLarge {
        /// Elements of the view.
        elements: usize,
        /// Bytes per element.
        element_bytes: usize,
    },
    /// The pool refused a buffer.
    #[error(transparent)]
    Pool(#[from] PoolError),
}
