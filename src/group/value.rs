//! `TensorValue`: a tensor, or a descriptor of an allocation group.

use super::{AllocationGroup, DescriptorSlot};
use crate::error::GroupError;
use crate::tensor::{DType, Tensor};

/// A tensor value as the runtime passes it around: an owned tensor, or one descriptor of an
/// allocation group.
#[derive(Debug)]
pub enum TensorValue {
    /// An owned tensor (pooled or caller-owned).
    Tensor(Tensor),
    /// A descriptor of a group.
    Grouped {
        /// The group.
        group: AllocationGroup,
        /// The descriptor.
        slot: DescriptorSlot,
    },
}

impl TensorValue {
    /// Wraps a tensor.
    pub fn from_tensor(tensor: Tensor) -> Self {
        Self::Tensor(tensor)
    }

    /// The value as an owned tensor. A grouped value is extracted without a copy when its
    /// group is not shared and nothing else views its buffer, and copied otherwise.
    ///
    /// # Errors
    ///
    /// The errors of [`AllocationGroup::into_tensor`] (after falling back to a copy through
    /// [`AllocationGroup::read_view`] for a shared group).
    pub fn into_tensor(self) -> Result<Tensor, GroupError> {
        match self {
            Self::Tensor(tensor) => Ok(tensor),
            Self::Grouped { mut group, slot } => {
                if group.handles() > 1 {
                    let view = group.read_view(slot)?;
                    return super::copy_compact(&view, crate::BufferPool::global());
                }
                group.into_tensor(slot)
            }
        }
    }

    /// The group, slot, dtype and shape of a pooled value: a pooled tensor moves into a new
    /// group of its own (no copy). A caller-owned value, or a grouped value whose slot no
    /// longer resolves, comes back unchanged in `Err`.
    // The seed's signature: a value that cannot join a group comes back whole, unchanged.
    #[allow(clippy::result_large_err)]
    pub fn try_into_group_parts(
        self,
    ) -> Result<(AllocationGroup, DescriptorSlot, DType, Vec<usize>), TensorValue> {
        match self {
            Self::Tensor(tensor) if tensor.is_external() => Err(Self::Tensor(tensor)),
            Self::Tensor(tensor) => {
                let mut group = AllocationGroup::new();
                let (dtype, shape) = (tensor.dtype(), tensor.shape().to_vec());
                match group.append_tensor(tensor) {
                    Ok(slot) => Ok((group, slot, dtype, shape)),
                    // Unreachable for a pooled tensor and a fresh group; nothing to return.
                    Err(error) => panic!("a pooled tensor could not join a new group: {error}"),
                }
            }
            Self::Grouped { group, slot } => match group.describe(slot) {
                Ok((dtype, shape)) => Ok((group, slot, dtype, shape)),
                Err(_) => Err(Self::Grouped { group, slot }),
            },
        }
    }
}
