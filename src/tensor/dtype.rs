//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// `External(tag)` marks a scalar type the caller defines; tensors of it hold a caller-owned
/// payload ([`ExternalPayload`](crate::ExternalPayload)) and never enter a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE 754 half precision, stored as [`F16`] bits.
    F16,
    /// bfloat16, stored as [`Bf16`] bits.
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

/// IEEE 754 half-precision bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

/// bfloat16 bits (the upper half of an `f32`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Truncates an `f32` to bfloat16.
    pub fn from_f32(value: f32) -> Self {
        Self((value.to_bits() >> 16) as u16)
    }

    /// Widens to `f32` exactly.
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be an element of a pooled tensor: the types of the non-external
/// [`DType`]s. Sealed: every bit pattern the crate stores for `T` is a valid `T`, because
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
    F16 => F16, F16(0);
    Bf16 => BF16, Bf16(0);
    i8 => I8, 0;
    i32 => I32, 0;
    i64 => I64, 0;
    u8 => U8, 0;
    bool => Bool, false;
}
