//! Tensors: dtypes, layouts, owned compact tensors in pooled buffers, caller-owned external
//! payloads, and borrowed read-only views.

pub(crate) mod bytes;
mod dtype;
mod error;
mod layout;
mod read;
mod uninit;

pub use dtype::{DType, Element};
pub use error::TensorError;
pub use layout::Layout;
pub use read::{RawView, TensorRead};
pub use uninit::UninitTensor;

use std::any::Any;
use std::fmt;

use crate::pool::{BufferPool, PoolBuffer, PoolError};
#[cfg(feature = "ndarray")]
use bytes::ndarray_view_mut;
use bytes::{byte_count, check_dtype, pooled_bytes};
use layout::numel;
use read::for_each_offset;

/// A caller-owned value retained by the runtime as is (`DType::External(tag)`).
///
/// It never enters a pool: it goes back to its owner (its `Drop` runs) when the last handle
/// to it drops. Readers get it back with [`TensorRead::external`].
///
/// ```
/// use ferropool::{DType, ExternalPayload, Tensor};
/// #[derive(Debug)]
/// struct Handle(Vec<usize>);
/// impl ExternalPayload for Handle {
///     fn tag(&self) -> u32 { 7 }
///     fn shape(&self) -> &[usize] { &self.0 }
/// }
/// assert_eq!(Tensor::external(Handle(vec![2, 3]))?.dtype(), DType::External(7));
/// # Ok::<(), ferropool::TensorError>(())
/// ```
pub trait ExternalPayload: Any + Send + Sync + fmt::Debug {
    /// The tag of its `DType::External(tag)`.
    fn tag(&self) -> u32;
    /// Its logical shape.
    fn shape(&self) -> &[usize];
}

/// A tensor: an owned compact (row-major, offset 0) array in a pooled buffer, or a
/// caller-owned external payload.
///
/// ```
/// use ferropool::{DType, Tensor};
/// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(t.dtype(), DType::F32);
/// assert_eq!(t.as_slice::<f32>()?, &[1.0, 2.0, 3.0, 4.0]);
/// assert!(t.as_slice::<i32>().is_err()); // typed reads check the dtype
/// # Ok::<(), ferropool::TensorError>(())
/// ```
pub struct Tensor {
    repr: Repr,
}

enum Repr {
    /// Invariant: `buffer` holds `layout.numel() * dtype.size_of()` initialised bytes, written
    /// as elements of `dtype`; `layout` is contiguous with offset 0.
    Pooled {
        buffer: PoolBuffer,
        dtype: DType,
        layout: Layout,
    },
    /// Invariant: the element count of `shape` (copied from the payload when the tensor was
    /// built) fits in `usize`.
    External {
        payload: Box<dyn ExternalPayload>,
        shape: Box<[usize]>,
    },
}

impl Tensor {
    /// A tensor of `shape` copied from `data`, in the global pool.
    ///
    /// ```
    /// use ferropool::Tensor;
    /// let t = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[3, 2])?;
    /// assert_eq!(t.shape(), &[3, 2]);
    /// assert!(Tensor::from_slice(&[1u8, 2, 3], &[2, 2]).is_err()); // 3 elements, not 4
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::ShapeMismatch`] if `data.len()` is not the shape's element count;
    /// [`TensorError::Pool`] if the pool refuses.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Self, TensorError> {
        Self::from_slice_in(BufferPool::global(), data, shape)
    }

    /// As [`from_slice`](Self::from_slice), in `pool`.
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let t = Tensor::from_slice_in(&pool, &[1.0f64, 2.0], &[2])?;
    /// assert_eq!(t.as_slice::<f64>()?, &[1.0, 2.0]);
    /// drop(t);
    /// assert_eq!(pool.stats().in_use_bytes, 0); // the buffer is back in `pool`
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_slice`](Self::from_slice).
    pub fn from_slice_in<T: Element>(
        pool: &BufferPool,
        data: &[T],
        shape: &[usize],
    ) -> Result<Self, TensorError> {
        let layout = Self::checked_layout(shape, data.len())?;
        let mut buffer = pool.alloc(std::mem::size_of_val(data))?;
        // SAFETY: `data` as bytes: any initialised `T: Element` is plain old data.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        buffer.copy_from_slice(bytes)?;
        Ok(Self::pooled(buffer, T::DTYPE, layout))
    }

    /// A tensor of `shape` from `data`, in the global pool (the `Vec`'s memory is freed).
    ///
    /// ```
    /// use ferropool::Tensor;
    /// let t = Tensor::from_vec(vec![1i64, 2, 3], &[3])?;
    /// assert_eq!(t.as_slice::<i64>()?, &[1, 2, 3]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_slice`](Self::from_slice).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Self, TensorError> {
        Self::from_slice(&data, shape)
    }

    /// As [`from_vec`](Self::from_vec), in `pool`.
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let t = Tensor::from_vec_in(&pool, vec![true, false], &[2])?;
    /// assert_eq!(t.as_slice::<bool>()?, &[true, false]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_slice`](Self::from_slice).
    pub fn from_vec_in<T: Element>(
        pool: &BufferPool,
        data: Vec<T>,
        shape: &[usize],
    ) -> Result<Self, TensorError> {
        Self::from_slice_in(pool, &data, shape)
    }

    /// A tensor of `shape` from the first elements of `iter`, in `pool`, written in place.
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let t = Tensor::from_iter_in(&pool, (1..=6).map(|i| i as f32), &[2, 3])?;
    /// assert_eq!(t.as_slice::<f32>()?[5], 6.0);
    /// assert!(Tensor::from_iter_in(&pool, 0i32.., &[2, 3]).is_err()); // more than 6
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::ShapeMismatch`] if `iter` yields fewer or more elements than the shape
    /// holds; [`TensorError::Pool`] if the pool refuses.
    pub fn from_iter_in<T: Element>(
        pool: &BufferPool,
        iter: impl IntoIterator<Item = T>,
        shape: &[usize],
    ) -> Result<Self, TensorError> {
        let layout = Layout::contiguous(shape)?;
        let count = layout.numel();
        let bytes = byte_count(count, std::mem::size_of::<T>(), shape)?;
        let mut buffer = pool.alloc(bytes)?;
        let base = buffer.as_mut_ptr().cast::<T>();
        let mut iter = iter.into_iter();
        for i in 0..count {
            let Some(value) = iter.next() else {
                return Err(TensorError::ShapeMismatch {
                    shape: shape.to_vec(),
                    expected_elements: count,
                    found_elements: i,
                });
            };
            // SAFETY: `i < count` and the buffer holds `count * size_of::<T>()` bytes (checked
            // above), aligned for `T` (pool alignment is at least 8).
            unsafe { base.add(i).write(value) };
        }
        // One more element is enough to know there are too many: the iterator is not drained
        // (it may never end).
        if iter.next().is_some() {
            return Err(TensorError::TooManyElements {
                shape: shape.to_vec(),
                expected_elements: count,
            });
        }
        // SAFETY: the loop wrote all `count` elements.
        unsafe { buffer.assume_init() };
        Ok(Self::pooled(buffer, T::DTYPE, layout))
    }

    /// A zero-filled tensor in the global pool.
    ///
    /// ```
    /// use ferropool::{DType, Tensor};
    /// let t = Tensor::zeros(DType::I32, &[2, 2])?;
    /// assert_eq!(t.as_slice::<i32>()?, &[0; 4]);
    /// assert!(Tensor::zeros(DType::External(7), &[2]).is_err());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::ExternalDType`] for an external dtype; [`TensorError::Pool`].
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Self, TensorError> {
        Self::zeros_in(BufferPool::global(), dtype, shape)
    }

    /// A zero-filled tensor in `pool`.
    ///
    /// ```
    /// use ferropool::{BufferPool, DType, Tensor};
    /// let pool = BufferPool::new();
    /// let t = Tensor::zeros_in(&pool, DType::F64, &[3])?;
    /// assert_eq!(t.as_slice::<f64>()?, &[0.0; 3]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`zeros`](Self::zeros).
    pub fn zeros_in(pool: &BufferPool, dtype: DType, shape: &[usize]) -> Result<Self, TensorError> {
        let size = dtype.size_of().ok_or(TensorError::ExternalDType {
            operation: "Tensor::zeros",
            dtype,
        })?;
        let layout = Layout::contiguous(shape)?;
        let bytes = byte_count(layout.numel(), size, shape)?;
        // All-zero bytes are a valid value of every element type (0, 0.0, false).
        let buffer = pool.alloc_zeroed(bytes)?;
        Ok(Self::pooled(buffer, dtype, layout))
    }

    /// A tensor that holds a caller-owned payload as is. Its shape is read once, now.
    ///
    /// ```
    /// use ferropool::{DType, Tensor};
    /// # #[derive(Debug)]
    /// # struct Opaque(Vec<usize>);
    /// # impl ferropool::ExternalPayload for Opaque {
    /// #     fn tag(&self) -> u32 { 7 }
    /// #     fn shape(&self) -> &[usize] { &self.0 }
    /// # }
    /// let t = Tensor::external(Opaque(vec![4, 2]))?;
    /// assert_eq!((t.dtype(), t.shape()), (DType::External(7), &[4, 2][..]));
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::InvalidLayout`] if the element count of the payload's shape overflows
    /// `usize`; the payload is dropped.
    pub fn external(payload: impl ExternalPayload) -> Result<Self, TensorError> {
        let shape: Box<[usize]> = payload.shape().into();
        numel(&shape)?;
        Ok(Self {
            repr: Repr::External {
                payload: Box::new(payload),
                shape,
            },
        })
    }

    /// Wraps a buffer already holding `layout.numel()` initialised elements of `dtype`.
    pub(crate) fn pooled(buffer: PoolBuffer, dtype: DType, layout: Layout) -> Self {
        debug_assert!(layout.is_contiguous() && layout.offset() == 0);
        Self {
            repr: Repr::Pooled {
                buffer,
                dtype,
                layout,
            },
        }
    }

    fn checked_layout(shape: &[usize], len: usize) -> Result<Layout, TensorError> {
        let expected = numel(shape)?;
        if expected != len {
            return Err(TensorError::ShapeMismatch {
                shape: shape.to_vec(),
                expected_elements: expected,
                found_elements: len,
            });
        }
        Layout::contiguous(shape)
    }

    /// The element type.
    ///
    /// ```
    /// use ferropool::{DType, Tensor};
    /// let t = Tensor::from_slice(&[1.5f32], &[1])?;
    /// assert_eq!(t.dtype(), DType::F32);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn dtype(&self) -> DType {
        match &self.repr {
            Repr::Pooled { dtype, .. } => *dtype,
            Repr::External { payload, .. } => DType::External(payload.tag()),
        }
    }

    /// The shape.
    ///
    /// ```
    /// use ferropool::{DType, Tensor};
    /// let t = Tensor::zeros(DType::U8, &[2, 3, 4])?;
    /// assert_eq!(t.shape(), &[2, 3, 4]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn shape(&self) -> &[usize] {
        match &self.repr {
            Repr::Pooled { layout, .. } => layout.shape(),
            Repr::External { shape, .. } => shape,
        }
    }

    /// Number of elements.
    ///
    /// ```
    /// use ferropool::{DType, Tensor};
    /// let t = Tensor::zeros(DType::U8, &[2, 3, 4])?;
    /// assert_eq!(t.numel(), 24);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn numel(&self) -> usize {
        match &self.repr {
            Repr::Pooled { layout, .. } => layout.numel(),
            // The count fits (invariant on `Repr::External`); counted with 0 first all the
            // same: a zero-element shape may list huge dimensions before its 0.
            Repr::External { shape, .. } => layout::element_count(shape).unwrap_or(usize::MAX),
        }
    }

    /// Whether this holds a caller-owned payload.
    ///
    /// ```
    /// use ferropool::Tensor;
    /// # #[derive(Debug)]
    /// # struct Opaque(Vec<usize>);
    /// # impl ferropool::ExternalPayload for Opaque {
    /// #     fn tag(&self) -> u32 { 7 }
    /// #     fn shape(&self) -> &[usize] { &self.0 }
    /// # }
    /// assert!(Tensor::external(Opaque(vec![3]))?.is_external());
    /// assert!(!Tensor::from_slice(&[1u8], &[1])?.is_external());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn is_external(&self) -> bool {
        matches!(self.repr, Repr::External { .. })
    }

    /// The elements as a slice of `T`.
    ///
    /// ```
    /// use ferropool::Tensor;
    /// let t = Tensor::from_slice(&[1i8, -1], &[2])?;
    /// assert_eq!(t.as_slice::<i8>()?, &[1, -1]);
    /// assert!(t.as_slice::<u8>().is_err()); // the dtype is i8
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] unless `T` is this tensor's element type (external
    /// payloads have no typed slice; use [`external_payload`](Self::external_payload)).
    pub fn as_slice<T: Element>(&self) -> Result<&[T], TensorError> {
        TensorRead::from_tensor(self).as_slice()
    }

    /// The elements as a mutable slice of `T`.
    ///
    /// ```
    /// use ferropool::{DType, Tensor};
    /// let mut t = Tensor::zeros(DType::F32, &[3])?;
    /// t.as_mut_slice::<f32>()?[1] = 2.5;
    /// assert_eq!(t.as_slice::<f32>()?, &[0.0, 2.5, 0.0]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`as_slice`](Self::as_slice).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        match &mut self.repr {
            Repr::Pooled {
                buffer,
                dtype,
                layout,
            } => {
                check_dtype::<T>(*dtype)?;
                let len = layout.numel();
                // SAFETY: invariant on `Repr::Pooled`: `len` initialised `T`s, aligned (pool
                // alignment >= 8), exclusively borrowed through `&mut self`.
                Ok(unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr().cast(), len) })
            }
            Repr::External { payload, .. } => Err(TensorError::DTypeMismatch {
                expected: T::DTYPE,
                found: DType::External(payload.tag()),
            }),
        }
    }

    /// The tensor as an [`ndarray::ArrayViewD`], without copying (the same as
    /// `TensorRead::from_tensor(&t).to_ndarray()`). Feature `ndarray`.
    ///
    /// ```
    /// use ferropool::Tensor;
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3])?;
    /// let array = t.to_ndarray::<i32>()?;
    /// assert_eq!(array.shape(), &[2, 3]);
    /// assert_eq!(array[[1, 0]], 4);
    /// assert_eq!(array.t()[[2, 1]], 6); // ndarray's own views on top
    /// assert!(t.to_ndarray::<f32>().is_err()); // the dtype is i32
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] unless `T` is the tensor's element type;
    /// [`TensorError::ExternalDType`] for a caller-owned payload.
    #[cfg(feature = "ndarray")]
    pub fn to_ndarray<T: Element>(&self) -> Result<ndarray::ArrayViewD<'_, T>, TensorError> {
        self.read().to_ndarray()
    }

    /// The tensor as an [`ndarray::ArrayViewMutD`], without copying: writes through the
    /// array land in the tensor's pooled buffer. A tensor is compact (row-major), so its
    /// elements never alias. Feature `ndarray`.
    ///
    /// ```
    /// use ferropool::{DType, Tensor};
    /// use ndarray::Axis;
    /// let mut t = Tensor::zeros(DType::F32, &[2, 3])?;
    /// let mut array = t.to_ndarray_mut::<f32>()?;
    /// array.index_axis_mut(Axis(0), 1).fill(2.0); // row 1
    /// array.index_axis_mut(Axis(1), 0).fill(-1.0); // column 0
    /// assert_eq!(t.as_slice::<f32>()?, &[-1.0, 0.0, 0.0, -1.0, 2.0, 2.0]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::DTypeMismatch`] unless `T` is the tensor's element type;
    /// [`TensorError::ExternalDType`] for a caller-owned payload.
    #[cfg(feature = "ndarray")]
    pub fn to_ndarray_mut<T: Element>(
        &mut self,
    ) -> Result<ndarray::ArrayViewMutD<'_, T>, TensorError> {
        let layout = match &self.repr {
            Repr::Pooled { layout, .. } => layout.clone(),
            Repr::External { payload, .. } => {
                return Err(TensorError::ExternalDType {
                    operation: "Tensor::to_ndarray_mut",
                    dtype: DType::External(payload.tag()),
                })
            }
        };
        ndarray_view_mut(self.as_mut_slice::<T>()?, &layout)
    }

    /// A tensor in `pool` holding a copy of `array`'s elements in logical (row-major) order,
    /// whatever the array's layout: one contiguous copy when the array is in standard
    /// layout, an element-by-element walk otherwise (transposed, sliced, broadcast arrays).
    /// Feature `ndarray`.
    ///
    /// This always copies: an ndarray array owns its elements in its own `Vec` (or borrows
    /// them), and pool memory is the pool's, so the elements can only become a pooled
    /// tensor by being copied into a pool buffer. To skip the copy, build the tensor in the
    /// pool first and fill it through [`to_ndarray_mut`](Self::to_ndarray_mut). (An array
    /// can be retained as is, with no copy, only as a caller-owned payload: a type of yours
    /// implementing [`ExternalPayload`] that holds it, given to [`external`](Self::external).
    /// Its memory stays ndarray's; such a tensor has no typed reads and cannot join a group.)
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// use ndarray::{array, Axis};
    /// let pool = BufferPool::new();
    /// let a = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
    /// let t = Tensor::from_ndarray_in(&pool, &a)?; // standard layout: one memcpy
    /// assert_eq!(
    ///     (t.shape(), t.as_slice::<f32>()?),
    ///     (&[2, 3][..], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0][..])
    /// );
    /// let transposed = Tensor::from_ndarray_in(&pool, &a.t())?; // strided: walked in order
    /// assert_eq!(transposed.as_slice::<f32>()?, &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    /// let column = Tensor::from_ndarray_in(&pool, &a.index_axis(Axis(1), 2))?;
    /// assert_eq!(column.as_slice::<f32>()?, &[3.0, 6.0]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Pool`] if the pool refuses the buffer.
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray_in<T, S, D>(
        pool: &BufferPool,
        array: &ndarray::ArrayBase<S, D>,
    ) -> Result<Self, TensorError>
    where
        T: Element,
        S: ndarray::Data<Elem = T>,
        D: ndarray::Dimension,
    {
        match array.as_slice() {
            Some(elements) => Self::from_slice_in(pool, elements, array.shape()),
            None => Self::from_iter_in(pool, array.iter().copied(), array.shape()),
        }
    }

    /// The caller-owned payload, if it is a `P`.
    ///
    /// ```
    /// use ferropool::Tensor;
    /// # #[derive(Debug)]
    /// # struct Opaque(Vec<usize>);
    /// # impl ferropool::ExternalPayload for Opaque {
    /// #     fn tag(&self) -> u32 { 7 }
    /// #     fn shape(&self) -> &[usize] { &self.0 }
    /// # }
    /// let t = Tensor::external(Opaque(vec![2]))?;
    /// assert!(t.external_payload::<Opaque>().is_some_and(|p| p.0 == [2]));
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn external_payload<P: ExternalPayload>(&self) -> Option<&P> {
        match &self.repr {
            Repr::External { payload, .. } => (&**payload as &dyn Any).downcast_ref(),
            Repr::Pooled { .. } => None,
        }
    }

    /// The buffer, dtype and layout of a pooled tensor; an external one comes back in `Err`.
    // An external tensor comes back whole, by move; boxing it would allocate on that path.
    #[allow(clippy::result_large_err)]
    pub(crate) fn into_pooled_parts(self) -> Result<(PoolBuffer, DType, Layout), Self> {
        match self.repr {
            Repr::Pooled {
                buffer,
                dtype,
                layout,
            } => Ok((buffer, dtype, layout)),
            repr @ Repr::External { .. } => Err(Self { repr }),
        }
    }

    pub(crate) fn read(&self) -> TensorRead<'_> {
        match &self.repr {
            Repr::Pooled {
                buffer,
                dtype,
                layout,
            } => TensorRead::pooled(pooled_bytes(buffer), *dtype, layout),
            Repr::External { payload, shape } => TensorRead::of_external(&**payload, shape),
        }
    }
}

/// A compact (row-major, offset 0) copy of a pooled view's elements, in a buffer from
/// `alloc`, which is given the byte count.
pub(crate) fn compact_copy(
    view: &TensorRead<'_>,
    alloc: impl FnOnce(usize) -> Result<PoolBuffer, PoolError>,
) -> Result<Tensor, TensorError> {
    let Some((bytes, dtype, layout)) = view.pooled_parts() else {
        return Err(TensorError::ExternalDType {
            operation: "a compact copy",
            dtype: view.dtype(),
        });
    };
    let size = dtype.size_of().expect("pooled dtypes have a size");
    let total = byte_count(layout.numel(), size, layout.shape())?;
    let mut buffer = alloc(total)?;
    if layout.is_contiguous() {
        let start = layout.offset() * size;
        buffer.copy_from_slice(&bytes[start..start + total])?;
    } else {
        let out = buffer.as_uninit_mut();
        let mut at = 0;
        for_each_offset(layout, |offset| {
            let element = &bytes[offset * size..(offset + 1) * size];
            for (to, &from) in out[at..at + size].iter_mut().zip(element) {
                to.write(from);
            }
            at += size;
        });
        debug_assert_eq!(at, total);
        // SAFETY: the walk visited all `numel` elements and wrote `size` bytes for each.
        unsafe { buffer.assume_init() };
    }
    Ok(Tensor::pooled(
        buffer,
        dtype,
        Layout::contiguous(layout.shape())?,
    ))
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Tensor");
        s.field("dtype", &self.dtype())
            .field("shape", &self.shape());
        if let Repr::External { payload, .. } = &self.repr {
            s.field("payload", payload);
        }
        s.finish()
    }
}
