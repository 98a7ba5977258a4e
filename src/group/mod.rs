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

mod value;

pub use value::TensorValue;

use std::fmt;
use std::num::NonZeroU64;

use crate::arena::{Key, SlotArena};
use crate::error::{GroupError, TensorError};
use crate::pool::{BufferPool, PoolBuffer};
use crate::sync::{next_identity, Arc};
use crate::tensor::{check_dtype, pooled_bytes, DType, Element, Layout, Tensor, TensorRead};

/// A descriptor record in the arena.
#[derive(Debug)]
pub(crate) struct Descriptor {
    group: NonZeroU64,
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

/// A descriptor's key: which group, which record. `Copy` and opaque.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DescriptorSlot {
    key: Key,
    group: NonZeroU64,
}

impl fmt::Debug for DescriptorSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DescriptorSlot(group #{}, slot {}, generation {})",
            self.group,
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
        if cfg!(ferropool_planted = "clone_without_count") {
            // PLANTED BUG (loom models only): a second handle without a count of its own.
            // SAFETY: none; this is the bug the retain model must catch.
            return Self {
                inner: unsafe { Arc::from_raw(Arc::as_ptr(&self.inner)) },
            };
        }
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct GroupInner {
    id: NonZeroU64,
    /// Buffers by index; `None` once extracted or removed. Invariant: every live descriptor
    /// of this group names a `Some` buffer whose initialised elements cover its layout.
    buffers: Vec<Option<PoolBuffer>>,
    /// Keys of this group's live descriptors. Invariant: only this group removes them, and
    /// only through `&mut` on its unique handle (or when the last handle drops).
    keys: Vec<Key>,
}

impl Drop for GroupInner {
    fn drop(&mut self) {
        let arena = descriptors();
        let guard = arena.pin();
        for key in self.keys.drain(..) {
            // Our own live key: removal cannot fail; if it did, the record is gone anyway.
            let _ = arena.remove(key, &guard);
        }
    }
}

impl AllocationGroup {
    /// An empty group.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(GroupInner {
                id: next_identity(),
                buffers: Vec::new(),
                keys: Vec::new(),
            }),
        }
    }

    /// A group owning `tensors`, with one descriptor each (returned in order).
    ///
    /// # Errors
    ///
    /// [`GroupError::ExternalPayload`] if a tensor is a caller-owned payload (checked before
    /// anything is moved; the tensors are dropped, so payloads go back to their owners).
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
    /// # Errors
    ///
    /// [`GroupError::ExternalPayload`]; [`GroupError::Shared`].
    pub fn append_tensor(&mut self, tensor: Tensor) -> Result<DescriptorSlot, GroupError> {
        let inner = self.unique()?;
        let (buffer, dtype, layout) = tensor
            .into_pooled_parts()
            .map_err(|t| GroupError::ExternalPayload { dtype: t.dtype() })?;
        let index = inner.buffers.len() as u32;
        inner.buffers.push(Some(buffer));
        Self::insert(inner, index, dtype, layout).inspect_err(|_| {
            inner.buffers.pop();
        })
    }

    fn insert(
        inner: &mut GroupInner,
        buffer: u32,
        dtype: DType,
        layout: Layout,
    ) -> Result<DescriptorSlot, GroupError> {
        let key = descriptors().insert(Descriptor {
            group: inner.id,
            buffer,
            dtype,
            layout,
        })?;
        inner.keys.push(key);
        Ok(DescriptorSlot {
            key,
            group: inner.id,
        })
    }

    /// The only handle's group, for a change.
    fn unique(&mut self) -> Result<&mut GroupInner, GroupError> {
        let handles = Arc::strong_count(&self.inner);
        Arc::get_mut(&mut self.inner).ok_or(GroupError::Shared { handles })
    }

    /// This group's descriptor for `slot`.
    fn descriptor(&self, slot: DescriptorSlot) -> Result<&Descriptor, GroupError> {
        if slot.group != self.inner.id {
            return Err(GroupError::ForeignSlot {
                slot: format!("{:?}", slot.key),
                slot_group: slot.group.get(),
                group: self.inner.id.get(),
            });
        }
        // SAFETY: the slot is this group's (checked above), and this group's descriptors are
        // removed only through `&mut` on its unique handle or when its last handle drops;
        // `&self` excludes both for the lifetime of the returned reference.
        let descriptor = unsafe { descriptors().get_unpinned(slot.key) }?;
        debug_assert_eq!(descriptor.group, self.inner.id, "a live key of this group");
        Ok(descriptor)
    }

    /// A read-only view of `slot`. Lock-free; works through any handle, from any thread.
    ///
    /// # Errors
    ///
    /// [`GroupError::ForeignSlot`] for another group's slot; [`GroupError::Stale`] for a
    /// removed one.
    #[inline]
    pub fn read_view(&self, slot: DescriptorSlot) -> Result<TensorRead<'_>, GroupError> {
        let descriptor = self.descriptor(slot)?;
        let buffer = self.inner.buffers[descriptor.buffer as usize]
            .as_ref()
            .expect("a live descriptor's buffer is present (invariant on `buffers`)");
        Ok(TensorRead::pooled(
            pooled_bytes(buffer),
            descriptor.dtype,
            &descriptor.layout,
        ))
    }

    /// The dtype and shape of `slot`.
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
            .and_then(PoolBuffer::as_bytes_mut)
            .expect("a live descriptor's buffer is present and initialised");
        Ok(TensorWrite {
            bytes,
            dtype,
            layout,
        })
    }

    /// Adds a descriptor viewing `of`'s buffer through `layout`.
    ///
    /// # Errors
    ///
    /// [`GroupError::Tensor`] with [`TensorError::OutOfBounds`] if the layout reaches past
    /// the buffer; [`GroupError::Shared`]; the errors of [`read_view`](Self::read_view).
    pub fn add_view(
        &mut self,
        of: DescriptorSlot,
        layout: Layout,
    ) -> Result<DescriptorSlot, GroupError> {
        let (buffer, dtype) = {
            let d = self.descriptor(of)?;
            (d.buffer, d.dtype)
        };
        let inner = self.unique()?;
        let bytes = inner.buffers[buffer as usize]
            .as_ref()
            .map_or(0, PoolBuffer::len);
        let size = dtype.size_of().expect("pooled dtypes have a size");
        layout.check_within(bytes / size)?;
        Self::insert(inner, buffer, dtype, layout)
    }

    /// A view of `of` under another shape (needs a contiguous layout).
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

    /// Other live descriptors of this group on `slot`'s buffer.
    fn aliases(&self, slot: DescriptorSlot, buffer: u32) -> usize {
        self.inner
            .keys
            .iter()
            .filter(|&&key| key != slot.key)
            .filter(|&&key| {
                // SAFETY: as in `descriptor`: our own keys, and `&self` excludes removal.
                unsafe { descriptors().get_unpinned(key) }.is_ok_and(|d| d.buffer == buffer)
            })
            .count()
    }

    /// Removes `slot`'s descriptor and returns its buffer as a tensor, without copying. Only
    /// when no other descriptor views the buffer and the view covers it compactly.
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
        if Arc::strong_count(&self.inner) > 1 {
            return Err(GroupError::Shared {
                handles: Arc::strong_count(&self.inner),
            });
        }
        let aliases = self.aliases(slot, buffer);
        if aliases > 0 {
            return Err(GroupError::Aliased { aliases });
        }
        let size = dtype.size_of().expect("pooled dtypes have a size");
        let bytes = self.inner.buffers[buffer as usize]
            .as_ref()
            .map_or(0, PoolBuffer::len);
        if !layout.is_contiguous() || layout.offset() != 0 || layout.numel() * size != bytes {
            return Err(TensorError::NotContiguous {
                operation: "AllocationGroup::try_extract",
            }
            .into());
        }
        self.remove_key(slot)?;
        let inner = self.unique()?;
        let buffer = inner.buffers[buffer as usize]
            .take()
            .expect("checked present above");
        Ok(Tensor::pooled(buffer, dtype, layout))
    }

    /// Removes `slot`'s descriptor and returns its elements as a compact tensor: the buffer
    /// itself when [`try_extract`](Self::try_extract) can, otherwise a copy (in the global
    /// pool).
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
                let copy = copy_compact(&self.read_view(slot)?, BufferPool::global())?;
                self.remove(slot)?;
                Ok(copy)
            }
            Err(other) => Err(other),
        }
    }

    /// Removes `slot`'s descriptor; its buffer goes back to the pool when no other
    /// descriptor views it.
    ///
    /// # Errors
    ///
    /// [`GroupError::Shared`]; the errors of [`read_view`](Self::read_view).
    pub fn remove(&mut self, slot: DescriptorSlot) -> Result<(), GroupError> {
        let buffer = self.descriptor(slot)?.buffer;
        if Arc::strong_count(&self.inner) > 1 {
            return Err(GroupError::Shared {
                handles: Arc::strong_count(&self.inner),
            });
        }
        let orphaned = self.aliases(slot, buffer) == 0;
        self.remove_key(slot)?;
        if orphaned {
            self.unique()?.buffers[buffer as usize] = None;
        }
        Ok(())
    }

    fn remove_key(&mut self, slot: DescriptorSlot) -> Result<(), GroupError> {
        let inner = self.unique()?;
        let arena = descriptors();
        let guard = arena.pin();
        arena.remove(slot.key, &guard)?;
        if let Some(i) = inner.keys.iter().position(|&k| k == slot.key) {
            inner.keys.swap_remove(i);
        }
        Ok(())
    }

    /// Live descriptors.
    pub fn len(&self) -> usize {
        self.inner.keys.len()
    }

    /// Whether the group has no descriptors.
    pub fn is_empty(&self) -> bool {
        self.inner.keys.is_empty()
    }

    /// Handles sharing this group (1 when this is the only one).
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The group's identity, as carried by its slots.
    pub fn id(&self) -> u64 {
        self.inner.id.get()
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
            .field("descriptors", &self.inner.keys.len())
            .field("buffers", &self.inner.buffers.iter().flatten().count())
            .field("handles", &self.handles())
            .finish()
    }
}

/// Copies a view's elements into a new compact tensor in `pool`.
fn copy_compact(view: &TensorRead<'_>, pool: &BufferPool) -> Result<Tensor, GroupError> {
    macro_rules! copy {
        ($($d:ident => $t:ty),*) => {
            match view.dtype() {
                $(DType::$d => Tensor::from_slice_in(pool, &view.to_vec::<$t>()?, view.shape())?,)*
                other => return Err(GroupError::ExternalPayload { dtype: other }),
            }
        };
    }
    use crate::tensor::{Bf16, F16};
    Ok(
        copy!(F32 => f32, F64 => f64, F16 => F16, BF16 => Bf16, I8 => i8, I32 => i32,
             I64 => i64, U8 => u8, Bool => bool),
    )
}

/// An exclusive writable view of one descriptor.
pub struct TensorWrite<'a> {
    bytes: &'a mut [u8],
    dtype: DType,
    layout: Layout,
}

impl TensorWrite<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
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

    /// The elements as a mutable slice, when the view is contiguous.
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
