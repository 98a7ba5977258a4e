//! `TensorValue`: a tensor, or a descriptor of an allocation group.

use super::{AllocationGroup, DescriptorSlot, GroupError};
use crate::tensor::{DType, Tensor};

/// A tensor value as the runtime passes it around: an owned tensor, or one descriptor of an
/// allocation group.
///
/// ```
/// use ferropool::{AllocationGroup, Tensor, TensorValue};
/// let t = Tensor::from_slice(&[1i32, 2, 3, 4], &[2, 2])?;
/// let (mut group, slots) = AllocationGroup::from_tensors([t])?;
/// let column = group.narrow(slots[0], 1, 1, 1)?;
/// let value = TensorValue::Grouped { group, slot: column };
/// assert_eq!(value.into_tensor()?.as_slice::<i32>()?, &[2, 4]);
/// # Ok::<(), ferropool::GroupError>(())
/// ```
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
    ///
    /// ```
    /// use ferropool::{Tensor, TensorValue};
    /// let value = TensorValue::from_tensor(Tensor::from_slice(&[1u8], &[1])?);
    /// assert!(matches!(value, TensorValue::Tensor(_)));
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    pub fn from_tensor(tensor: Tensor) -> Self {
        Self::Tensor(tensor)
    }

    /// The value as an owned tensor. A grouped value is extracted without a copy when its
    /// group is not shared and nothing else views its buffer, and copied (in the pool its
    /// buffer came from) otherwise.
    ///
    /// ```
    /// use ferropool::{AllocationGroup, Tensor, TensorValue};
    /// let t = Tensor::from_slice(&[1.0f32, 2.0], &[2])?;
    /// let (group, slots) = AllocationGroup::from_tensors([t])?;
    /// let value = TensorValue::Grouped { group, slot: slots[0] };
    /// let t = value.into_tensor()?; // its buffer's only view: no copy
    /// assert_eq!(t.as_slice::<f32>()?, &[1.0, 2.0]);
    /// # Ok::<(), ferropool::GroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The errors of [`AllocationGroup::into_tensor`], or of the copy for a shared group.
    pub fn into_tensor(self) -> Result<Tensor, GroupError> {
        match self {
            Self::Tensor(tensor) => Ok(tensor),
            Self::Grouped { mut group, slot } => {
                if group.handles() > 1 {
                    return group.copy_out(slot);
                }
                group.into_tensor(slot)
            }
        }
    }

    /// The group, slot, dtype and shape of a pooled value: a pooled tensor moves into a new
    /// group of its own (no copy). A caller-owned value, a grouped value whose slot no
    /// longer resolves, or a tensor the descriptor arena has no room for, comes back
    /// unchanged in `Err`.
    ///
    /// ```
    /// use ferropool::{DType, Tensor, TensorValue};
    /// # #[derive(Debug)]
    /// # struct Opaque(Vec<usize>);
    /// # impl ferropool::ExternalPayload for Opaque {
    /// #     fn tag(&self) -> u32 { 7 }
    /// #     fn shape(&self) -> &[usize] { &self.0 }
    /// # }
    /// let value = TensorValue::from_tensor(Tensor::zeros(DType::F32, &[2, 3])?);
    /// let Ok((group, slot, dtype, shape)) = value.try_into_group_parts() else { unreachable!() };
    /// assert_eq!((dtype, shape, group.len()), (DType::F32, vec![2, 3], 1));
    /// let external = TensorValue::from_tensor(Tensor::external(Opaque(vec![1]))?);
    /// assert!(external.try_into_group_parts().is_err()); // it comes back unchanged
    /// # Ok::<(), ferropool::TensorError>(())
    /// ```
    // The runtime's signature: a value that cannot join a group comes back whole, unchanged.
    #[allow(clippy::result_large_err)]
    pub fn try_into_group_parts(
        self,
    ) -> Result<(AllocationGroup, DescriptorSlot, DType, Vec<usize>), TensorValue> {
        match self {
            Self::Tensor(tensor) if tensor.is_external() => Err(Self::Tensor(tensor)),
            Self::Tensor(tensor) => {
                let mut group = AllocationGroup::new();
                let (dtype, shape) = (tensor.dtype(), tensor.shape().to_vec());
                match group.try_append(tensor) {
                    Ok(slot) => Ok((group, slot, dtype, shape)),
                    Err((_, tensor)) => Err(Self::Tensor(tensor)),
                }
            }
            Self::Grouped { group, slot } => match group.describe(slot) {
                Ok((dtype, shape)) => Ok((group, slot, dtype, shape)),
                Err(_) => Err(Self::Grouped { group, slot }),
            },
        }
    }
}
