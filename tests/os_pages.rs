//! The pool's own pages, seen from the process: what the pool releases and trims leaves the
//! process's resident memory, a budget holds for resident memory and not only in the pool's
//! books, and a dropped pool gives every page back. One test function: resident memory is
//! the process's, so the steps must not overlap with other tests.

use ferropool::{BufferPool, PoolConfig, PoolError};
use ferropool_figures::rss_bytes;

const MIB: usize = 1 << 20;

/// Allocates `size` bytes and writes every page, so that they are resident.
fn touched(pool: &BufferPool, size: usize) -> Result<ferropool::PoolBuffer, PoolError> {
    let mut buffer = pool.alloc_zeroed(size)?;
    for page in buffer.as_bytes_mut().unwrap().chunks_mut(4096) {
        page[0] = 1;
    }
    Ok(buffer)
}

#[test]
#[cfg_attr(ferropool_sanitizer, ignore = "sanitizers keep shadow memory resident")]
#[cfg_attr(miri, ignore = "no process figures under Miri")]
fn released_pages_leave_the_process_and_a_budget_holds_for_resident_memory() {
    if rss_bytes() == 0 {
        return; // no /proc: nothing to measure
    }
    let start = rss_bytes();

    // 1. 16 x 16 MiB, then 80 x 3 MiB, all dropped and trimmed: nothing stays resident (with
    //    blocks from glibc, 26-30 MiB did).
    let pool = BufferPool::new();
    let big: Vec<_> = (0..16).map(|_| touched(&pool, 16 * MIB).unwrap()).collect();
    drop(big);
    let small: Vec<_> = (0..80).map(|_| touched(&pool, 3 * MIB).unwrap()).collect();
    drop(small);
    pool.trim();
    let stats = pool.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.dirty_bytes, stats.mapped_bytes),
        (0, 0, 0),
        "{stats:?}"
    );
    let after = rss_bytes();
    assert!(
        after < start + 8 * MIB as u64,
        "{} MiB more resident after a trim",
        (after - start) >> 20
    );

    // 2. The bytes of the freed 16 MiB blocks serve the 3 MiB ones: a block released by
    //    its class merges back into the free pages and is split for another class.
    let big: Vec<_> = (0..4).map(|_| touched(&pool, 16 * MIB).unwrap()).collect();
    let spans: Vec<_> = big
        .iter()
        .map(|b| (b.as_ptr() as usize, b.as_ptr() as usize + b.capacity()))
        .collect();
    drop(big); // listed: 16 MiB blocks skip the thread caches
    pool.set_budget(Some(64 * MIB as u64)); // no room beside them: each is released in turn
    let small: Vec<_> = (0..20).map(|_| touched(&pool, 3 * MIB).unwrap()).collect();
    let inside = small
        .iter()
        .filter(|b| {
            let (start, end) = (b.as_ptr() as usize, b.as_ptr() as usize + b.capacity());
            spans.iter().any(|&(s, e)| s <= start && end <= e)
        })
        .count();
    // 5 fit in each 16 MiB block; more where two released blocks lie side by side.
    assert!(
        inside >= 16,
        "{inside} of 20 in the released blocks: {:?}",
        pool.stats()
    );
    assert!(pool.stats().committed_bytes <= 64 * MIB as u64);
    drop(small);
    pool.set_budget(None);

    // 3. Under a budget, churn of sizes that do not fit each other's blocks: the pool never
    //    holds more than the budget resident, blocks and free pages together.
    let budget = 48 * MIB as u64;
    let tight = BufferPool::with_config(PoolConfig {
        budget: Some(budget),
        ..PoolConfig::default()
    })
    .unwrap();
    let base = rss_bytes();
    for round in 0..30 {
        let size = [16 * MIB, 5 * MIB, 7 * MIB, 11 * MIB][round % 4];
        let held: Vec<_> = (0..4).map_while(|_| touched(&tight, size).ok()).collect();
        let stats = tight.stats();
        assert!(stats.committed_bytes <= budget, "round {round}: {stats:?}");
        drop(held);
    }
    let stats = tight.stats();
    assert!(stats.peak_committed_bytes <= budget, "{stats:?}");
    let grown = rss_bytes().saturating_sub(base);
    assert!(
        grown <= budget + 8 * MIB as u64,
        "{} MiB resident beyond the start under a {} MiB budget",
        grown >> 20,
        budget >> 20
    );

    // 4. Under a budget, large blocks merge back at once.
    freed_large_blocks_merge_under_a_budget();

    // 5. A buffer that outlives its pool goes back when it drops, on another thread; the
    //    last one frees the pool, and its pages with it.
    let alive = BufferPool::pools_alive();
    let short_lived = BufferPool::new();
    let survivor = touched(&short_lived, 16 * MIB).unwrap();
    drop(short_lived);
    assert_eq!(
        BufferPool::pools_alive(),
        alive + 1,
        "kept alive by its buffer"
    );
    std::thread::spawn(move || drop(survivor)).join().unwrap();
    assert_eq!(
        BufferPool::pools_alive(),
        alive,
        "freed with its last buffer"
    );

    // 6. Dropped pools give every page back.
    drop(tight);
    drop(pool);
    let end = rss_bytes();
    assert!(
        end < start + 8 * MIB as u64,
        "{} MiB more resident after the pools dropped",
        end.saturating_sub(start) >> 20
    );
}

/// Under a budget, a large block of the pool's pages goes back to them when freed, merged
/// with its free neighbours: two 8 MiB blocks freed side by side serve a 16 MiB request from
/// their own resident pages, with no new mapping and no purge. Without a budget the blocks
/// stay on their class's list for the next request of their size.
fn freed_large_blocks_merge_under_a_budget() {
    let pool = BufferPool::with_config(PoolConfig {
        budget: Some(64 * MIB as u64),
        ..PoolConfig::default()
    })
    .unwrap();
    drop(touched(&pool, 32 * MIB).unwrap()); // 32 MiB of resident free pages, merged
    let (a, b) = (
        touched(&pool, 8 * MIB).unwrap(),
        touched(&pool, 8 * MIB).unwrap(),
    );
    let (a_start, b_start) = (a.as_ptr() as usize, b.as_ptr() as usize);
    assert_eq!(b_start - a_start, 8 * MIB, "carved side by side");
    drop((a, b));
    let stats = pool.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.cached_bytes),
        (0, 0),
        "{stats:?}"
    );
    let (mapped, calls) = (stats.mapped_bytes, stats.os_calls);
    let merged = pool.alloc(16 * MIB).unwrap();
    assert_eq!(merged.as_ptr() as usize, a_start);
    let stats = pool.stats();
    assert_eq!(
        (stats.mapped_bytes, stats.os_calls),
        (mapped, calls),
        "{stats:?}"
    );
    drop(merged);

    let unbudgeted = BufferPool::new();
    drop(unbudgeted.alloc(8 * MIB).unwrap());
    assert_eq!(unbudgeted.stats().cached_in_lists_bytes, 8 * MIB as u64);
}
