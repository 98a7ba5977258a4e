//! The group layer's error type.

use super::DescriptorSlot;
use crate::arena::ArenaError;
use crate::tensor::{DType, TensorError};

/// Errors of [`AllocationGroup`](crate::AllocationGroup). A failed operation leaves the group
/// unchanged.
///
/// ```
/// use ferropool::{AllocationGroup, GroupError, Tensor};
/// let mut group = AllocationGroup::new();
/// let slot = group.append_tensor(Tensor::from_slice(&[1u8], &[1])?)?;
/// let shared = group.clone();
/// assert_eq!(group.remove(slot), Err(GroupError::Shared { handles: 2 }));
/// drop(shared);
/// group.remove(slot)?;
/// assert_eq!(group.describe(slot), Err(GroupError::Removed { slot }));
/// # Ok::<(), ferropool::GroupError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The slot was issued by another group.
    #[error("{slot:?} belongs to another group, not to group #{group}")]
    ForeignSlot {
        /// The slot.
        slot: DescriptorSlot,
        /// This group.
        group: u64,
    },
    /// The slot's descriptor was removed from the group (by `remove`, `try_extract` or
    /// `into_tensor`).
    #[error("{slot:?} was removed from its group")]
    Removed {
        /// The slot.
        slot: DescriptorSlot,
    },
    /// The descriptor arena refused a new descriptor.
    #[error("the descriptor arena refused a new descriptor")]
    Arena(#[source] ArenaError),
    /// A caller-owned payload cannot live in an allocation group.
    #[error("an {dtype} payload is caller-owned and cannot join an allocation group")]
    ExternalPayload {
        /// Its dtype.
        dtype: DType,
    },
    /// The operation changes the group, and other handles share it.
    #[error(
        "the group is shared by {handles} handles; changing it needs the only handle \
         (a RetainedValue made from the group is one: add views before retaining)"
    )]
    Shared {
        /// Handles sharing the group.
        handles: usize,
    },
    /// The descriptor's buffer is also viewed by other descriptors.
    #[error("{aliases} other descriptor(s) view the same buffer")]
    Aliased {
        /// How many.
        aliases: usize,
    },
    /// A layout or typed access failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}
