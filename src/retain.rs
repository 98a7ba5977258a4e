//! Retained values: read-only handles to saved tensors that many threads read at once while
//! a backward pass is replayed.

use std::collections::HashMap;
use std::fmt;

use crate::error::{Error, ErrorPhase, Result};
use crate::group::{AllocationGroup, DescriptorSlot, TensorValue};
use crate::sync::Arc;
use crate::tensor::{DType, Layout, Tensor, TensorRead};

/// A read-only retained tensor handle backed by one allocation group owner.
///
/// Cloning the handle retains the group container and descriptor metadata (one atomic
/// increment); it never clones a physical allocation. Creating another physical value
/// remains an explicit tensor operation at the caller's boundary.
///
/// ```
/// use ferropool::{RetainedValue, Tensor};
/// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2])?);
/// let for_replay = saved.clone(); // no bytes copied
/// let sum: f32 = std::thread::spawn(move || {
///     for_replay.tensor_read().unwrap().as_slice::<f32>().unwrap().iter().sum()
/// })
/// .join()
/// .unwrap();
/// assert_eq!(sum, 3.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RetainedValue {
    /// The container and the shape together, so that a clone is one atomic increment (a
    /// shape kept beside the `Arc` would clone a boxed slice with every handle).
    inner: Arc<Retained>,
    dtype: DType,
}

/// What the handles of one retained value share.
#[derive(Debug)]
struct Retained {
    container: RetentionContainer,
    shape: Box<[usize]>,
    /// For a pooled value, its view resolved once, at retention: the layout copied here (next
    /// to the reference count, so a read touches no arena record) and the bytes.
    ///
    /// Invariant: `bytes` points into a buffer of the group that `container` holds a handle
    /// to. The buffer neither moves nor changes while any handle to the group exists,
    /// because changing a group needs its only handle and `container` holds one that is
    /// never handed out mutably.
    view: Option<FrozenView>,
}

#[derive(Debug)]
struct FrozenView {
    bytes: *const u8,
    len: usize,
    dtype: DType,
    layout: Layout,
}

// SAFETY: `FrozenView` points at immutable data owned, through the group handle in the same
// `Retained`, by a `Send + Sync` group; sharing or sending it shares only reads of that data.
unsafe impl Send for Retained {}
// SAFETY: as above.
unsafe impl Sync for Retained {}

/// What one retained handle holds.
///
/// ```
/// use ferropool::{AllocationGroup, RetainedValue, RetentionContainer, Tensor};
/// let (group, slots) = AllocationGroup::from_tensors([Tensor::from_slice(&[1u8, 2], &[2])?])?;
/// let saved = RetainedValue::from_group(&group, slots[0])?;
/// let RetentionContainer::Pooled { group: held, .. } = saved.container() else { panic!() };
/// assert_eq!(held.handles(), 2); // `group` and the retained handle
/// # Ok::<(), ferropool::Error>(())
/// ```
// The pooled variant owns an allocation group handle inline; boxing it would add an
// allocation to every retained value on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum RetentionContainer {
    /// Pooled storage owned through an allocation group and one descriptor slot.
    Pooled {
        /// The group (a shared handle).
        group: AllocationGroup,
        /// The descriptor read by the handle.
        slot: DescriptorSlot,
    },
    /// A caller-owned value the runtime retains without taking pool ownership.
    ///
    /// The value returns to its owner when the handle drops, and the runtime never
    /// substitutes it for pooled storage.
    CallerOwned {
        /// Boxed because a tensor value is much larger than the pooled variant.
        tensor: Box<Tensor>,
    },
}

impl fmt::Debug for RetainedValue {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("RetainedValue")
            .field("container", &self.inner.container)
            .field("dtype", &self.dtype)
            .field("shape", &self.inner.shape)
            .finish_non_exhaustive()
    }
}

const TRANSFER_FAILED: &str = "a TensorValue could not be transferred into its retention group";

impl RetainedValue {
    /// Move an owned tensor value into a retained group-backed handle.
    ///
    /// ```
    /// use ferropool::{RetainedValue, Tensor, TensorValue};
    /// let value = TensorValue::from_tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2])?);
    /// let saved = RetainedValue::from_tensor_value(value)?;
    /// assert_eq!(saved.tensor_read()?.to_vec::<f32>()?, [1.0, 2.0]);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Returns [`Error::RuntimeState`] when the value's descriptor cannot be transferred into
    /// a retention allocation group.
    pub fn from_tensor_value(value: TensorValue) -> Result<Self> {
        match value.try_into_group_parts() {
            Ok((group, slot, dtype, shape)) => Ok(Self::new(
                RetentionContainer::Pooled { group, slot },
                dtype,
                shape.into_boxed_slice(),
            )),
            Err(value) => {
                let failed = |source| Error::RuntimeState {
                    operation: "RetainedValue::from_tensor_value",
                    phase: ErrorPhase::Execution,
                    message: TRANSFER_FAILED.into(),
                    source,
                };
                let tensor = value.into_tensor().map_err(|e| failed(Some(e)))?;
                if !tensor.dtype().is_external() {
                    return Err(failed(None));
                }
                // A caller-owned payload is retained directly: it owns no pooled storage, so
                // there is no group and nothing returns to a pool when the handle drops.
                let dtype = tensor.dtype();
                let shape = tensor.shape().into();
                Ok(Self::new(
                    RetentionContainer::CallerOwned {
                        tensor: Box::new(tensor),
                    },
                    dtype,
                    shape,
                ))
            }
        }
    }

    /// Move an owned compact tensor into a retained group-backed handle.
    ///
    /// ```
    /// use ferropool::{RetainedValue, Tensor};
    /// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[3i32, 4], &[2])?);
    /// assert_eq!(saved.tensor_read()?.get::<i32>(&[1])?, 4);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    ///
    /// # Panics
    ///
    /// Panics only if the validated compact tensor cannot produce its valid allocation-group
    /// descriptor, which indicates an internal invariant violation.
    pub fn from_tensor(tensor: Tensor) -> Self {
        // A compact tensor always has a valid descriptor, so this conversion cannot fail
        // after the tensor owner has been constructed.
        Self::from_tensor_value(TensorValue::from_tensor(tensor))
            .expect("compact tensor retention must have a valid descriptor")
    }

    /// Retains one descriptor of a shared group without moving the group: the handle holds
    /// a group reference (one atomic increment), so several descriptors of one group can be
    /// retained and read concurrently.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, RetainedValue, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2])?;
    /// let (group, slots) = AllocationGroup::from_tensors([t])?;
    /// let saved = RetainedValue::from_group(&group, slots[0])?;
    /// drop(group); // the retained handle keeps the group alive
    /// assert_eq!(saved.tensor_read()?.to_vec::<i32>()?, [1, 2, 3, 4]);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Group`] if `slot` is not a live descriptor of `group`.
    pub fn from_group(group: &AllocationGroup, slot: DescriptorSlot) -> Result<Self> {
        let (dtype, shape) = group.describe(slot)?;
        Ok(Self::new(
            RetentionContainer::Pooled {
                group: group.clone(),
                slot,
            },
            dtype,
            shape.into_boxed_slice(),
        ))
    }

    fn new(container: RetentionContainer, dtype: DType, shape: Box<[usize]>) -> Self {
        let view = match &container {
            RetentionContainer::Pooled { group, slot } => group
                .read_view(*slot)
                .ok()
                .and_then(|read| read.pooled_parts())
                .map(|(bytes, dtype, layout)| FrozenView {
                    bytes: bytes.as_ptr(),
                    len: bytes.len(),
                    dtype,
                    layout: layout.clone(),
                }),
            RetentionContainer::CallerOwned { .. } => None,
        };
        Self {
            inner: Arc::new(Retained {
                container,
                shape,
                view,
            }),
            dtype,
        }
    }

    /// The element type.
    ///
    /// ```
    /// use ferropool::{DType, RetainedValue, Tensor};
    /// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[1.0f64], &[1])?);
    /// assert_eq!(saved.dtype(), DType::F64);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    ///
    /// ```
    /// use ferropool::{RetainedValue, Tensor};
    /// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[0u8; 6], &[2, 3])?);
    /// assert_eq!(saved.shape(), &[2, 3]);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// What the handle holds.
    ///
    /// ```
    /// use ferropool::{RetainedValue, RetentionContainer, Tensor};
    /// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[1u8], &[1])?);
    /// assert!(matches!(saved.container(), RetentionContainer::Pooled { .. }));
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub fn container(&self) -> &RetentionContainer {
        &self.inner.container
    }

    /// Borrow the retained descriptor for one read-only execution boundary.
    ///
    /// ```
    /// use ferropool::{RetainedValue, Tensor};
    /// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3])?);
    /// let read = saved.tensor_read()?;
    /// assert_eq!(read.as_slice::<f32>()?.iter().sum::<f32>(), 6.0);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Returns [`Error::RuntimeState`] when the retained descriptor is vacant, out of bounds,
    /// or otherwise invalid in its allocation group.
    #[inline]
    pub fn tensor_read(&self) -> Result<TensorRead<'_>> {
        if let Some(view) = &self.inner.view {
            // SAFETY: invariant on `Retained::view`: the bytes stay valid and unchanged while
            // `self` (a handle to the group) lives.
            let bytes = unsafe { std::slice::from_raw_parts(view.bytes, view.len) };
            return Ok(TensorRead::pooled(bytes, view.dtype, &view.layout));
        }
        match &self.inner.container {
            RetentionContainer::Pooled { group, slot } => group.read_view(*slot).map_err(|error| {
                Error::runtime_state_from(
                    "RetainedValue::tensor_read",
                    ErrorPhase::Execution,
                    "the retained descriptor cannot be read",
                    error,
                )
            }),
            RetentionContainer::CallerOwned { tensor } => Ok(TensorRead::from_tensor(tensor)),
        }
    }
}

/// Retained inputs of one checkpoint, by input key.
///
/// ```
/// use std::sync::Arc;
/// use ferropool::{RetainedInputMap, RetainedValue, Tensor};
/// let mut inputs = RetainedInputMap::new();
/// let x = RetainedValue::from_tensor(Tensor::from_slice(&[1.0f32], &[1])?);
/// inputs.insert("x", Arc::new(x));
/// assert_eq!(inputs["x"].shape(), &[1]);
/// # Ok::<(), ferropool::Error>(())
/// ```
pub type RetainedInputMap<K> = HashMap<K, Arc<RetainedValue>>;
