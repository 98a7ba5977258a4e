//! Byte-level helpers of the tensors: checked byte counts, the bytes of a pooled buffer, dtype
//! checks, and the shapes of `ndarray` views.

use super::dtype::{DType, Element};
use super::error::TensorError;
#[cfg(feature = "ndarray")]
use super::layout::Layout;
use crate::pool::PoolBuffer;

/// Bytes of `count` elements of `size` bytes each, checked.
pub(super) fn byte_count(count: usize, size: usize, shape: &[usize]) -> Result<usize, TensorError> {
    count
        .checked_mul(size)
        .ok_or_else(|| TensorError::InvalidLayout {
            reason: format!("{shape:?} elements of {size} bytes overflow usize"),
        })
}

/// `elements` (every element a buffer holds) seen through `layout` as a mutable ndarray
/// view, once the layout is proven free of aliasing.
#[cfg(feature = "ndarray")]
pub(crate) fn ndarray_view_mut<'b, T: Element>(
    elements: &'b mut [T],
    layout: &Layout,
) -> Result<ndarray::ArrayViewMutD<'b, T>, TensorError> {
    layout.check_unaliased()?;
    let (shape, from) = ndarray_shape(
        layout.shape(),
        layout.strides(),
        layout.offset(),
        elements.len(),
    );
    // ndarray checks again that the strides stay within the slice and do not overlap.
    ndarray::ArrayViewMut::from_shape(shape, elements.get_mut(from..).unwrap_or_default())
        .map_err(ndarray_refused)
}

/// The ndarray shape of a view with `shape`, `strides` and `offset` over `len` elements,
/// and the index its slice starts at: the shape with its strides from `offset`; for a view
/// without elements (nothing to point at), the plain shape over the empty slice at `len`.
/// (An offset past the elements leaves an empty slice, which ndarray refuses.)
#[cfg(feature = "ndarray")]
pub(crate) fn ndarray_shape(
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    len: usize,
) -> (ndarray::StrideShape<ndarray::IxDyn>, usize) {
    use ndarray::{IxDyn, ShapeBuilder};
    if shape.contains(&0) {
        (IxDyn(shape).into(), len)
    } else {
        // A length-1 axis is never stepped along, so its stride may be anything a `usize`
        // holds (the extent check skips it); ndarray reads strides as `isize`, where one
        // above `isize::MAX` turns negative. Every other stride is within the buffer's
        // extent, so it fits.
        let strides: Vec<usize> = shape
            .iter()
            .zip(strides)
            .map(|(&dim, &stride)| if dim == 1 { 0 } else { stride })
            .collect();
        (IxDyn(shape).strides(IxDyn(&strides)), offset)
    }
}

/// ndarray's refusal of a shape, as this crate's error.
#[cfg(feature = "ndarray")]
pub(crate) fn ndarray_refused(error: ndarray::ShapeError) -> TensorError {
    TensorError::InvalidLayout {
        reason: format!("ndarray refused the view: {error}"),
    }
}

/// The initialised bytes of a buffer that backs a tensor.
pub(crate) fn pooled_bytes(buffer: &PoolBuffer) -> &[u8] {
    buffer
        .as_bytes()
        .expect("tensor buffers are initialised on construction")
}

pub(crate) fn check_dtype<T: Element>(found: DType) -> Result<(), TensorError> {
    if found == T::DTYPE {
        Ok(())
    } else {
        Err(TensorError::DTypeMismatch {
            expected: T::DTYPE,
            found,
        })
    }
}
