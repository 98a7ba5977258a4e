//! [`TensorWrite`]: the exclusive writable view of one descriptor.

use std::fmt;

use crate::tensor::bytes::check_dtype;
#[cfg(feature = "ndarray")]
use crate::tensor::bytes::ndarray_view_mut;
use crate::tensor::{DType, Element, Layout, TensorError};

/// An exclusive writable view of one descriptor.
///
/// ```
/// use ferropool::{AllocationGroup, DType, Tensor, TensorWrite};
/// let t = Tensor::zeros(DType::I32, &[2, 2])?;
/// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
/// let mut write: TensorWrite<'_> = group.write_view(slots[0])?;
/// write.as_mut_slice::<i32>()?.copy_from_slice(&[1, 2, 3, 4]);
/// assert_eq!(group.read_view(slots[0])?.get::<i32>(&[1, 1])?, 4);
/// # Ok::<(), ferropool::GroupError>(())
/// ```
pub struct TensorWrite<'a> {
    pub(super) bytes: &'a mut [u8],
    pub(super) dtype: DType,
    pub(super) layout: Layout,
}

impl<'a> TensorWrite<'a> {
    /// The element type.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::F64, &[2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// assert_eq!(group.write_view(slots[0])?.dtype(), DType::F64);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::F64, &[2, 3])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// assert_eq!(group.write_view(transposed)?.shape(), &[3, 2]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    fn elements<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        as_elements(self.bytes, self.dtype)
    }

    /// The view as an [`ndarray::ArrayViewMutD`], without copying, whatever its layout
    /// (permuted and narrowed views included), as long as no two of its indices reach the
    /// same element ([`Layout::check_unaliased`]). Writes through the array land in the
    /// group's buffer. Feature `ndarray`.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// use ndarray::Axis;
    /// let t = Tensor::zeros(DType::F32, &[2, 3])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?; // shape [3, 2], strides [1, 3]
    /// let mut write = group.write_view(transposed)?;
    /// let mut array = write.to_ndarray_mut::<f32>()?;
    /// array.index_axis_mut(Axis(0), 2).fill(7.0); // column 2 of `slots[0]`
    /// array[[0, 1]] = 1.0; // row 1, column 0 of `slots[0]`
    /// assert_eq!(group.read_view(slots[0])?.to_vec::<f32>()?, vec![0.0, 0.0, 7.0, 1.0, 0.0, 7.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A view whose indices share elements is refused:
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Layout, Tensor, TensorError};
    /// let t = Tensor::zeros(DType::F32, &[3])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let broadcast = group.add_view(slots[0], Layout::new(&[2, 3], &[0, 1], 0)?)?;
    /// assert!(matches!(
    ///     group.write_view(broadcast)?.to_ndarray_mut::<f32>(),
    ///     Err(TensorError::AliasedElements { .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] unless `T` is the view's element type;
    /// [`TensorError::AliasedElements`] for a view whose strides do not prove its
    /// elements distinct (a zero stride, overlapping axes).
    #[cfg(feature = "ndarray")]
    pub fn to_ndarray_mut<T: Element>(
        &mut self,
    ) -> Result<ndarray::ArrayViewMutD<'_, T>, TensorError> {
        // The fields borrowed apart: the elements mutably, the layout shared.
        ndarray_view_mut(as_elements(self.bytes, self.dtype)?, &self.layout)
    }

    /// As [`to_ndarray_mut`](Self::to_ndarray_mut), consuming the write view: the array
    /// borrows the group for as long as the view did, so it can outlive the statement
    /// that made the view. Feature `ndarray`.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::I32, &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let mut array = group.write_view(slots[0])?.into_ndarray_mut::<i32>()?;
    /// array += 3;
    /// array[[1, 1]] = 9;
    /// assert_eq!(group.read_view(slots[0])?.to_vec::<i32>()?, vec![3, 3, 3, 9]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`to_ndarray_mut`](Self::to_ndarray_mut).
    #[cfg(feature = "ndarray")]
    pub fn into_ndarray_mut<T: Element>(
        self,
    ) -> Result<ndarray::ArrayViewMutD<'a, T>, TensorError> {
        let Self {
            bytes,
            dtype,
            layout,
        } = self;
        ndarray_view_mut(as_elements(bytes, dtype)?, &layout)
    }

    /// The elements as a mutable slice, when the view is contiguous.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::F32, &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// group.write_view(slots[0])?.as_mut_slice::<f32>()?.fill(1.5);
    /// assert_eq!(group.read_view(slots[0])?.to_vec::<f32>()?, vec![1.5; 4]);
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// assert!(group.write_view(transposed)?.as_mut_slice::<f32>().is_err()); // strided
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] or [`TensorError::NotContiguous`].
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        if !self.layout.is_contiguous() {
            return Err(TensorError::NotContiguous {
                operation: "TensorWrite::as_mut_slice",
            });
        }
        let (offset, numel) = (self.layout.offset(), self.layout.numel());
        Ok(&mut self.elements::<T>()?[offset..offset + numel])
    }

    /// Sets one element by multi-index (any layout).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::I64, &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// group.write_view(transposed)?.set(&[0, 1], 9i64)?; // row 1, column 0 of `slots[0]`
    /// assert_eq!(group.read_view(slots[0])?.to_vec::<i64>()?, vec![0, 0, 9, 0]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] or [`TensorError::IndexOutOfRange`].
    pub fn set<T: Element>(&mut self, index: &[usize], value: T) -> Result<(), TensorError> {
        let offset = self.layout.element_offset(index)?;
        self.elements::<T>()?[offset] = value;
        Ok(())
    }
}

impl fmt::Debug for TensorWrite<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorWrite")
            .field("dtype", &self.dtype)
            .field("layout", &self.layout)
            .finish()
    }
}

/// A group buffer's bytes as the `T`s it holds, for as long as they are borrowed.
fn as_elements<T: Element>(bytes: &mut [u8], dtype: DType) -> Result<&mut [T], TensorError> {
    check_dtype::<T>(dtype)?;
    let len = bytes.len() / std::mem::size_of::<T>();
    // SAFETY: `bytes` is a whole group buffer from its start (`write_view` hands over the
    // buffer's bytes, never a sub-slice), so it is aligned to the pool's 8 at least; it holds
    // initialised `T`s (dtype checked; invariant on the group's buffers), and the borrow is
    // exclusive for as long as the result lives.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), len) })
}
