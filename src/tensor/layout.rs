//! Layouts: shape, element strides and element offset, checked on construction.

use super::TensorError;

/// Where a tensor's elements sit in a buffer: element `i` (a multi-index) lives at element
/// `offset + Σ i[k] * strides[k]`.
///
/// ```
/// use ferropool::Layout;
/// let rows = Layout::contiguous(&[2, 3])?;
/// assert_eq!(rows.strides(), &[3, 1]);
/// let cols = rows.permute(&[1, 0])?;
/// assert_eq!((cols.shape(), cols.strides()), (&[3, 2][..], &[1, 3][..]));
/// assert!(!cols.is_contiguous());
/// let second_row = rows.narrow(0, 1, 1)?;
/// assert_eq!(second_row.offset(), 3);
/// # Ok::<(), ferropool::TensorError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    offset: usize,
    /// Derived from the fields above when the layout is built (it never changes after), so
    /// reads do not recompute them: the product of `shape` (it fits: constructors check),
    numel: usize,
    /// and whether the elements are row-major and gapless from `offset` on.
    contiguous: bool,
}

/// Dimensions inline up to rank 4 (no allocation for the common case), boxed beyond.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Dims {
    Inline(u8, [usize; 4]),
    Heap(Box<[usize]>),
}

impl std::ops::Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self {
            Self::Inline(len, dims) => &dims[..usize::from(*len)],
            Self::Heap(dims) => dims,
        }
    }
}

impl std::ops::DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            Self::Inline(len, dims) => &mut dims[..usize::from(*len)],
            Self::Heap(dims) => dims,
        }
    }
}

impl From<&[usize]> for Dims {
    fn from(dims: &[usize]) -> Self {
        if dims.len() <= 4 {
            let mut inline = [0; 4];
            inline[..dims.len()].copy_from_slice(dims);
            Self::Inline(dims.len() as u8, inline)
        } else {
            Self::Heap(dims.into())
        }
    }
}

impl FromIterator<usize> for Dims {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let (mut inline, mut len) = ([0; 4], 0);
        let mut iter = iter.into_iter();
        while let Some(dim) = iter.next() {
            if len == inline.len() {
                let mut heap = inline.to_vec();
                heap.push(dim);
                heap.extend(iter);
                return Self::Heap(heap.into());
            }
            inline[len] = dim;
            len += 1;
        }
        Self::Inline(len as u8, inline)
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Layout {
    /// A row-major layout of `shape` at offset 0.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let layout = Layout::contiguous(&[2, 3, 4])?;
    /// assert_eq!(layout.strides(), &[12, 4, 1]);
    /// assert!(Layout::contiguous(&[usize::MAX, 2]).is_err()); // too many elements
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::InvalidLayout`] if the element count overflows `usize`.
    pub fn contiguous(shape: &[usize]) -> Result<Self, TensorError> {
        numel(shape)?;
        let mut strides = Dims::from(shape);
        let mut stride = 1usize;
        for (k, &dim) in shape.iter().enumerate().rev() {
            strides[k] = stride;
            stride = stride.saturating_mul(dim);
        }
        Ok(Self::from_parts(shape.into(), strides, 0))
    }

    /// A layout with explicit strides and offset.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let every_other = Layout::new(&[4], &[2], 1)?;
    /// assert_eq!(every_other.element_offset(&[3])?, 7);
    /// assert!(Layout::new(&[2, 2], &[1], 0).is_err()); // one stride for two dimensions
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::InvalidLayout`] if `shape` and `strides` differ in length or the extent
    /// overflows `usize`.
    pub fn new(shape: &[usize], strides: &[usize], offset: usize) -> Result<Self, TensorError> {
        if shape.len() != strides.len() {
            return Err(TensorError::InvalidLayout {
                reason: format!(
                    "shape has {} dimensions but strides have {}",
                    shape.len(),
                    strides.len()
                ),
            });
        }
        numel(shape)?;
        let layout = Self::from_parts(shape.into(), strides.into(), offset);
        layout.extent()?;
        Ok(layout)
    }

    /// The shape.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let layout = Layout::contiguous(&[2, 3])?.permute(&[1, 0])?;
    /// assert_eq!(layout.shape(), &[3, 2]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Element strides, one per dimension.
    ///
    /// ```
    /// use ferropool::Layout;
    /// assert_eq!(Layout::contiguous(&[4, 5, 6])?.strides(), &[30, 6, 1]);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element offset of the first element.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let last_rows = Layout::contiguous(&[4, 3])?.narrow(0, 2, 2)?;
    /// assert_eq!(last_rows.offset(), 6);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    ///
    /// ```
    /// use ferropool::Layout;
    /// assert_eq!(Layout::contiguous(&[2, 3, 4])?.numel(), 24);
    /// assert_eq!(Layout::contiguous(&[2, 0])?.numel(), 0);
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    #[inline]
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Whether the elements are row-major and gapless (from `offset` on).
    ///
    /// ```
    /// use ferropool::Layout;
    /// let rows = Layout::contiguous(&[2, 3])?;
    /// assert!(rows.is_contiguous());
    /// assert!(!rows.narrow(1, 0, 2)?.is_contiguous()); // a gap after each row
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }

    /// A layout from its parts, with the derived fields computed. The caller has checked
    /// that the element count of `shape` fits in `usize`.
    fn from_parts(shape: Dims, strides: Dims, offset: usize) -> Self {
        let mut expected = 1usize;
        let mut contiguous = true;
        for (&dim, &stride) in shape.iter().zip(&*strides).rev() {
            contiguous &= dim == 1 || stride == expected;
            expected = expected.saturating_mul(dim);
        }
        Self {
            // Never `None` (the caller checked); were it, `usize::MAX` over-counts, and every
            // byte count built on it fails its checks instead of under-counting.
            numel: element_count(&shape).unwrap_or(usize::MAX),
            shape,
            strides,
            offset,
            contiguous,
        }
    }

    /// Elements a buffer needs to hold every element: one past the farthest element.
    fn extent(&self) -> Result<usize, TensorError> {
        if self.shape.contains(&0) {
            return Ok(self.offset);
        }
        let overflow = || TensorError::InvalidLayout {
            reason: "the layout's extent overflows usize".into(),
        };
        let mut last = self.offset;
        for (&dim, &stride) in self.shape.iter().zip(&*self.strides) {
            let reach = (dim - 1).checked_mul(stride).ok_or_else(overflow)?;
            last = last.checked_add(reach).ok_or_else(overflow)?;
        }
        last.checked_add(1).ok_or_else(overflow)
    }

    /// Checks that every element lies within a buffer of `elements` elements.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let layout = Layout::new(&[2, 2], &[4, 1], 0)?; // its last element is element 5
    /// assert!(layout.check_within(6).is_ok());
    /// assert!(layout.check_within(5).is_err());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::OutOfBounds`] saying how many elements the layout needs.
    pub fn check_within(&self, elements: usize) -> Result<(), TensorError> {
        let needed = self.extent()?;
        if needed > elements {
            return Err(TensorError::OutOfBounds {
                needed,
                available: elements,
            });
        }
        Ok(())
    }

    /// The same elements under another shape; needs a contiguous layout.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let flat = Layout::contiguous(&[2, 3])?.reshape(&[6])?;
    /// assert_eq!((flat.shape(), flat.strides()), (&[6][..], &[1][..]));
    /// assert!(Layout::contiguous(&[2, 3])?.reshape(&[4]).is_err());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::NotContiguous`] or [`TensorError::ShapeMismatch`].
    pub fn reshape(&self, shape: &[usize]) -> Result<Self, TensorError> {
        if !self.is_contiguous() {
            return Err(TensorError::NotContiguous {
                operation: "reshape",
            });
        }
        if numel(shape)? != self.numel() {
            return Err(TensorError::ShapeMismatch {
                shape: shape.to_vec(),
                expected_elements: numel(shape)?,
                found_elements: self.numel(),
            });
        }
        let mut layout = Self::contiguous(shape)?;
        layout.offset = self.offset;
        Ok(layout)
    }

    /// Dimensions reordered: dimension `k` of the result is dimension `axes[k]` of `self`.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let layout = Layout::contiguous(&[2, 3, 4])?.permute(&[2, 0, 1])?;
    /// assert_eq!((layout.shape(), layout.strides()), (&[4, 2, 3][..], &[1, 12, 4][..]));
    /// assert!(Layout::contiguous(&[2, 3])?.permute(&[0, 0]).is_err());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::InvalidLayout`] unless `axes` is a permutation of `0..rank`.
    pub fn permute(&self, axes: &[usize]) -> Result<Self, TensorError> {
        let rank = self.shape.len();
        let mut seen = vec![false; rank];
        if axes.len() != rank
            || axes
                .iter()
                .any(|&a| a >= rank || std::mem::replace(&mut seen[a], true))
        {
            return Err(TensorError::InvalidLayout {
                reason: format!("{axes:?} is not a permutation of 0..{rank}"),
            });
        }
        Ok(Self::from_parts(
            axes.iter().map(|&a| self.shape[a]).collect(),
            axes.iter().map(|&a| self.strides[a]).collect(),
            self.offset,
        ))
    }

    /// `len` elements of dimension `axis` starting at `start`.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let middle = Layout::contiguous(&[5])?.narrow(0, 1, 3)?;
    /// assert_eq!((middle.shape(), middle.offset()), (&[3][..], 1));
    /// assert!(Layout::contiguous(&[5])?.narrow(0, 4, 2).is_err()); // past the end
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::InvalidLayout`] if `axis` or the range is out of the shape.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self, TensorError> {
        let Some(&dim) = self.shape.get(axis) else {
            return Err(TensorError::InvalidLayout {
                reason: format!("axis {axis} of a rank-{} layout", self.shape.len()),
            });
        };
        if start.checked_add(len).is_none_or(|end| end > dim) {
            return Err(TensorError::InvalidLayout {
                reason: format!("range {start}..{start}+{len} of a dimension of {dim}"),
            });
        }
        // Checked: a zero-element layout skips the extent check, so its strides and offset
        // may be anything.
        let offset = start
            .checked_mul(self.strides[axis])
            .and_then(|skip| skip.checked_add(self.offset))
            .ok_or_else(|| TensorError::InvalidLayout {
                reason: format!(
                    "narrowing axis {axis} from {start} moves the offset {} past usize::MAX",
                    self.offset
                ),
            })?;
        let mut shape = self.shape.clone();
        shape[axis] = len;
        Ok(Self::from_parts(shape, self.strides.clone(), offset))
    }

    /// The element offset of a multi-index.
    ///
    /// ```
    /// use ferropool::Layout;
    /// let layout = Layout::contiguous(&[2, 3])?;
    /// assert_eq!(layout.element_offset(&[1, 2])?, 5);
    /// assert!(layout.element_offset(&[2, 0]).is_err());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::IndexOutOfRange`] if the index has the wrong rank or exceeds the shape.
    pub fn element_offset(&self, index: &[usize]) -> Result<usize, TensorError> {
        if index.len() != self.shape.len() || index.iter().zip(&*self.shape).any(|(i, d)| i >= d) {
            return Err(TensorError::IndexOutOfRange {
                index: index.to_vec(),
                shape: self.shape.to_vec(),
            });
        }
        // Within the extent, which construction checked, so this cannot overflow; checked
        // all the same, as every offset computation is.
        index
            .iter()
            .zip(&*self.strides)
            .try_fold(self.offset, |offset, (&i, &stride)| {
                i.checked_mul(stride)?.checked_add(offset)
            })
            .ok_or_else(|| TensorError::InvalidLayout {
                reason: format!("the offset of index {index:?} overflows usize"),
            })
    }

    /// Checks that no two indices reach the same element, as a mutable view needs (the
    /// array of `TensorWrite::to_ndarray_mut`, feature `ndarray`, for one).
    ///
    /// The proof: with the axes of length 1 left out (they take no step) and the others
    /// sorted by stride, each stride is at least the span of the axes before it (one past
    /// their farthest step, counting from the first element). A zero stride, or two axes
    /// whose steps interleave, fail it: a few interleaved layouts whose elements happen to
    /// be distinct fail it too. A layout of no element passes.
    ///
    /// ```
    /// use ferropool::{Layout, TensorError};
    /// let rows = Layout::contiguous(&[2, 3])?;
    /// assert!(rows.check_unaliased().is_ok());
    /// assert!(rows.permute(&[1, 0])?.check_unaliased().is_ok()); // transposed: distinct
    /// let broadcast = Layout::new(&[4, 3], &[0, 1], 0)?; // every row is the same row
    /// assert!(matches!(broadcast.check_unaliased(), Err(TensorError::AliasedElements { .. })));
    /// let overlapping = Layout::new(&[3, 3], &[2, 1], 0)?; // [0, 2] and [1, 0]: element 2
    /// assert!(overlapping.check_unaliased().is_err());
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::AliasedElements`] when the strides do not prove the elements
    /// distinct; [`TensorError::InvalidLayout`] if a span overflows `usize` (construction
    /// checked the extent, so it does not).
    pub fn check_unaliased(&self) -> Result<(), TensorError> {
        if self.numel == 0 {
            return Ok(());
        }
        let mut axes: Vec<(usize, usize)> = self
            .strides
            .iter()
            .zip(&*self.shape)
            .filter(|&(_, &dim)| dim > 1)
            .map(|(&stride, &dim)| (stride, dim))
            .collect();
        axes.sort_unstable();
        let overflow = || TensorError::InvalidLayout {
            reason: "the span of the layout's axes overflows usize".into(),
        };
        // Elements from the first element to one past the farthest the axes so far reach.
        let mut span = 1usize;
        for (stride, dim) in axes {
            if stride < span {
                return Err(TensorError::AliasedElements {
                    shape: self.shape.to_vec(),
                    strides: self.strides.to_vec(),
                });
            }
            let reach = (dim - 1).checked_mul(stride).ok_or_else(overflow)?;
            span = span.checked_add(reach).ok_or_else(overflow)?;
        }
        Ok(())
    }
}

/// The element count of `shape`, checked for overflow: 0 when any dimension is 0, however
/// large the others (so the count does not depend on the order of the dimensions, and a
/// permuted layout counts as the original did).
pub(crate) fn numel(shape: &[usize]) -> Result<usize, TensorError> {
    element_count(shape).ok_or_else(|| TensorError::InvalidLayout {
        reason: format!("the element count of shape {shape:?} overflows usize"),
    })
}

/// [`numel`] as an `Option`: `None` if the count overflows.
pub(crate) fn element_count(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}
