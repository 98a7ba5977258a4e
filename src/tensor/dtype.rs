//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// `External(tag)` marks a scalar type the caller defines; tensors of it hold a caller-owned
/// payload ([`ExternalPayload`](crate::ExternalPayload)) and never enter a pool.
///
/// ```
/// use ferropool::{DType, Tensor};
/// let t = Tensor::from_slice(&[1u8, 2], &[2])?;
/// assert_eq!(t.dtype(), DType::U8);
/// assert_eq!(DType::BF16.to_string(), "bf16");
/// # Ok::<(), ferropool::TensorError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE 754 half precision: [`half::f16`].
    F16,
    /// bfloat16: [`half::bf16`].
    BF16,
    /// 8-bit signed integer.
    I8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean, one byte (0 or 1).
    Bool,
    /// A caller-defined scalar, identified by a tag of the caller's choosing.
    External(u32),
}

impl DType {
    /// Bytes per element, or `None` for `External`.
    ///
    /// ```
    /// use ferropool::DType;
    /// assert_eq!(DType::F16.size_of(), Some(2));
    /// assert_eq!(DType::External(3).size_of(), None);
    /// ```
    pub const fn size_of(self) -> Option<usize> {
        Some(match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::I8 | Self::U8 | Self::Bool => 1,
            Self::External(_) => return None,
        })
    }

    /// Whether this is a caller-defined type.
    ///
    /// ```
    /// use ferropool::DType;
    /// assert!(DType::External(3).is_external());
    /// assert!(!DType::I64.is_external());
    /// ```
    pub const fn is_external(self) -> bool {
        matches!(self, Self::External(_))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => f.write_str("f32"),
            Self::F64 => f.write_str("f64"),
            Self::F16 => f.write_str("f16"),
            Self::BF16 => f.write_str("bf16"),
            Self::I8 => f.write_str("i8"),
            Self::I32 => f.write_str("i32"),
            Self::I64 => f.write_str("i64"),
            Self::U8 => f.write_str("u8"),
            Self::Bool => f.write_str("bool"),
            Self::External(tag) => write!(f, "external({tag})"),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be an element of a pooled tensor: the types of the non-external
/// [`DType`]s (16-bit floats are the `half` crate's [`half::f16`] and [`half::bf16`], with
/// its conversions: round to nearest even, NaN kept NaN).
///
/// ```
/// use ferropool::{DType, Tensor};
/// use half::bf16;
/// let t = Tensor::from_slice(&[bf16::from_f32(1.0058594), bf16::NAN], &[2])?;
/// assert_eq!(t.dtype(), DType::BF16);
/// let read = t.as_slice::<bf16>()?;
/// assert_eq!(read[0].to_bits(), 0x3f81); // rounded to nearest even
/// assert!(read[1].is_nan());
/// # Ok::<(), ferropool::TensorError>(())
/// ```
///
/// Sealed: every bit pattern the crate stores for `T` is a valid `T`, because
/// buffers of a dtype are only ever written through that dtype's `T`.
pub trait Element: sealed::Sealed + Copy + Send + Sync + fmt::Debug + 'static {
    /// The dtype of `Self`.
    const DTYPE: DType;
    /// The value of a zeroed element (all bytes 0).
    const ZERO: Self;
}

macro_rules! element {
    ($($t:ty => $d:ident, $zero:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            const ZERO: Self = $zero;
        }
    )*};
}

element! {
    f32 => F32, 0.0;
    f64 => F64, 0.0;
    half::f16 => F16, half::f16::ZERO;
    half::bf16 => BF16, half::bf16::ZERO;
    i8 => I8, 0;
    i32 => I32, 0;
    i64 => I64, 0;
    u8 => U8, 0;
    bool => Bool, false;
}
