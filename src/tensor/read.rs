//! `TensorRead`: a borrowed, read-only view of a tensor's elements.

use std::any::Any;

use super::bytes::check_dtype;
use super::dtype::{DType, Element};
use super::error::TensorError;
use super::layout::Layout;
use super::{ExternalPayload, Tensor};

/// A borrowed read-only view: dtype, shape, strides, offset, and the elements.
///
/// ```
/// use ferropool::{Tensor, TensorRead};
/// let t = Tensor::from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3])?;
/// let view = TensorRead::from_tensor(&t);
/// assert_eq!(view.get::<i32>(&[1, 2])?, 6);
/// assert_eq!(view.to_vec::<i32>()?, vec![1, 2, 3, 4, 5, 6]);
/// # Ok::<(), ferropool::TensorError>(())
/// ```
#[derive(Clone, Copy)]
pub struct TensorRead<'a> {
    repr: ReadRepr<'a>,
}

#[derive(Clone, Copy)]
enum ReadRepr<'a> {
    /// Invariant: `bytes` holds initialised elements of `dtype` (aligned to 8 bytes), and
    /// `layout.check_within(bytes.len() / size)` holds.
    Pooled {
        bytes: &'a [u8],
        dtype: DType,
        layout: &'a Layout,
    },
    External {
        payload: &'a dyn ExternalPayload,
        shape: &'a [usize],
    },
}

impl<'a> TensorRead<'a> {
    /// A view of a whole tensor.
    ///
    /// ```
    /// use ferropool::{Tensor, TensorRead};
    /// let t = Tensor::from_slice(&[1u8, 2, 3], &[3])?;
    /// let view = TensorRead::from_tensor(&t);
    /// assert_eq!(view.as_slice::<u8>()?, &[1, 2, 3]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn from_tensor(tensor: &'a Tensor) -> Self {
        tensor.read()
    }

    /// A view of elements of `dtype` in `bytes`; callers uphold the invariant on
    /// `ReadRepr::Pooled` (checked in debug builds).
    pub(crate) fn pooled(bytes: &'a [u8], dtype: DType, layout: &'a Layout) -> Self {
        debug_assert!(dtype
            .size_of()
            .is_some_and(|size| layout.check_within(bytes.len() / size).is_ok()));
        Self {
            repr: ReadRepr::Pooled {
                bytes,
                dtype,
                layout,
            },
        }
    }

    /// The bytes, dtype and layout of a pooled view.
    pub(crate) fn pooled_parts(&self) -> Option<(&'a [u8], DType, &'a Layout)> {
        match self.repr {
            ReadRepr::Pooled {
                bytes,
                dtype,
                layout,
            } => Some((bytes, dtype, layout)),
            ReadRepr::External { .. } => None,
        }
    }

    pub(crate) fn of_external(payload: &'a dyn ExternalPayload, shape: &'a [usize]) -> Self {
        Self {
            repr: ReadRepr::External { payload, shape },
        }
    }

    /// The element type.
    ///
    /// ```
    /// use ferropool::{DType, Tensor, TensorRead};
    /// let t = Tensor::from_slice(&[1.0f64], &[1])?;
    /// assert_eq!(TensorRead::from_tensor(&t).dtype(), DType::F64);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn dtype(&self) -> DType {
        match self.repr {
            ReadRepr::Pooled { dtype, .. } => dtype,
            ReadRepr::External { payload, .. } => DType::External(payload.tag()),
        }
    }

    /// The shape.
    ///
    /// ```
    /// use ferropool::{DType, Tensor, TensorRead};
    /// let t = Tensor::zeros(DType::F32, &[4, 5])?;
    /// assert_eq!(TensorRead::from_tensor(&t).shape(), &[4, 5]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn shape(&self) -> &'a [usize] {
        match self.repr {
            ReadRepr::Pooled { layout, .. } => layout.shape(),
            ReadRepr::External { shape, .. } => shape,
        }
    }

    /// Element strides (empty for an external payload).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::F32, &[2, 3])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// assert_eq!(group.read_view(transposed)?.strides(), &[1, 3]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn strides(&self) -> &'a [usize] {
        match self.repr {
            ReadRepr::Pooled { layout, .. } => layout.strides(),
            ReadRepr::External { .. } => &[],
        }
    }

    /// Element offset of the first element (0 for an external payload).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let second_row = group.narrow(slots[0], 0, 1, 1)?;
    /// assert_eq!(group.read_view(second_row)?.offset(), 2);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn offset(&self) -> usize {
        match self.repr {
            ReadRepr::Pooled { layout, .. } => layout.offset(),
            ReadRepr::External { .. } => 0,
        }
    }

    /// Whether the elements are row-major and gapless.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::U8, &[2, 3])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// assert!(group.read_view(slots[0])?.is_contiguous());
    /// assert!(!group.read_view(transposed)?.is_contiguous());
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn is_contiguous(&self) -> bool {
        match self.repr {
            ReadRepr::Pooled { layout, .. } => layout.is_contiguous(),
            ReadRepr::External { .. } => false,
        }
    }

    /// All elements the view's buffer holds, as `T`s.
    fn elements<T: Element>(&self) -> Result<(&'a [T], &'a Layout), TensorError> {
        match self.repr {
            ReadRepr::Pooled {
                bytes,
                dtype,
                layout,
            } => {
                check_dtype::<T>(dtype)?;
                // SAFETY: invariant on `ReadRepr::Pooled`: initialised `T`s (the dtype matched),
                // aligned to 8 >= align_of::<T>(), living as long as 'a.
                let all = unsafe {
                    std::slice::from_raw_parts(
                        bytes.as_ptr().cast::<T>(),
                        bytes.len() / std::mem::size_of::<T>(),
                    )
                };
                Ok((all, layout))
            }
            ReadRepr::External { payload, .. } => Err(TensorError::ExternalDType {
                operation: "typed read",
                dtype: DType::External(payload.tag()),
            }),
        }
    }

    /// The elements as a slice, when the view is contiguous.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let second_row = group.narrow(slots[0], 0, 1, 1)?;
    /// assert_eq!(group.read_view(second_row)?.as_slice::<i32>()?, &[3, 4]);
    /// let column = group.narrow(slots[0], 1, 0, 1)?;
    /// assert!(group.read_view(column)?.as_slice::<i32>().is_err()); // strided
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`], [`TensorError::ExternalDType`], or
    /// [`TensorError::NotContiguous`] (use [`to_vec`](Self::to_vec) or [`get`](Self::get)).
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T], TensorError> {
        let (all, layout) = self.elements::<T>()?;
        if !layout.is_contiguous() {
            return Err(TensorError::NotContiguous {
                operation: "TensorRead::as_slice",
            });
        }
        Ok(&all[layout.offset()..layout.offset() + layout.numel()])
    }

    /// One element, by multi-index (any layout).
    ///
    /// ```
    /// use ferropool::{Tensor, TensorRead};
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2])?;
    /// let view = TensorRead::from_tensor(&t);
    /// assert_eq!(view.get::<i32>(&[1, 0])?, 3);
    /// assert!(view.get::<i32>(&[2, 0]).is_err()); // out of range
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`], [`TensorError::ExternalDType`] or
    /// [`TensorError::IndexOutOfRange`].
    pub fn get<T: Element>(&self, index: &[usize]) -> Result<T, TensorError> {
        let (all, layout) = self.elements::<T>()?;
        Ok(all[layout.element_offset(index)?])
    }

    /// The elements in row-major order, copied out (any layout).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// assert_eq!(group.read_view(transposed)?.to_vec::<i32>()?, vec![1, 3, 2, 4]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] or [`TensorError::ExternalDType`];
    /// [`TensorError::CopyTooLarge`] if the copy's memory is refused (a broadcast view, with
    /// zero strides, may count far more elements than its buffer holds).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Layout, Tensor, TensorError};
    /// let t = Tensor::from_slice(&[1.0f64], &[1])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let everywhere = Layout::new(&[1 << 31, 1 << 30], &[0, 0], 0)?; // one element, 2^61 times
    /// let view = group.add_view(slots[0], everywhere)?;
    /// let copy = group.read_view(view)?.to_vec::<f64>();
    /// assert!(matches!(copy, Err(TensorError::CopyTooLarge { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, TensorError> {
        let (all, layout) = self.elements::<T>()?;
        if layout.is_contiguous() {
            return Ok(all[layout.offset()..layout.offset() + layout.numel()].to_vec());
        }
        // Refused when the bytes overflow as well as when the system refuses them.
        let mut out = Vec::new();
        out.try_reserve_exact(layout.numel())
            .map_err(|_| TensorError::CopyTooLarge {
                elements: layout.numel(),
                element_bytes: std::mem::size_of::<T>(),
            })?;
        for_each_offset(layout, |offset| out.push(all[offset]));
        Ok(out)
    }

    /// The view's elements in raw form, for any tensor library to wrap without copying: the
    /// slice of elements covering the view's extent (element `index` lives at
    /// `elements[offset + Σ index[k] * strides[k]]`), with the shape, strides and offset.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let column = group.narrow(slots[0], 1, 1, 1)?; // the middle column, strided
    /// let view = group.read_view(column)?;
    /// let raw = view.raw::<f32>()?;
    /// assert_eq!((raw.shape, raw.strides, raw.offset), (&[2, 1][..], &[3, 1][..], 1));
    /// assert_eq!(raw.elements[raw.offset + raw.strides[0]], 5.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] or [`TensorError::ExternalDType`].
    pub fn raw<T: Element>(&self) -> Result<RawView<'a, T>, TensorError> {
        let (all, layout) = self.elements::<T>()?;
        Ok(RawView {
            elements: all,
            shape: layout.shape(),
            strides: layout.strides(),
            offset: layout.offset(),
        })
    }

    /// The view as an [`ndarray::ArrayViewD`], without copying, whatever its layout
    /// (permuted and narrowed views included). Feature `ndarray`.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// let array = group.read_view(transposed)?.to_ndarray::<f32>()?;
    /// assert_eq!(array.shape(), &[3, 2]);
    /// assert_eq!(array[[2, 1]], 6.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] or [`TensorError::ExternalDType`].
    #[cfg(feature = "ndarray")]
    pub fn to_ndarray<T: Element>(&self) -> Result<ndarray::ArrayViewD<'a, T>, TensorError> {
        let raw = self.raw::<T>()?;
        let (shape, from) =
            super::bytes::ndarray_shape(raw.shape, raw.strides, raw.offset, raw.elements.len());
        ndarray::ArrayView::from_shape(shape, raw.elements.get(from..).unwrap_or_default())
            .map_err(super::bytes::ndarray_refused)
    }

    /// The caller-owned payload, if the view is of a `P`.
    ///
    /// ```
    /// use ferropool::{Tensor, TensorRead};
    /// # #[derive(Debug)]
    /// # struct Opaque(Vec<usize>);
    /// # impl ferropool::ExternalPayload for Opaque {
    /// #     fn tag(&self) -> u32 { 7 }
    /// #     fn shape(&self) -> &[usize] { &self.0 }
    /// # }
    /// let t = Tensor::external(Opaque(vec![2]))?;
    /// let view = TensorRead::from_tensor(&t);
    /// assert!(view.external::<Opaque>().is_some_and(|p| p.0 == [2]));
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn external<P: ExternalPayload>(&self) -> Option<&'a P> {
        match self.repr {
            ReadRepr::External { payload, .. } => (payload as &dyn Any).downcast_ref(),
            ReadRepr::Pooled { .. } => None,
        }
    }
}

/// A view's elements in raw form (see [`TensorRead::raw`]).
///
/// ```
/// use ferropool::{RawView, Tensor, TensorRead};
/// let t = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[3, 2])?;
/// let raw: RawView<'_, u8> = TensorRead::from_tensor(&t).raw()?;
/// assert_eq!((raw.shape, raw.strides, raw.offset), (&[3, 2][..], &[2, 1][..], 0));
/// assert_eq!(raw.elements.len(), 6);
/// # Ok::<(), ferropool::TensorError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RawView<'a, T> {
    /// Every element the view's buffer holds; the view's own lie within it.
    pub elements: &'a [T],
    /// The shape.
    pub shape: &'a [usize],
    /// Element strides, one per dimension.
    pub strides: &'a [usize],
    /// Element offset of the first element in `elements`.
    pub offset: usize,
}

/// Calls `f` with the element offset of every element of `layout`, in row-major order.
pub(crate) fn for_each_offset(layout: &Layout, mut f: impl FnMut(usize)) {
    let shape = layout.shape();
    if shape.contains(&0) {
        return;
    }
    let mut index = vec![0usize; shape.len()];
    let mut offset = layout.offset();
    loop {
        f(offset);
        // Odometer increment from the last dimension.
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            index[k] += 1;
            if index[k] < shape[k] {
                // Within the view's extent (checked when the layout was built): no overflow.
                offset += layout.strides()[k];
                break;
            }
            // Back to this dimension's first element: the steps taken along it, undone.
            offset -= layout.strides()[k] * (shape[k] - 1);
            index[k] = 0;
        }
    }
}

impl std::fmt::Debug for TensorRead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorRead")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("offset", &self.offset())
            .finish()
    }
}
