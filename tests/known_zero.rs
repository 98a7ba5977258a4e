//! A block known to be zero is not cleared again: a buffer from `alloc_zeroed` that nothing
//! could write goes back to the pool marked zero, and the next `alloc_zeroed` of that block
//! neither writes it nor makes its pages resident. Every way to write a buffer takes the mark
//! away, so a written block is cleared as before. The resident test is one function: resident
//! memory is the process's, and tests of this binary run side by side.

use std::mem::MaybeUninit;

use ferropool::{BufferPool, DType, PoolBuffer, PoolConfig, Tensor};
use ferropool_figures::rss_bytes;

const MIB: usize = 1 << 20;

/// Allocates `size` zeroed bytes, writes them with `write`, gives them back, allocates
/// `size` zeroed bytes again from the same block and checks they are zero.
fn written_then_zeroed(size: usize, write: impl FnOnce(&mut PoolBuffer)) {
    let pool = BufferPool::new();
    let mut first = pool.alloc_zeroed(size).unwrap();
    write(&mut first);
    let block = first.as_ptr();
    drop(first);
    let again = pool.alloc_zeroed(size).unwrap();
    assert_eq!(
        again.as_ptr(),
        block,
        "the same block, or the test shows nothing"
    );
    let bytes = again.as_bytes().expect("zeroed");
    assert!(
        bytes.iter().all(|&b| b == 0),
        "a written block came back unzeroed"
    );
}

#[test]
fn every_way_to_write_a_zeroed_buffer_takes_its_zero_mark_away() {
    for size in [64, 24 << 10, 2 * MIB] {
        written_then_zeroed(size, |b| {
            // SAFETY: `len` bytes of the buffer, exclusively ours.
            unsafe { b.as_mut_ptr().write_bytes(0xab, b.len()) }
        });
        written_then_zeroed(size, |b| b.as_bytes_mut().unwrap().fill(0xab));
        written_then_zeroed(size, |b| {
            b.as_uninit_mut().fill(MaybeUninit::new(0xab));
            // SAFETY: every byte written just above.
            unsafe { b.assume_init() };
        });
        written_then_zeroed(size, |b| b.fill(0xab));
        written_then_zeroed(size, |b| b.copy_from_slice(&vec![0xab; size]).unwrap());
    }
}

#[test]
fn a_block_taken_without_zeros_and_written_is_cleared_for_the_next_zeroed_request() {
    let pool = BufferPool::new();
    let zero = pool.alloc_zeroed(MIB).unwrap();
    let block = zero.as_ptr();
    drop(zero); // marked zero
    let mut plain = pool.alloc(MIB).unwrap();
    assert_eq!(plain.as_ptr(), block);
    plain.fill(7);
    drop(plain);
    let again = pool.alloc_zeroed(MIB).unwrap();
    assert_eq!(again.as_ptr(), block);
    assert!(again.as_bytes().unwrap().iter().all(|&b| b == 0));
}

#[test]
fn a_tensor_written_in_place_comes_back_cleared() {
    let pool = BufferPool::new();
    let mut tensor = Tensor::zeros_in(&pool, DType::F32, &[256, 256]).unwrap();
    tensor.as_mut_slice::<f32>().unwrap().fill(1.5);
    let block = tensor.as_slice::<f32>().unwrap().as_ptr();
    drop(tensor);
    let again = Tensor::zeros_in(&pool, DType::F32, &[256, 256]).unwrap();
    let values = again.as_slice::<f32>().unwrap();
    assert_eq!(
        values.as_ptr(),
        block,
        "the same block, or the test shows nothing"
    );
    assert!(values.iter().all(|&x| x == 0.0));
}

#[test]
#[cfg_attr(ferropool_sanitizer, ignore = "sanitizers keep shadow memory resident")]
#[cfg_attr(miri, ignore = "no process figures under Miri")]
fn a_zeroed_block_that_was_never_written_stays_untouched_when_taken_again() {
    if rss_bytes() == 0 {
        return; // no /proc: nothing to measure
    }
    // No huge pages: a touched page is one page, not 2 MiB.
    let pool = BufferPool::with_config(PoolConfig {
        huge_pages: false,
        ..PoolConfig::default()
    })
    .unwrap();
    const SIZE: usize = 64 * MIB;
    let start = rss_bytes();
    let fresh = pool.alloc_zeroed(SIZE).unwrap();
    let block = fresh.as_ptr();
    assert!(fresh.as_bytes().unwrap().len() == SIZE);
    drop(fresh);
    for _ in 0..4 {
        let again = pool.alloc_zeroed(SIZE).unwrap();
        assert_eq!(again.as_ptr(), block, "the block recycled");
        drop(again);
    }
    let grown = rss_bytes().saturating_sub(start);
    assert!(
        grown < (SIZE / 4) as u64,
        "a never-written zeroed block was cleared again: resident memory grew by {} MiB",
        grown >> 20
    );
}
