//! The seam for size classes. A *policy* is one module that provides four items, and
//! nothing else in the pool knows how classes are cut:
//!
//! - `CLASSES`, the number of classes (at most 2^16: a block record keeps the class in 16
//!   bits; checked below at compile time);
//! - `MAX_SIZE`, the largest request served, which is the last class's size;
//! - `const fn class_of(size) -> Option<usize>`, the smallest class holding `size` bytes
//!   (`None` above `MAX_SIZE`; size 0 has class 0);
//! - `fn class_size(class) -> usize`, a class's block bytes, increasing with the class.
//!
//! The pool uses [`eighths`] (eight classes per power of two). [`powers`] (powers of two) is
//! a second policy for the tests, which hold both to the contract above.

mod eighths;
#[cfg(all(test, not(loom)))]
mod powers;

pub(crate) use eighths::{class_of, class_size, CLASSES, MAX_SIZE};

const _: () = {
    assert!(CLASSES <= 1 << 16, "a class must fit in 16 bits");
    assert!(matches!(class_of(MAX_SIZE), Some(last) if last == CLASSES - 1));
    assert!(class_of(MAX_SIZE + 1).is_none());
};

#[cfg(all(test, not(loom)))]
mod tests {
    /// The contract of a policy module (see the module docs), checked on sizes around
    /// every power of two and every class boundary.
    macro_rules! holds_the_contract {
        ($policy:ident) => {{
            use super::$policy::{class_of, class_size, CLASSES, MAX_SIZE};
            assert!(CLASSES >= 1 && CLASSES <= 1 << 16);
            assert_eq!(class_size(CLASSES - 1), MAX_SIZE);
            assert_eq!(class_of(MAX_SIZE), Some(CLASSES - 1));
            assert_eq!(class_of(MAX_SIZE + 1), None);
            assert_eq!(class_of(usize::MAX), None);
            assert_eq!(class_of(0), Some(0));
            for class in 1..CLASSES {
                assert!(class_size(class) > class_size(class - 1), "{class}");
            }
            let mut sizes: Vec<usize> = (1..5000).collect();
            for p in 12..MAX_SIZE.trailing_zeros() {
                let base = 1usize << p;
                sizes.extend([base - 1, base, base + 1, base + base / 3, 2 * base - 1]);
            }
            for class in 0..CLASSES {
                let size = class_size(class);
                sizes.extend([size - 1, size, size + 1]);
            }
            for size in sizes.into_iter().filter(|&s| (1..=MAX_SIZE).contains(&s)) {
                let class = class_of(size).unwrap();
                assert!(class_size(class) >= size, "size {size} -> class {class}");
                if class > 0 {
                    assert!(class_size(class - 1) < size, "size {size} skipped a class");
                }
            }
        }};
    }

    #[test]
    fn the_pools_policy_holds_the_contract() {
        holds_the_contract!(eighths);
    }

    #[test]
    fn a_second_policy_holds_the_contract() {
        holds_the_contract!(powers);
    }
}
