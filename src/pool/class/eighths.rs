//! The pool's size classes: eight per power of two, so a request of 64 bytes or more is
//! rounded up by at most 12.5%. Requests of 1..=64 bytes use classes of 8, 16, ..., 64 bytes.

/// Classes of 8..=64 bytes, in steps of 8.
const SMALL: usize = 8;
/// The largest class is `2^MAX_POWER` bytes.
const MAX_POWER: u32 = 40;
/// Number of classes.
pub(crate) const CLASSES: usize = SMALL + (MAX_POWER as usize - 6) * 8;
/// The largest request a pool serves.
pub(crate) const MAX_SIZE: usize = 1 << MAX_POWER;

/// The class of a request of `size` bytes, or `None` above [`MAX_SIZE`].
#[inline]
pub(crate) const fn class_of(size: usize) -> Option<usize> {
    if size <= 64 {
        return Some(if size == 0 { 0 } else { size.div_ceil(8) - 1 });
    }
    if size > MAX_SIZE {
        return None;
    }
    // size is in (2^p, 2^(p+1)]; its class steps are 2^(p-3) apart.
    let p = (usize::BITS - 1 - (size - 1).leading_zeros()) as usize;
    let step = p - 3;
    let sub = (size - (1 << p)).div_ceil(1 << step); // 1..=8
    Some(SMALL + (p - 6) * 8 + sub - 1)
}

/// The bytes a block of `class` holds (a table lookup).
#[inline]
pub(crate) fn class_size(class: usize) -> usize {
    CLASS_SIZES[class]
}

/// Block bytes of every class, computed at compile time.
static CLASS_SIZES: [usize; CLASSES] = {
    let mut sizes = [0; CLASSES];
    let mut class = 0;
    while class < CLASSES {
        sizes[class] = if class < SMALL {
            (class + 1) * 8
        } else {
            let k = class - SMALL;
            let p = 6 + k / 8;
            (1 << p) + ((k % 8 + 1) << (p - 3))
        };
        class += 1;
    }
    sizes
};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_an_eighth() {
        let mut sizes: Vec<usize> = (1..5000).collect();
        for p in 12..MAX_POWER {
            let base = 1usize << p;
            sizes.extend([base - 1, base, base + 1, base + base / 3, 2 * base - 1]);
        }
        for size in sizes {
            let class = class_of(size).unwrap();
            let got = class_size(class);
            assert!(got >= size, "size {size} -> class {class} of {got}");
            if size >= 64 {
                assert!(
                    got - size <= size / 8,
                    "size {size}: class {got} wastes more than 1/8"
                );
            }
            if class > 0 {
                assert!(
                    class_size(class - 1) < size,
                    "size {size} skipped a smaller class"
                );
            }
        }
    }
}
