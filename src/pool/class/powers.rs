//! A second size-class policy, for the seam's tests only: powers of two from 8 bytes to
//! 2^40 (a request rounds up by less than 2x). It shows what a policy is: these four items
//! and nothing else.

/// The largest class is `2^MAX_POWER` bytes; the smallest `2^MIN_POWER`.
const MAX_POWER: u32 = 40;
const MIN_POWER: u32 = 3;
/// Number of classes.
pub(crate) const CLASSES: usize = (MAX_POWER - MIN_POWER + 1) as usize;
/// The largest request a pool serves.
pub(crate) const MAX_SIZE: usize = 1 << MAX_POWER;

/// The class of a request of `size` bytes, or `None` above [`MAX_SIZE`].
#[inline]
pub(crate) const fn class_of(size: usize) -> Option<usize> {
    if size > MAX_SIZE {
        return None;
    }
    let power = if size <= 1 << MIN_POWER {
        MIN_POWER
    } else {
        usize::BITS - (size - 1).leading_zeros()
    };
    Some((power - MIN_POWER) as usize)
}

/// The bytes a block of `class` holds.
#[inline]
pub(crate) fn class_size(class: usize) -> usize {
    1 << (class as u32 + MIN_POWER)
}
