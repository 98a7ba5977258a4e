//! Per-thread scratch for the attention kernel (a block of each operand and of the weights)
//! and the bias gradients' partial sums. It lives as long as its thread and grows to
//! the largest block the thread has seen, so after the first step it costs no allocation.
//! Like the products' shared panel, it comes from the process's global allocator,
//! not from the training's pool: what a step asks of the pool does not depend on which
//! thread runs which block, so a budget holds the same tensors at any thread count.

use std::cell::RefCell;

thread_local! {
    static SCRATCH: RefCell<[Vec<f32>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// Runs `f` with two scratch slices of `a` and `b` elements of this thread (their contents
/// are left from earlier use: `f` writes before it reads). If this thread's scratch is in use
/// (a kernel run from inside another's `f`), `f` gets fresh slices.
pub fn with_scratch<R>(a: usize, b: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffers) => {
            let [first, second] = &mut *buffers;
            grow(first, a);
            grow(second, b);
            f(&mut first[..a], &mut second[..b])
        }
        Err(_) => f(&mut vec![0.0; a], &mut vec![0.0; b]),
    })
}

/// Grows `buffer` to at least `len` elements (zeros: written once, when the thread first
/// needs that much).
fn grow(buffer: &mut Vec<f32>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
}
