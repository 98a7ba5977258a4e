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

mod descriptor;
mod error;
mod value;
mod write;

pub(crate) use descriptor::Descriptor;
pub use descriptor::DescriptorSlot;
pub use error::GroupError;
pub use value::TensorValue;
pub use write::TensorWrite;

use descriptor::descriptors;

use std::fmt;
use std::num::NonZeroU64;

use crate::arena::Key;
use crate::identity::next_identity;
use crate::pool::PoolBuffer;
use crate::sync::Arc;
use crate::tensor::bytes::pooled_bytes;
use crate::tensor::{compact_copy, DType, Layout, Tensor, TensorError, TensorRead};

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
        for key in self.views.drain(..).flatten() {
            // Our own live key (invariant on `views`): removal cannot fail.
            let removed = arena.discard(key);
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
        let tensors = crate::collect::collect_as_they_come(tensors);
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
            .discard(slot.key)
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
    /// [`SlotArena::trim`](crate::SlotArena::trim)) and returns the descriptor slots released. The
    /// arena is shared by every group of the process and grows to the most descriptors ever live at
    /// once; call this after a phase that held many (say, a large model torn down). Safe to call at
    /// any time, from any thread.
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
