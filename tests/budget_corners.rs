//! The budget at its edges, read from the process's resident memory as well as the pool's
//! books: small blocks weighed against dirty free pages, a budget lowered below what is
//! held, huge-page advice given before a budget was set, and the decay clock kept per page,
//! not per range. One test function: resident memory is the process's, so the steps must not
//! overlap with other tests. (Each step failed before its fix: committed 12 MiB under an 8
//! MiB budget; 32 MiB committed with nothing held under 4 MiB; 22 MiB resident for 3 MiB of
//! blocks; 24 MiB dirty long past its time.)

use std::time::{Duration, Instant};

use ferropool::{BufferPool, PoolBuffer, PoolConfig};
use ferropool_figures::rss_bytes;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// `size` bytes, every page written, so that they are resident.
fn touched(pool: &BufferPool, size: usize) -> PoolBuffer {
    let mut buffer = pool.alloc(size).expect("within the budget");
    for page in buffer.as_uninit_mut().chunks_mut(4096) {
        page[0].write(1);
    }
    buffer
}

/// Resident memory above `start`, in MiB.
fn grown(start: u64) -> f64 {
    rss_bytes().saturating_sub(start) as f64 / MIB as f64
}

fn pool(budget: Option<usize>, decay_ms: u64) -> BufferPool {
    BufferPool::with_config(PoolConfig {
        budget: budget.map(|b| b as u64),
        decay_ms,
        ..PoolConfig::default()
    })
    .expect("a valid configuration")
}

#[test]
#[cfg_attr(ferropool_sanitizer, ignore = "sanitizers keep shadow memory resident")]
#[cfg_attr(miri, ignore = "no process figures under Miri")]
fn the_budget_holds_in_every_corner() {
    if rss_bytes() == 0 {
        return; // no /proc: nothing to measure
    }
    small_blocks_are_weighed_against_dirty_pages();
    a_lowered_budget_gives_back_what_is_freed();
    a_budget_withdraws_earlier_huge_page_advice();
    the_clock_is_per_page();
}

/// 4 MiB held, 4 MiB freed and dirty, then 4 MiB of 16 KiB blocks (from the heap, below the
/// page layer): the dirty pages make room for them.
fn small_blocks_are_weighed_against_dirty_pages() {
    let budget = 8 * MIB;
    let pool = pool(Some(budget), u64::MAX);
    let start = rss_bytes();
    let held = touched(&pool, 4 * MIB);
    drop(touched(&pool, 4 * MIB)); // to the pages, dirty
    assert!(pool.stats().dirty_bytes >= 4 * MIB as u64 - 64 * KIB as u64);
    let small: Vec<PoolBuffer> = (0..255).map(|_| touched(&pool, 16 * KIB)).collect();
    let stats = pool.stats();
    assert!(
        stats.committed_bytes <= budget as u64 && stats.peak_committed_bytes <= budget as u64,
        "committed past the budget: {stats:?}"
    );
    assert!(
        grown(start) < 10.0,
        "{:.1} MiB resident under 8",
        grown(start)
    );
    drop((small, held));
}

/// 32 MiB written and held, the budget lowered to 4 MiB, everything dropped: no more than
/// the budget stays resident, with a clock that never purges.
fn a_lowered_budget_gives_back_what_is_freed() {
    let pool = pool(None, u64::MAX);
    let start = rss_bytes();
    let held: Vec<PoolBuffer> = (0..8).map(|_| touched(&pool, 4 * MIB)).collect();
    let small: Vec<PoolBuffer> = (0..64).map(|_| touched(&pool, 64 * KIB)).collect();
    assert!(grown(start) > 30.0);
    pool.set_budget(Some(4 * MIB as u64));
    drop((held, small));
    let stats = pool.stats();
    assert!(
        stats.committed_bytes <= 4 * MIB as u64,
        "committed {} MiB with nothing held under 4: {stats:?}",
        stats.committed_bytes >> 20
    );
    assert!(
        grown(start) < 6.0,
        "{:.1} MiB resident under 4",
        grown(start)
    );
    // Once within the budget again, freed blocks were cached as before.
    assert!(stats.cached_in_threads_bytes > 0, "{stats:?}");
}

/// The process's anonymous memory in transparent huge pages, bytes (0 where the kernel does
/// not say).
fn huge_page_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("AnonHugePages:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib << 10)
}

/// A 32 MiB block advised for huge pages while the pool had no budget, given back and
/// purged (its segment kept by a block beside it); then a budget of 4 MiB: small blocks
/// carved where it was take small pages, not huge ones the budget would not see.
fn a_budget_withdraws_earlier_huge_page_advice() {
    let pool = pool(None, u64::MAX);
    let big = touched(&pool, 32 * MIB);
    let beside = touched(&pool, MIB); // in the big block's segment: it stays mapped
    let huge_before = huge_page_bytes();
    drop(big);
    pool.trim(); // its pages purged, its advice left on them
    pool.set_budget(Some(4 * MIB as u64));
    let start = (rss_bytes(), huge_page_bytes());
    let blocks: Vec<PoolBuffer> = (0..6).map(|_| touched(&pool, 512 * KIB)).collect();
    let stats = pool.stats();
    assert!(stats.committed_bytes <= 4 * MIB as u64, "{stats:?}");
    let huge = huge_page_bytes().saturating_sub(start.1);
    assert_eq!(
        huge,
        0,
        "{} MiB of new huge pages for 3 MiB of blocks ({:.1} MiB resident; {} MiB of huge \
         pages before the budget)",
        huge >> 20,
        grown(start.0),
        huge_before >> 20
    );
    drop((blocks, beside));
}

/// 24 MiB freed, then a 2 MiB block beside them taken and given back every 10 ms, for longer
/// than the clock's period: the 24 MiB go back to the OS when their time comes, whatever was
/// freed beside them since (a merge once stamped the whole range with its newest free).
fn the_clock_is_per_page() {
    let decay = Duration::from_millis(100);
    let pool = pool(Some(64 * MIB), decay.as_millis() as u64);
    let start = rss_bytes();
    drop(touched(&pool, 26 * MIB)); // one free range of 26 MiB, dirty
    let big = touched(&pool, 24 * MIB); // its first 24 MiB
    let beside = touched(&pool, 2 * MIB); // and the rest: the big block's neighbour
    drop(big);
    assert!(pool.stats().dirty_bytes >= 24 * MIB as u64);
    drop(beside); // merges with the 24 MiB, freed later
    let began = Instant::now();
    while began.elapsed() < decay * 4 {
        let again = touched(&pool, 2 * MIB); // from the merged range, given back into it
        std::thread::sleep(Duration::from_millis(10));
        drop(again);
    }
    let stats = pool.stats();
    assert!(
        stats.dirty_bytes <= 4 * MIB as u64,
        "{} MiB dirty after four periods of the clock: {stats:?}",
        stats.dirty_bytes >> 20
    );
    assert!(grown(start) < 8.0, "{:.1} MiB still resident", grown(start));
}
