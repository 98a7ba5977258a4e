//! [`UninitTensor`]: a pooled tensor whose elements are not written yet, and
//! [`Tensor::uninit_in`], which makes one (here, beside the type it returns).

use std::fmt;

use super::bytes::byte_count;
use super::dtype::Element;
use super::error::TensorError;
use super::layout::Layout;
use super::Tensor;
use crate::pool::{BufferPool, PoolBuffer};

impl Tensor {
    /// A tensor of `shape` whose elements are not written yet, in `pool`: for a kernel that
    /// overwrites every element anyway, so nothing is zeroed for nothing. Finish it with
    /// [`UninitTensor::init_with`] or [`UninitTensor::copy_from`] (safe), or write through
    /// [`UninitTensor::as_uninit_mut`] and call [`UninitTensor::assume_init`].
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let squares = Tensor::uninit_in::<f32>(&pool, &[2, 2])?.init_with(|i| (i * i) as f32);
    /// assert_eq!(squares.as_slice::<f32>()?, &[0.0, 1.0, 4.0, 9.0]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::InvalidLayout`] if the byte count overflows; [`TensorError::Pool`].
    pub fn uninit_in<T: Element>(
        pool: &BufferPool,
        shape: &[usize],
    ) -> Result<UninitTensor<T>, TensorError> {
        let layout = Layout::contiguous(shape)?;
        let bytes = byte_count(layout.numel(), std::mem::size_of::<T>(), shape)?;
        Ok(UninitTensor {
            buffer: pool.alloc(bytes)?,
            layout,
            element: std::marker::PhantomData,
        })
    }
}

/// A tensor whose elements are not written yet (see [`Tensor::uninit_in`]).
///
/// ```
/// use ferropool::{BufferPool, Tensor, UninitTensor};
/// let pool = BufferPool::new();
/// let uninit: UninitTensor<i32> = Tensor::uninit_in(&pool, &[3])?;
/// let t = uninit.init_with(|i| i as i32 + 1);
/// assert_eq!(t.as_slice::<i32>()?, &[1, 2, 3]);
/// # Ok::<(), ferropool::TensorError>(())
/// ```
pub struct UninitTensor<T: Element> {
    /// Invariant: holds `layout.numel() * size_of::<T>()` bytes, aligned for `T`.
    buffer: PoolBuffer,
    layout: Layout,
    element: std::marker::PhantomData<T>,
}

impl<T: Element> UninitTensor<T> {
    /// The elements, for writing.
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let mut uninit = Tensor::uninit_in::<f32>(&pool, &[2])?;
    /// for (i, element) in uninit.as_uninit_mut().iter_mut().enumerate() {
    ///     element.write(i as f32);
    /// }
    /// let t = unsafe { uninit.assume_init() }; // SAFETY: every element was written
    /// assert_eq!(t.as_slice::<f32>()?, &[0.0, 1.0]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn as_uninit_mut(&mut self) -> &mut [std::mem::MaybeUninit<T>] {
        let len = self.layout.numel();
        // SAFETY: invariant on `buffer`: `len` elements' worth of bytes, aligned for `T`
        // (pool alignment >= 8), exclusively ours; `MaybeUninit` claims nothing about them.
        unsafe { std::slice::from_raw_parts_mut(self.buffer.as_mut_ptr().cast(), len) }
    }

    /// Writes element `i` (row-major) as `f(i)`, for every element, and returns the tensor.
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let t = Tensor::uninit_in::<i64>(&pool, &[3])?.init_with(|i| 10 * i as i64);
    /// assert_eq!(t.as_slice::<i64>()?, &[0, 10, 20]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn init_with(mut self, mut f: impl FnMut(usize) -> T) -> Tensor {
        for (i, element) in self.as_uninit_mut().iter_mut().enumerate() {
            element.write(f(i));
        }
        // SAFETY: the loop wrote every element.
        unsafe { self.assume_init() }
    }

    /// Copies `src` into the elements and returns the tensor.
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let t = Tensor::uninit_in::<f32>(&pool, &[2])?.copy_from(&[0.5, 1.5])?;
    /// assert_eq!(t.as_slice::<f32>()?, &[0.5, 1.5]);
    /// assert!(Tensor::uninit_in::<f32>(&pool, &[2])?.copy_from(&[1.0]).is_err());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::ShapeMismatch`] unless `src` has exactly as many elements (the buffer
    /// is then dropped).
    pub fn copy_from(mut self, src: &[T]) -> Result<Tensor, TensorError> {
        if src.len() != self.layout.numel() {
            return Err(TensorError::ShapeMismatch {
                shape: self.layout.shape().to_vec(),
                expected_elements: self.layout.numel(),
                found_elements: src.len(),
            });
        }
        for (to, &from) in self.as_uninit_mut().iter_mut().zip(src) {
            to.write(from);
        }
        // SAFETY: every element was written.
        Ok(unsafe { self.assume_init() })
    }

    /// The tensor, once every element is written.
    ///
    /// ```
    /// use ferropool::{BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let mut uninit = Tensor::uninit_in::<u8>(&pool, &[4])?;
    /// uninit.as_uninit_mut().fill(std::mem::MaybeUninit::new(9));
    /// // SAFETY: `fill` wrote every element.
    /// let t = unsafe { uninit.assume_init() };
    /// assert_eq!(t.as_slice::<u8>()?, &[9; 4]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Safety
    ///
    /// Every element has been written (through [`as_uninit_mut`](Self::as_uninit_mut), or
    /// through the buffer's pointer by a kernel).
    pub unsafe fn assume_init(mut self) -> Tensor {
        // SAFETY: the caller's contract.
        unsafe { self.buffer.assume_init() };
        Tensor::pooled(self.buffer, T::DTYPE, self.layout)
    }
}

impl<T: Element> fmt::Debug for UninitTensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UninitTensor")
            .field("dtype", &T::DTYPE)
            .field("shape", &self.layout.shape())
            .finish()
    }
}
