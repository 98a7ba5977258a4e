//! Descriptors: the records of a group's views in the process-wide descriptor arena, and
//! [`DescriptorSlot`], the key a caller holds for one.

use std::fmt;
use std::num::NonZeroU64;

use crate::arena::{Key, SlotArena};
use crate::tensor::{DType, Layout};

/// A descriptor record in the arena.
#[derive(Debug)]
pub(crate) struct Descriptor {
    pub(super) buffer: u32,
    pub(super) dtype: DType,
    pub(super) layout: Layout,
}

/// The process-wide descriptor arena (per loom execution under loom).
#[cfg(not(loom))]
pub(super) fn descriptors() -> &'static SlotArena<Descriptor> {
    static ARENA: std::sync::OnceLock<SlotArena<Descriptor>> = std::sync::OnceLock::new();
    ARENA.get_or_init(SlotArena::new)
}

/// Under loom the arena gets a private collector: pinning crossbeam-epoch's default
/// collector from a spawned loom thread makes executions non-deterministic (loom aborts with
/// "Is the model fully deterministic?"), while a private collector created in the same
/// per-execution `lazy_static` runs cleanly. The protocol under test is the same.
#[cfg(loom)]
pub(super) fn descriptors() -> &'static SlotArena<Descriptor> {
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
    pub(super) key: Key,
    pub(super) group: NonZeroU64,
    /// Index in the group's table of views.
    pub(super) view: u32,
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
