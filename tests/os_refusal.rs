//! The OS refuses the pool's pages (an address-space limit makes `mmap` fail): a typed
//! error, nothing counted, and the pool serves again once the OS does. One test, alone in
//! its binary: the limit holds for the whole process.

use ferropool::{BufferPool, PoolError};
use ferropool_figures::{address_space_bytes, limit_address_space};

#[test]
#[cfg_attr(miri, ignore = "Miri cannot limit the address space")]
#[cfg_attr(ferropool_sanitizer, ignore = "sanitizers reserve vast address ranges")]
fn a_refused_mapping_is_a_typed_error_and_the_pool_serves_again() {
    let pool = BufferPool::new();
    let held = pool.alloc(1 << 20).unwrap(); // the first segment is mapped
    let space = address_space_bytes();
    if space == 0 || !limit_address_space(space + (64 << 20)) {
        return; // no /proc or no limits here: nothing to show
    }
    // 256 MiB cannot be mapped within 64 MiB more address space.
    let err = pool.alloc(256 << 20).unwrap_err();
    assert!(matches!(err, PoolError::SystemAllocFailed(_)), "{err}");
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes, held.capacity() as u64, "{stats:?}");
    assert_eq!(stats.system_allocations, 1, "{stats:?}");
    // What fits still comes.
    let fits = pool.alloc(2 << 20).unwrap();
    assert!(limit_address_space(u64::MAX));
    let large = pool.alloc(256 << 20).unwrap();
    drop((held, fits, large));
    pool.trim();
    let stats = pool.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.mapped_bytes),
        (0, 0),
        "{stats:?}"
    );
}
