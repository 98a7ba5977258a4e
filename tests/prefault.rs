//! Pre-faulted and huge-page blocks (Linux). One test in its own binary: minor faults are
//! counted for the whole process, so nothing else may run meanwhile.
#![cfg(all(target_os = "linux", not(miri), not(ferropool_sanitizer)))]

use ferropool::{BufferPool, PoolConfig};
use ferropool_figures::minor_faults;

/// Faults taken while writing one byte per page of a fresh 32 MiB block.
fn first_touch_faults(config: PoolConfig, zeroed: bool) -> u64 {
    let pool = BufferPool::with_config(config).unwrap();
    let size = 32 << 20;
    let mut buffer = if zeroed {
        pool.alloc_zeroed(size)
    } else {
        pool.alloc(size)
    }
    .unwrap();
    if zeroed {
        let bytes = buffer.as_bytes().unwrap();
        assert!(
            bytes.iter().step_by(4096).all(|&b| b == 0),
            "pre-faulting kept the zeros"
        );
    }
    let before = minor_faults();
    let ptr = buffer.as_mut_ptr();
    for offset in (0..size).step_by(4096) {
        // SAFETY: (test) inside the buffer.
        unsafe { ptr.add(offset).write_volatile(1) };
    }
    minor_faults() - before
}

#[test]
fn prefaulted_blocks_take_no_faults_on_first_touch() {
    let plain = first_touch_faults(PoolConfig::default(), false);
    let prefaulted = first_touch_faults(
        PoolConfig {
            prefault: true,
            ..PoolConfig::default()
        },
        false,
    );
    let both = first_touch_faults(
        PoolConfig {
            prefault: true,
            huge_pages: true,
            ..PoolConfig::default()
        },
        true,
    );
    println!("first-touch faults on 32 MiB: plain {plain}, prefaulted {prefaulted}, prefaulted huge pages {both}");
    // Relative bounds, robust to a kernel that faults a few pages anyway. (Under sanitizers,
    // whose shadow memory faults too, this test does not run.)
    assert!(
        prefaulted * 4 < plain,
        "prefaulted block faulted {prefaulted} times ({plain} plain)"
    );
    assert!(
        both * 4 < plain,
        "prefaulted huge-page block faulted {both} times ({plain} plain)"
    );
}
