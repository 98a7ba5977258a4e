//! Retained values: read-only handles to saved tensors that many threads read at once while
//! a backward pass is replayed.

mod recompute;

pub use recompute::{EvictableTensor, Recompute};

use std::collections::HashMap;
use std::fmt;

use crate::error::{Error, ErrorPhase, Result};
use crate::group::{AllocationGroup, DescriptorSlot, TensorValue};
use crate::pool::BufferPool;
use crate::sync::{Arc, AtomicBool, Ordering};
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
pub struct RetainedValue {
    /// The container and the shape together, so that a clone is one atomic increment (a
    /// shape kept beside the `Arc` would clone a boxed slice with every handle).
    inner: Arc<Retained>,
    dtype: DType,
    /// Whether this handle pins its evictable value (see [`tensor_read`](Self::tensor_read)):
    /// set by the handle's first read of an evictable value, given back when the handle
    /// drops. Never set for other values. Each handle has its own: a clone starts unpinned.
    pinned: AtomicBool,
}

impl Clone for RetainedValue {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            dtype: self.dtype,
            pinned: AtomicBool::new(false),
        }
    }
}

impl Drop for RetainedValue {
    fn drop(&mut self) {
        // Only an evictable value's handle can hold a pin: other handles read no atomic.
        if let Some(value) = self.evictable_tensor() {
            if self.pinned.load(Ordering::Acquire) {
                value.unpin();
            }
        }
    }
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
    /// A pooled tensor its pool may evict when the budget refuses a request, recomputed by
    /// the next read (see [`RetainedValue::evictable`]).
    Evictable(EvictableTensor),
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
            RetentionContainer::CallerOwned { .. } | RetentionContainer::Evictable(_) => None,
        };
        Self {
            inner: Arc::new(Retained {
                container,
                shape,
                view,
            }),
            dtype,
            pinned: AtomicBool::new(false),
        }
    }

    /// Retains a pooled tensor that its pool may evict, to make room for a request its
    /// budget refuses, and that a read then recomputes with `recompute` (its inputs first,
    /// if they were evicted too), under the same budget. Eviction takes the unpinned value
    /// with the lowest cost over bytes times staleness, preferring blocks of the class the
    /// request needs; a value being read is never evicted (see
    /// [`tensor_read`](Self::tensor_read) and [`read`](Self::read)), and two threads that read
    /// an evicted value recompute it once.
    ///
    /// ```
    /// use ferropool::{BufferPool, PoolConfig, Recompute, RetainedValue, Tensor};
    /// let pool = BufferPool::with_config(PoolConfig {
    ///     budget: Some(2 << 20),
    ///     ..PoolConfig::default()
    /// })?;
    /// let ones = |pool: &BufferPool| {
    ///     Tensor::from_iter_in(pool, std::iter::repeat_n(1.0f32, 1 << 18), &[1 << 18])
    /// };
    /// let recompute = { let pool = pool.clone(); Recompute::new([], move |_| Ok(ones(&pool)?)) };
    /// let saved = RetainedValue::evictable(&pool, ones(&pool)?, recompute)?; // 1 MiB
    /// let other = pool.alloc(3 << 19)?; // 1.5 MiB: only fits once `saved` is evicted
    /// assert!(!saved.is_resident());
    /// drop(other);
    /// assert_eq!(saved.read()?.tensor().as_slice::<f32>()?[0], 1.0); // recomputed
    /// assert_eq!((pool.stats().evictions, pool.stats().recomputations), (1, 1));
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::RuntimeState`] if `tensor` is a caller-owned payload or comes from another
    /// pool than `pool`.
    pub fn evictable(pool: &BufferPool, tensor: Tensor, recompute: Recompute) -> Result<Self> {
        let dtype = tensor.dtype();
        let shape = tensor.shape().into();
        let value = EvictableTensor::new(pool, tensor, recompute)?;
        Ok(Self::new(
            RetentionContainer::Evictable(value),
            dtype,
            shape,
        ))
    }

    /// The evictable value, if this is one.
    fn evictable_tensor(&self) -> Option<&EvictableTensor> {
        match &self.inner.container {
            RetentionContainer::Evictable(value) => Some(value),
            _ => None,
        }
    }

    /// Whether the value's bytes are in memory now: always, but for an
    /// [evictable](Self::evictable) value that its pool evicted and no read recomputed yet.
    ///
    /// ```
    /// use ferropool::{RetainedValue, Tensor};
    /// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[1u8], &[1])?);
    /// assert!(saved.is_resident());
    /// assert!(!saved.evict()); // not evictable
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub fn is_resident(&self) -> bool {
        self.evictable_tensor()
            .is_none_or(EvictableTensor::is_resident)
    }

    /// Evicts an [evictable](Self::evictable) value now, if no read pins it: its block goes
    /// back to the pool and the next read recomputes it. Whether it was evicted.
    ///
    /// ```
    /// use ferropool::{BufferPool, Recompute, RetainedValue, Tensor};
    /// let pool = BufferPool::new();
    /// let twos = |pool: &BufferPool| Tensor::from_slice_in(pool, &[2i32; 4], &[4]);
    /// let recompute = { let pool = pool.clone(); Recompute::new([], move |_| Ok(twos(&pool)?)) };
    /// let saved = RetainedValue::evictable(&pool, twos(&pool)?, recompute)?;
    /// {
    ///     let read = saved.read()?;
    ///     assert!(!saved.evict(), "a read pins it");
    ///     assert_eq!(read.tensor().get::<i32>(&[3])?, 2);
    /// }
    /// assert!(saved.evict());
    /// assert_eq!(pool.stats().in_use_bytes, 0);
    /// assert_eq!(saved.read()?.tensor().to_vec::<i32>()?, [2; 4]);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    pub fn evict(&self) -> bool {
        self.evictable_tensor()
            .is_some_and(|value| value.handle.evict())
    }

    /// A read guard: the value stays resident (an evictable value is recomputed first if it
    /// was evicted) until the guard drops, and [`ReadGuard::tensor`] reads it meanwhile.
    /// Unlike [`tensor_read`](Self::tensor_read), it pins an evictable value only while the
    /// guard lives.
    ///
    /// ```
    /// use ferropool::{RetainedValue, Tensor};
    /// let saved = RetainedValue::from_tensor(Tensor::from_slice(&[1.5f32, 2.5], &[2])?);
    /// let read = saved.read()?;
    /// assert_eq!(read.tensor().as_slice::<f32>()?, &[1.5, 2.5]);
    /// # Ok::<(), ferropool::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`tensor_read`](Self::tensor_read).
    pub fn read(&self) -> Result<ReadGuard<'_>> {
        let Some(value) = self.evictable_tensor() else {
            return Ok(ReadGuard {
                read: self.tensor_read()?,
                pinned: None,
            });
        };
        value.pin()?;
        Ok(ReadGuard {
            // SAFETY: pinned just above; the guard gives the pin back when it drops, and
            // hands out reads that borrow it.
            read: unsafe { value.read_pinned() },
            pinned: Some(value),
        })
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
    /// An [evictable](Self::evictable) value is recomputed first if it was evicted, and the
    /// read pins it through this handle: it stays resident until the handle drops (the read
    /// borrows the handle, and nothing shorter can be known of it). To pin it for a shorter
    /// while, read through a clone of the handle, or with [`read`](Self::read).
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
            RetentionContainer::Evictable(value) => {
                if !self.pinned.load(Ordering::Acquire) {
                    value.pin()?;
                    if self.pinned.swap(true, Ordering::AcqRel) {
                        value.unpin(); // another thread's read pinned it through this handle
                    }
                }
                // SAFETY: this handle holds a pin until it drops, and the read borrows it.
                Ok(unsafe { value.read_pinned() })
            }
        }
    }
}

/// A read of a retained value that keeps it resident while it lives (see
/// [`RetainedValue::read`]).
pub struct ReadGuard<'a> {
    /// Valid while the guard lives (for an evictable value, only while its pin is held):
    /// handed out only with the guard's own, shorter borrow.
    read: TensorRead<'a>,
    /// The evictable value the guard pins, if the value is one.
    pinned: Option<&'a EvictableTensor>,
}

impl ReadGuard<'_> {
    /// The value's elements, for as long as the guard is borrowed.
    pub fn tensor(&self) -> TensorRead<'_> {
        self.read
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if let Some(value) = self.pinned {
            value.unpin();
        }
    }
}

impl fmt::Debug for ReadGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard")
            .field("dtype", &self.read.dtype())
            .field("shape", &self.read.shape())
            .field("pins", &self.pinned.is_some())
            .finish()
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
