//! Allocation groups: one owner of pooled buffers and of any number of typed descriptors
//! (views) over them, whose records live in the process-wide descriptor arena.
//!
//! # Sharing rule
//!
//! [`AllocationGroup`] is a handle: cloning it shares the group (one atomic increment).
//! Reads ([`read_view`](AllocationGroup::read_view)) work through any handle, from any
//! number of threads, without locks. Every change (append, views, extract, remove, write)
//! needs `&mut` on the *only* handle, otherwise it fails with [`GroupError::Shared`]. Hence a
//! descriptor can never be removed while another handle could be reading it, and reads
//! resolve their slot through the arena without even an epoch pin.
//!
//! Each group keeps a table of its live descriptors: a slot is checked against it before
//! the arena is touched (so a removed slot never reaches the arena, whose pages
//! [`AllocationGroup::trim_descriptors`] may release meanwhile), and removing a descriptor,
//! or counting the other views of a buffer, costs O(1).

mod error;
mod value;

pub use error::GroupError;
pub use value::TensorValue;

use std::fmt;
use std::num::NonZeroU64;

use crate::arena::{Key, SlotArena};
use crate::identity::next_identity;
use crate::pool::PoolBuffer;
use crate::sync::Arc;
#[cfg(feature = "ndarray")]
use crate::tensor::ndarray_view_mut;
use crate::tensor::{
    check_dtype, compact_copy, pooled_bytes, DType, Element, Layout, Tensor, TensorError,
    TensorRead,
};

/// A descriptor record in the arena.
#[derive(Debug)]
pub(crate) struct Descriptor {
    buffer: u32,
    dtype: DType,
    layout: Layout,
}

/// The process-wide descriptor arena (per loom execution under loom).
#[cfg(not(loom))]
fn descriptors() -> &'static SlotArena<Descriptor> {
    static ARENA: std::sync::OnceLock<SlotArena<Descriptor>> = std::sync::OnceLock::new();
    ARENA.get_or_init(SlotArena::new)
}

/// Under loom the arena gets a private collector: pinning crossbeam-epoch's default
/// collector from a spawned loom thread makes executions non-deterministic (loom aborts with
/// "Is the model fully deterministic?"), while a private collector created in the same
/// per-execution `lazy_static` runs cleanly. The protocol under test is the same.
#[cfg(loom)]
fn descriptors() -> &'static SlotArena<Descriptor> {
    loom::lazy_static! {
        static ref ARENA: SlotArena<Descriptor> =
            SlotArena::with_collector(crate::sync::epoch::Collector::new());
    }
    &ARENA
}

/// A descriptor's key: which group, which of its views, which arena record. `Copy` and
/// opaque.
///
/// ```
/// use ferropool::{AllocationGroup, DType, Tensor};
/// let t = Tensor::zeros(DType::F32, &[2])?;
/// let (group, slots) = AllocationGroup::from_tensors([t])?;
/// let slot = slots[0]; // `Copy`: a key, not a borrow
/// assert_eq!(group.describe(slot)?, (DType::F32, vec![2]));
/// assert!(AllocationGroup::new().read_view(slot).is_err()); // another group's slot
/// # Ok::<(), ferropool::GroupError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DescriptorSlot {
    key: Key,
    group: NonZeroU64,
    /// Index in the group's table of views.
    view: u32,
}

impl fmt::Debug for DescriptorSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DescriptorSlot(group #{}, view {}, record {} generation {})",
            self.group,
            self.view,
            self.key.index(),
            self.key.generation()
        )
    }
}

/// One owner of pooled buffers and of typed descriptors (views) over them.
///
/// ```
/// use ferropool::{AllocationGroup, Tensor};
/// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
/// let transposed = group.permute(slots[0], &[1, 0])?;     // a view, no copy
/// let view = group.read_view(transposed)?;
/// assert_eq!(view.shape(), &[3, 2]);
/// assert_eq!(view.to_vec::<f32>()?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AllocationGroup {
    inner: Arc<GroupInner>,
}

impl Clone for AllocationGroup {
    /// Shares the group: one atomic increment, no copy.
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct GroupInner {
    id: NonZeroU64,
    /// Buffers by index; `None` once extracted or no longer viewed.
    ///
    /// Invariant: every live view of this group names a `Some` buffer whose initialised
    /// elements cover its layout, and each buffer's `views` counts its live views.
    buffers: Vec<Option<Owned>>,
    /// Arena keys of the live views, by view index; `None` for a removed view.
    ///
    /// Invariant: a `Some` key is live in the descriptor arena, and only this group removes
    /// it: through `&mut` on its unique handle, or when its last handle drops.
    views: Vec<Option<Key>>,
    /// Indices of `None` entries of `views`, for reuse.
    vacant_views: Vec<u32>,
}

/// A buffer of a group and the number of its live views.
struct Owned {
    buffer: PoolBuffer,
    views: u32,
}

impl Drop for GroupInner {
    fn drop(&mut self) {
        let arena = descriptors();
        let guard = arena.pin();
        for key in self.views.drain(..).flatten() {
            // Our own live key (invariant on `views`): removal cannot fail.
            let removed = arena.remove(key, &guard);
            debug_assert!(removed.is_ok(), "{removed:?}");
        }
    }
}

impl AllocationGroup {
    /// An empty group.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let mut group = AllocationGroup::new();
    /// assert!(group.is_empty());
    /// group.append_tensor(Tensor::from_slice(&[1u8], &[1])?)?;
    /// assert_eq!(group.len(), 1);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn new() -> Self {
        Self {
            inner: Arc::new(GroupInner {
                id: next_identity(),
                buffers: Vec::new(),
                views: Vec::new(),
                vacant_views: Vec::new(),
            }),
        }
    }

    /// A group owning `tensors`, with one descriptor each (returned in order).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let a = Tensor::from_slice(&[1.0f32, 2.0], &[2])?;
    /// let b = Tensor::zeros(DType::I64, &[3])?;
    /// let (group, slots) = AllocationGroup::from_tensors([a, b])?;
    /// assert_eq!(group.describe(slots[1])?, (DType::I64, vec![3]));
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GroupError::ExternalPayload`] if a tensor is a caller-owned payload (checked before
    /// anything is moved; the tensors are dropped, so payloads go back to their owners);
    /// [`GroupError::Arena`] if the descriptor arena is full.
    pub fn from_tensors(
        tensors: impl IntoIterator<Item = Tensor>,
    ) -> Result<(Self, Vec<DescriptorSlot>), GroupError> {
        let tensors: Vec<Tensor> = tensors.into_iter().collect();
        if let Some(external) = tensors.iter().find(|t| t.is_external()) {
            return Err(GroupError::ExternalPayload {
                dtype: external.dtype(),
            });
        }
        let mut group = Self::new();
        let slots = tensors
            .into_iter()
            .map(|t| group.append_tensor(t))
            .collect::<Result<_, _>>()?;
        Ok((group, slots))
    }

    /// Moves `tensor`'s buffer into the group and adds a descriptor for it.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let mut group = AllocationGroup::new();
    /// let slot = group.append_tensor(Tensor::from_slice(&[4i32, 5], &[2])?)?;
    /// assert_eq!(group.read_view(slot)?.as_slice::<i32>()?, &[4, 5]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GroupError::ExternalPayload`]; [`GroupError::Shared`]; [`GroupError::Arena`] if
    /// the descriptor arena is full (the tensor is dropped).
    pub fn append_tensor(&mut self, tensor: Tensor) -> Result<DescriptorSlot, GroupError> {
        self.try_append(tensor).map_err(|(error, _)| error)
    }

    /// As [`append_tensor`](Self::append_tensor), handing the tensor back on error.
    // The tensor comes back whole, by move; boxing it would allocate on every append.
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_append(
        &mut self,
        tensor: Tensor,
    ) -> Result<DescriptorSlot, (GroupError, Tensor)> {
        let inner = match self.unique() {
            Ok(inner) => inner,
            Err(error) => return Err((error, tensor)),
        };
        let (buffer, dtype, layout) = match tensor.into_pooled_parts() {
            Ok(parts) => parts,
            Err(tensor) => {
                let dtype = tensor.dtype();
                return Err((GroupError::ExternalPayload { dtype }, tensor));
            }
        };
        let index = inner.buffers.len() as u32;
        inner.buffers.push(Some(Owned { buffer, views: 0 }));
        match Self::insert(inner, index, dtype, layout) {
            Ok(slot) => Ok(slot),
            Err((error, layout)) => {
                let owned = inner.buffers.pop().flatten().expect("pushed just above");
                Err((error, Tensor::pooled(owned.buffer, dtype, layout)))
            }
        }
    }

    /// Adds a view of buffer `buffer` to the arena and the group's table; a refused layout
    /// comes back with the error.
    // Moved back whole, not boxed: the error path is rare, the success path is every view.
    #[allow(clippy::result_large_err)]
    fn insert(
        inner: &mut GroupInner,
        buffer: u32,
        dtype: DType,
        layout: Layout,
    ) -> Result<DescriptorSlot, (GroupError, Layout)> {
        let key = descriptors()
            .try_insert(Descriptor {
                buffer,
                dtype,
                layout,
            })
            .map_err(|(error, refused)| (GroupError::Arena(error), refused.layout))?;
        let view = match inner.vacant_views.pop() {
            Some(view) => {
                inner.views[view as usize] = Some(key);
                view
            }
            None => {
                inner.views.push(Some(key));
                (inner.views.len() - 1) as u32
            }
        };
        if let Some(owned) = &mut inner.buffers[buffer as usize] {
            owned.views += 1;
        }
        Ok(DescriptorSlot {
            key,
            group: inner.id,
            view,
        })
    }

    /// The only handle's group, for a change.
    fn unique(&mut self) -> Result<&mut GroupInner, GroupError> {
        let handles = Arc::strong_count(&self.inner);
        Arc::get_mut(&mut self.inner).ok_or(GroupError::Shared { handles })
    }

    /// Checks that `slot` is a live view of this group.
    #[inline]
    fn check(&self, slot: DescriptorSlot) -> Result<(), GroupError> {
        if slot.group != self.inner.id {
            return Err(GroupError::ForeignSlot {
                slot,
                group: self.inner.id.get(),
            });
        }
        match self.inner.views.get(slot.view as usize) {
            Some(Some(key)) if *key == slot.key => Ok(()),
            _ => Err(GroupError::Removed { slot }),
        }
    }

    /// This group's descriptor for `slot`.
    #[inline]
    fn descriptor(&self, slot: DescriptorSlot) -> Result<&Descriptor, GroupError> {
        self.check(slot)?;
        // SAFETY: `check` found the key in this group's table of live views, so it is live
        // (invariant on `views`); this group removes it only through `&mut` on its unique
        // handle or when its last handle drops, and `&self` excludes both while the returned
        // reference lives.
        let descriptor = unsafe { descriptors().get_unpinned(slot.key) };
        Ok(descriptor.expect("a live view resolves (invariant on `views`)"))
    }

    /// A read-only view of `slot`. Lock-free; works through any handle, from any thread.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3])?;
    /// let (group, slots) = AllocationGroup::from_tensors([t])?;
    /// let reader = group.clone(); // a shared handle reads too
    /// assert_eq!(reader.read_view(slots[0])?.get::<f32>(&[2])?, 3.0);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GroupError::ForeignSlot`] for another group's slot; [`GroupError::Removed`] for a
    /// removed one.
    #[inline]
    pub fn read_view(&self, slot: DescriptorSlot) -> Result<TensorRead<'_>, GroupError> {
        let descriptor = self.descriptor(slot)?;
        let owned = self.owned(descriptor.buffer);
        Ok(TensorRead::pooled(
            pooled_bytes(&owned.buffer),
            descriptor.dtype,
            &descriptor.layout,
        ))
    }

    /// The buffer a live view names (invariant on `buffers`).
    fn owned(&self, buffer: u32) -> &Owned {
        self.inner.buffers[buffer as usize]
            .as_ref()
            .expect("a live view's buffer is present (invariant on `buffers`)")
    }

    /// The dtype and shape of `slot`.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::BF16, &[4, 2])?;
    /// let (group, slots) = AllocationGroup::from_tensors([t])?;
    /// assert_eq!(group.describe(slots[0])?, (DType::BF16, vec![4, 2]));
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read_view`](Self::read_view).
    pub fn describe(&self, slot: DescriptorSlot) -> Result<(DType, Vec<usize>), GroupError> {
        let d = self.descriptor(slot)?;
        Ok((d.dtype, d.layout.shape().to_vec()))
    }

    /// An exclusive writable view of `slot` (the only handle, borrowed mutably).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::F32, &[2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// group.write_view(slots[0])?.set(&[1], 7.0f32)?;
    /// assert_eq!(group.read_view(slots[0])?.to_vec::<f32>()?, vec![0.0, 7.0]);
    /// let shared = group.clone();
    /// assert!(group.write_view(slots[0]).is_err()); // not the only handle
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read_view`](Self::read_view), and [`GroupError::Shared`].
    pub fn write_view(&mut self, slot: DescriptorSlot) -> Result<TensorWrite<'_>, GroupError> {
        let (buffer, dtype, layout) = {
            let d = self.descriptor(slot)?;
            (d.buffer, d.dtype, d.layout.clone())
        };
        let inner = self.unique()?;
        let bytes = inner.buffers[buffer as usize]
            .as_mut()
            .and_then(|owned| owned.buffer.as_bytes_mut())
            .expect("a live view's buffer is present and initialised");
        Ok(TensorWrite {
            bytes,
            dtype,
            layout,
        })
    }

    /// Adds a descriptor viewing `of`'s buffer through `layout`.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Layout, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4, 5, 6], &[6])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let evens = group.add_view(slots[0], Layout::new(&[3], &[2], 1)?)?;
    /// assert_eq!(group.read_view(evens)?.to_vec::<i32>()?, vec![2, 4, 6]);
    /// assert!(group.add_view(slots[0], Layout::contiguous(&[7])?).is_err()); // past the end
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GroupError::Tensor`] with [`TensorError::OutOfBounds`] if the layout reaches past
    /// the buffer; [`GroupError::Shared`]; [`GroupError::Arena`]; the errors of
    /// [`read_view`](Self::read_view).
    pub fn add_view(
        &mut self,
        of: DescriptorSlot,
        layout: Layout,
    ) -> Result<DescriptorSlot, GroupError> {
        let (buffer, dtype) = {
            let d = self.descriptor(of)?;
            (d.buffer, d.dtype)
        };
        let bytes = self.owned(buffer).buffer.len();
        let size = dtype.size_of().expect("pooled dtypes have a size");
        layout.check_within(bytes / size)?;
        let inner = self.unique()?;
        Self::insert(inner, buffer, dtype, layout).map_err(|(error, _)| error)
    }

    /// A view of `of` under another shape (needs a contiguous layout).
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[6])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let matrix = group.reshape(slots[0], &[2, 3])?;
    /// assert_eq!(group.read_view(matrix)?.get::<u8>(&[1, 0])?, 4);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`add_view`](Self::add_view), and the errors of [`Layout::reshape`].
    pub fn reshape(
        &mut self,
        of: DescriptorSlot,
        shape: &[usize],
    ) -> Result<DescriptorSlot, GroupError> {
        let layout = self.descriptor(of)?.layout.reshape(shape)?;
        self.add_view(of, layout)
    }

    /// A view of `of` with its dimensions reordered.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2, 3, 4], &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// assert_eq!(group.read_view(transposed)?.to_vec::<u8>()?, vec![1, 3, 2, 4]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`add_view`](Self::add_view), and the errors of [`Layout::permute`].
    pub fn permute(
        &mut self,
        of: DescriptorSlot,
        axes: &[usize],
    ) -> Result<DescriptorSlot, GroupError> {
        let layout = self.descriptor(of)?.layout.permute(axes)?;
        self.add_view(of, layout)
    }

    /// A view of `len` elements of `of`'s dimension `axis`, from `start`.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[3, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let last_rows = group.narrow(slots[0], 0, 1, 2)?;
    /// assert_eq!(group.read_view(last_rows)?.as_slice::<u8>()?, &[3, 4, 5, 6]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`add_view`](Self::add_view), and the errors of [`Layout::narrow`].
    pub fn narrow(
        &mut self,
        of: DescriptorSlot,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Result<DescriptorSlot, GroupError> {
        let layout = self.descriptor(of)?.layout.narrow(axis, start, len)?;
        self.add_view(of, layout)
    }

    /// Removes `slot`'s descriptor and returns its buffer as a tensor, without copying. Only
    /// when no other descriptor views the buffer and the view covers it compactly.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, GroupError, Tensor};
    /// let t = Tensor::from_slice(&[1u8, 2, 3, 4], &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let row = group.narrow(slots[0], 0, 0, 1)?;
    /// assert!(matches!(group.try_extract(slots[0]), Err(GroupError::Aliased { aliases: 1 })));
    /// group.remove(row)?;
    /// let t = group.try_extract(slots[0])?; // no copy
    /// assert_eq!((t.shape(), group.len()), (&[2, 2][..], 0));
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GroupError::Aliased`]; [`GroupError::Tensor`] with [`TensorError::NotContiguous`]
    /// for a strided or partial view; [`GroupError::Shared`]; the errors of
    /// [`read_view`](Self::read_view). The group is unchanged on error.
    pub fn try_extract(&mut self, slot: DescriptorSlot) -> Result<Tensor, GroupError> {
        let (buffer, dtype, layout) = {
            let d = self.descriptor(slot)?;
            (d.buffer, d.dtype, d.layout.clone())
        };
        self.unique()?;
        let owned = self.owned(buffer);
        if owned.views > 1 {
            return Err(GroupError::Aliased {
                aliases: owned.views as usize - 1,
            });
        }
        let size = dtype.size_of().expect("pooled dtypes have a size");
        let covers = layout
            .numel()
            .checked_mul(size)
            .is_some_and(|bytes| bytes == owned.buffer.len());
        if !layout.is_contiguous() || layout.offset() != 0 || !covers {
            return Err(TensorError::NotContiguous {
                operation: "AllocationGroup::try_extract",
            }
            .into());
        }
        let owned = self.remove_view(slot)?.expect("its only view was removed");
        Ok(Tensor::pooled(owned.buffer, dtype, layout))
    }

    /// Removes `slot`'s descriptor and returns its elements as a compact tensor: the buffer
    /// itself when [`try_extract`](Self::try_extract) can, otherwise a copy in the pool the
    /// buffer came from.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor};
    /// let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// let transposed = group.permute(slots[0], &[1, 0])?;
    /// let copy = group.into_tensor(transposed)?; // strided: a compact copy
    /// assert_eq!(copy.as_slice::<i32>()?, &[1, 3, 2, 4]);
    /// assert_eq!(group.len(), 1); // `transposed` was removed
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GroupError::Shared`]; the errors of [`read_view`](Self::read_view); a pool error
    /// for the copy.
    pub fn into_tensor(&mut self, slot: DescriptorSlot) -> Result<Tensor, GroupError> {
        match self.try_extract(slot) {
            Ok(tensor) => Ok(tensor),
            Err(
                GroupError::Aliased { .. } | GroupError::Tensor(TensorError::NotContiguous { .. }),
            ) => {
                let copy = self.copy_out(slot)?;
                self.remove(slot)?;
                Ok(copy)
            }
            Err(other) => Err(other),
        }
    }

    /// A compact copy of `slot`'s elements, in the pool its buffer came from.
    pub(crate) fn copy_out(&self, slot: DescriptorSlot) -> Result<Tensor, GroupError> {
        let buffer = &self.owned(self.descriptor(slot)?.buffer).buffer;
        Ok(compact_copy(&self.read_view(slot)?, |bytes| {
            buffer.alloc_sibling(bytes)
        })?)
    }

    /// Removes `slot`'s descriptor; its buffer goes back to the pool when no other
    /// descriptor views it.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, BufferPool, Tensor};
    /// let pool = BufferPool::new();
    /// let t = Tensor::from_slice_in(&pool, &[1.0f64; 4], &[4])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// group.remove(slots[0])?;
    /// assert_eq!(pool.stats().in_use_bytes, 0); // its last view: the buffer is back
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`GroupError::Shared`]; the errors of [`read_view`](Self::read_view).
    pub fn remove(&mut self, slot: DescriptorSlot) -> Result<(), GroupError> {
        self.remove_view(slot).map(drop)
    }

    /// Removes a live view; returns its buffer if that was the buffer's last view.
    fn remove_view(&mut self, slot: DescriptorSlot) -> Result<Option<Owned>, GroupError> {
        let buffer = self.descriptor(slot)?.buffer;
        let inner = self.unique()?;
        let arena = descriptors();
        arena
            .remove(slot.key, &arena.pin())
            .expect("a live view is removed once (invariant on `views`)");
        inner.views[slot.view as usize] = None;
        inner.vacant_views.push(slot.view);
        let entry = &mut inner.buffers[buffer as usize];
        let owned = entry.as_mut().expect("a live view's buffer is present");
        owned.views -= 1;
        Ok(if owned.views == 0 { entry.take() } else { None })
    }

    /// Live descriptors.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::U8, &[2, 2])?;
    /// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
    /// group.permute(slots[0], &[1, 0])?;
    /// assert_eq!(group.len(), 2); // two views of one buffer
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.inner.views.len() - self.inner.vacant_views.len()
    }

    /// Whether the group has no descriptors.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let mut group = AllocationGroup::new();
    /// let slot = group.append_tensor(Tensor::zeros(DType::U8, &[1])?)?;
    /// assert!(!group.is_empty());
    /// group.remove(slot)?;
    /// assert!(group.is_empty());
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Handles sharing this group (1 when this is the only one).
    ///
    /// ```
    /// use ferropool::AllocationGroup;
    /// let group = AllocationGroup::new();
    /// let shared = group.clone();
    /// assert_eq!(group.handles(), 2);
    /// drop(shared);
    /// assert_eq!(group.handles(), 1);
    /// ```
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The group's identity, as carried by its slots.
    ///
    /// ```
    /// use ferropool::AllocationGroup;
    /// let group = AllocationGroup::new();
    /// assert_eq!(group.clone().id(), group.id()); // handles share the group
    /// assert_ne!(AllocationGroup::new().id(), group.id());
    /// ```
    pub fn id(&self) -> u64 {
        self.inner.id.get()
    }

    /// Returns the descriptor arena's vacant trailing pages to the system (see
    /// [`SlotArena::trim`]) and returns the descriptor slots released. The arena is shared
    /// by every group of the process and grows to the most descriptors ever live at once;
    /// call this after a phase that held many (say, a large model torn down). Safe to call
    /// at any time, from any thread.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let tensors = (0..5000).map(|_| Tensor::zeros(DType::U8, &[1]));
    /// drop(AllocationGroup::from_tensors(tensors.collect::<Result<Vec<_>, _>>()?)?);
    /// let before = AllocationGroup::descriptor_capacity();
    /// let released = AllocationGroup::trim_descriptors();
    /// assert_eq!(AllocationGroup::descriptor_capacity(), before - released);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn trim_descriptors() -> u64 {
        descriptors().trim()
    }

    /// Descriptor slots the process-wide descriptor arena holds pages for.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, DType, Tensor};
    /// let t = Tensor::zeros(DType::U8, &[1])?;
    /// let (group, _) = AllocationGroup::from_tensors([t])?;
    /// assert!(AllocationGroup::descriptor_capacity() >= group.len() as u64);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    pub fn descriptor_capacity() -> u64 {
        descriptors().capacity()
    }
}

impl Default for AllocationGroup {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for AllocationGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocationGroup")
            .field("id", &self.inner.id)
            .field("descriptors", &self.len())
            .field("buffers", &self.inner.buffers.iter().flatten().count())
            .field("handles", &self.handles())
            .finish()
    }
}

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
    bytes: &'a mut [u8],
    dtype: DType,
    layout: Layout,
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
        check_dtype::<T>(self.dtype)?;
        let len = self.bytes.len() / std::mem::size_of::<T>();
        // SAFETY: the buffer holds initialised `T`s (dtype checked; invariant on the
        // group's buffers), aligned to 8, exclusively borrowed.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.bytes.as_mut_ptr().cast(), len) })
    }

    /// As [`elements`](Self::elements), for the whole borrow `'a`.
    #[cfg(feature = "ndarray")]
    fn into_elements<T: Element>(self) -> Result<(&'a mut [T], Layout), TensorError> {
        check_dtype::<T>(self.dtype)?;
        let len = self.bytes.len() / std::mem::size_of::<T>();
        // SAFETY: the buffer holds initialised `T`s (dtype checked; invariant on the
        // group's buffers), aligned to 8, exclusively borrowed for 'a (`self` is consumed,
        // so nothing else reaches `bytes`).
        let elements =
            unsafe { std::slice::from_raw_parts_mut(self.bytes.as_mut_ptr().cast(), len) };
        Ok((elements, self.layout))
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
        let layout = self.layout.clone();
        ndarray_view_mut(self.elements::<T>()?, &layout)
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
        let (elements, layout) = self.into_elements::<T>()?;
        ndarray_view_mut(elements, &layout)
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
