//! The page layer against a model of its address space: after every step the free ranges
//! and the blocks handed out cover every segment exactly, with no overlap, the free ranges
//! are maximal, every dirty count agrees with the page bits, and under a budget the blocks
//! plus the dirty pages stay within it.

use std::ptr::NonNull;

use proptest::prelude::*;

use super::{segment_of, PageBooks, PageLayer, Room, PAGE, PURGE_SLACK};

impl PageLayer {
    /// Checks every invariant of the state against the blocks the caller holds.
    fn check(&self, held: &[(NonNull<u8>, usize)]) {
        let state = self.lock();
        let PageBooks {
            free,
            segments,
            dirty,
            mapped,
            carved,
            ..
        } = &*state;
        let segments = segments.as_slice();
        assert_eq!(*mapped, segments.iter().map(|s| s.len).sum::<usize>());
        assert_eq!(*carved, held.iter().map(|h| h.1).sum::<usize>());
        // Every byte of every segment: in one free range or one held block.
        let mut pieces: Vec<(usize, usize, bool)> = free
            .as_slice()
            .iter()
            .map(|f| (f.start, f.len, true))
            .chain(
                held.iter()
                    .map(|&(p, len)| (p.as_ptr() as usize, len, false)),
            )
            .collect();
        pieces.sort_unstable();
        let expected = expected_beside(&pieces, &state.segments);
        let mut at = 0;
        for segment in segments {
            let (start, end) = segment.bounds();
            let mut cursor = start;
            let mut last_free_end = None;
            while at < pieces.len() && pieces[at].0 < end {
                let (p, len, is_free) = pieces[at];
                assert_eq!(p, cursor, "a gap or an overlap at {p:#x}");
                assert!(p + len <= end, "a piece past its segment");
                if is_free {
                    assert_ne!(last_free_end, Some(p), "two adjacent free ranges");
                    last_free_end = Some(p + len);
                } else {
                    assert_eq!(segment.dirty(p, p + len), 0, "a held block's bits are set");
                }
                cursor = p + len;
                at += 1;
            }
            assert_eq!(cursor, end, "the segment's tail is lost");
        }
        assert_eq!(at, pieces.len(), "a piece outside every segment");
        let mut total = 0;
        for f in free.as_slice() {
            let segment = &segments[segment_of(&state.segments, f.start)];
            assert_eq!(f.dirty, segment.dirty(f.start, f.end()), "{f:?}");
            total += f.dirty;
        }
        assert_eq!(*dirty, total);
        drop(state);
        let mut asked: Vec<super::Beside> = expected
            .iter()
            .map(|b| super::Beside {
                start: b.start,
                len: b.len,
                ..super::Beside::default()
            })
            .collect();
        self.free_beside(&mut asked);
        assert_eq!(asked, expected, "the free bytes beside the held blocks");
    }
}

/// What `free_beside` must say of each held block of `pieces` (the free ranges and the held
/// blocks, sorted by address): the free piece that ends where it starts and the one that
/// starts where it ends, in its segment.
fn expected_beside(
    pieces: &[(usize, usize, bool)],
    segments: &super::SysVec<super::Segment>,
) -> Vec<super::Beside> {
    let mut expected = Vec::new();
    for (k, &(p, len, is_free)) in pieces.iter().enumerate() {
        if is_free {
            continue;
        }
        let segment = segments.as_slice()[segment_of(segments, p)].bounds();
        let free_at = |i: Option<usize>, adjoins: &dyn Fn(usize, usize) -> bool| {
            i.and_then(|i| pieces.get(i))
                .filter(|&&(q, n, f)| f && q >= segment.0 && q + n <= segment.1 && adjoins(q, n))
                .map_or(0, |&(_, n, _)| n)
        };
        let before = free_at(k.checked_sub(1), &|q, n| q + n == p);
        let after = free_at(Some(k + 1), &|q, _| q == p + len);
        expected.push(super::Beside {
            start: p,
            len,
            before,
            after,
            segment: segment.0,
        });
    }
    expected
}

fn room(budget: u64) -> impl FnOnce() -> Room {
    move || Room { budget, outside: 0 }
}

/// No budget: what a pool without one gives the layer.
fn unlimited() -> Room {
    Room {
        budget: u64::MAX,
        outside: 0,
    }
}

#[derive(Clone, Debug)]
enum Step {
    /// Obtain this many pages, aligned to this many pages (a power of two), zeroed or not.
    Obtain(usize, u32, bool),
    /// Give back the held block at this index (modulo how many are held).
    GiveBack(usize),
    Trim,
    /// Set the budget to this many pages (only in a run under a budget), as
    /// `BufferPool::set_budget` does: the pool refuses what does not fit from then on, and
    /// the layer purges to the new room.
    SetBudget(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1usize..300, 0u32..4, any::<bool>()).prop_map(|(p, a, z)| Step::Obtain(p, a, z)),
        4 => any::<usize>().prop_map(Step::GiveBack),
        1 => Just(Step::Trim),
        1 => (1usize..2000).prop_map(Step::SetBudget),
    ]
}

/// Runs `steps` under `budget` and checks the state after each.
fn run(steps: &[Step], budget: Option<u64>) {
    let layer = PageLayer::new(u64::MAX);
    let mut limit = budget.unwrap_or(u64::MAX);
    let mut held: Vec<(NonNull<u8>, usize)> = Vec::new();
    for step in steps {
        match *step {
            Step::Obtain(pages, align, zeroed) => {
                let len = pages * PAGE;
                let carved: usize = held.iter().map(|h| h.1).sum();
                if (carved + len) as u64 > limit {
                    continue; // the pool's reservation would refuse it
                }
                let block = layer
                    .obtain(len, PAGE << align, zeroed, room(limit))
                    .expect("the system grants small segments");
                assert_eq!(block.as_ptr() as usize % (PAGE << align), 0);
                // SAFETY: the block is ours: `len` bytes.
                let bytes = unsafe { std::slice::from_raw_parts_mut(block.as_ptr(), len) };
                if zeroed {
                    assert!(
                        bytes.iter().all(|&b| b == 0),
                        "a zeroed block with old bytes"
                    );
                }
                bytes.fill(0xA5);
                held.push((block, len));
            }
            Step::GiveBack(i) if !held.is_empty() => {
                let (block, len) = held.swap_remove(i % held.len());
                // SAFETY: from `obtain` with this length; not used again.
                unsafe { layer.give_back(block, len, false, room(limit)) };
            }
            Step::GiveBack(_) => {}
            Step::Trim => {
                layer.trim();
            }
            Step::SetBudget(pages) if budget.is_some() => {
                limit = (pages * PAGE) as u64;
                layer.fit(room(limit)());
            }
            Step::SetBudget(_) => {}
        }
        layer.check(&held);
        // Whenever what is held fits (a budget lowered below it waits for frees), the held
        // blocks and the dirty free pages fit together.
        let carved: u64 = held.iter().map(|h| h.1 as u64).sum();
        if budget.is_some() && carved <= limit {
            assert!(carved + layer.dirty_bytes() <= limit, "past the budget");
        }
    }
    for (block, len) in held.drain(..) {
        // SAFETY: as above.
        unsafe { layer.give_back(block, len, false, unlimited) };
    }
    layer.check(&[]);
    layer.trim();
    assert_eq!((layer.mapped_bytes(), layer.dirty_bytes()), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    #[cfg_attr(miri, ignore = "the model test below runs under Miri")]
    fn every_byte_is_in_one_place_and_every_merge_is_maximal(
        steps in prop::collection::vec(step(), 1..120),
    ) {
        run(&steps, None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "the model test below runs under Miri")]
    fn under_a_budget_blocks_and_dirty_pages_stay_within_it(
        steps in prop::collection::vec(step(), 1..120),
        budget_pages in 300usize..2000,
    ) {
        run(&steps, Some((budget_pages * PAGE) as u64));
    }
}

/// A fixed run for Miri: splits, merges on both sides, an aligned carve, purges for a
/// budget, and a trim.
#[test]
fn a_fixed_run_splits_merges_and_purges() {
    use Step::*;
    let steps = [
        Obtain(4, 0, false),
        Obtain(8, 0, true),
        Obtain(2, 3, false),
        GiveBack(0),
        Obtain(1, 0, true),
        GiveBack(1),
        GiveBack(0),
        Obtain(16, 2, true),
        Trim,
        GiveBack(0),
        GiveBack(0),
    ];
    run(&steps, None);
    run(&steps, Some(20 * PAGE as u64));
}

#[test]
fn a_block_given_back_serves_a_request_of_another_size_without_the_os() {
    let layer = PageLayer::new(u64::MAX);
    let big = layer
        .obtain(64 * PAGE, PAGE, false, room(u64::MAX))
        .unwrap();
    let calls = layer.os_calls();
    // SAFETY: from `obtain`, not used again.
    unsafe { layer.give_back(big, 64 * PAGE, false, unlimited) };
    let a = layer
        .obtain(16 * PAGE, PAGE, false, room(u64::MAX))
        .unwrap();
    let b = layer
        .obtain(48 * PAGE, PAGE, false, room(u64::MAX))
        .unwrap();
    assert_eq!(layer.os_calls(), calls, "served from the freed block");
    assert_eq!(a, big, "carved where the freed block was");
    // A zeroed request from dirty pages is zeroed by hand.
    // SAFETY: both ours, not used again.
    unsafe {
        a.as_ptr().write_bytes(7, 16 * PAGE);
        layer.give_back(a, 16 * PAGE, false, unlimited);
        layer.give_back(b, 48 * PAGE, false, unlimited);
    }
    let z = layer.obtain(16 * PAGE, PAGE, true, room(u64::MAX)).unwrap();
    // SAFETY: ours.
    assert!(unsafe { std::slice::from_raw_parts(z.as_ptr(), 16 * PAGE) }
        .iter()
        .all(|&b| b == 0));
    layer.check(&[(z, 16 * PAGE)]);
    // SAFETY: ours, not used again.
    unsafe { layer.give_back(z, 16 * PAGE, false, unlimited) };
}

#[test]
fn a_budget_purges_the_free_pages_it_has_no_room_for() {
    let layer = PageLayer::new(u64::MAX);
    let budget = 80 * PAGE as u64;
    let a = layer.obtain(32 * PAGE, PAGE, false, room(budget)).unwrap();
    let b = layer.obtain(32 * PAGE, PAGE, false, room(budget)).unwrap();
    // SAFETY: ours, not used again.
    unsafe { layer.give_back(a, 32 * PAGE, false, unlimited) };
    assert_eq!(layer.dirty_bytes(), 32 * PAGE as u64);
    // 40 pages fit in no dirty range: they come from clean pages, and the budget then has
    // room for 8 dirty pages beside the 72 held; the purge goes PURGE_SLACK past that, so
    // all 32 go back to the OS.
    let c = layer.obtain(40 * PAGE, PAGE, false, room(budget)).unwrap();
    assert_eq!(layer.dirty_bytes(), 0);
    assert_eq!(layer.purged_bytes(), 32 * PAGE as u64);
    // One segment holds all three (under Miri, whose first segment is 64 KiB, each takes
    // one of its own), and one purge.
    let maps = if cfg!(miri) { 3 } else { 1 };
    assert_eq!(layer.os_calls(), maps + 1, "the maps and one purge");
    layer.check(&[(b, 32 * PAGE), (c, 40 * PAGE)]);
    // SAFETY: ours, not used again.
    unsafe {
        layer.give_back(b, 32 * PAGE, false, unlimited);
        layer.give_back(c, 40 * PAGE, false, unlimited);
    }
}

#[test]
fn a_decay_of_zero_returns_each_page_at_once() {
    let layer = PageLayer::new(0);
    let a = layer.obtain(8 * PAGE, PAGE, false, room(u64::MAX)).unwrap();
    // SAFETY: ours, not used again.
    unsafe { layer.give_back(a, 8 * PAGE, false, unlimited) };
    assert_eq!(layer.dirty_bytes(), 0);
    assert_eq!(layer.purged_bytes(), 8 * PAGE as u64);
}

#[test]
fn a_request_takes_the_resident_pages_inside_a_range_before_its_clean_head() {
    let layer = PageLayer::new(u64::MAX);
    let any = || room(u64::MAX);
    let a = layer.obtain(8 * PAGE, PAGE, false, any()).unwrap();
    let b = layer.obtain(8 * PAGE, PAGE, false, any()).unwrap();
    let c = layer.obtain(8 * PAGE, PAGE, false, any()).unwrap();
    // SAFETY: ours, not used again.
    unsafe { layer.give_back(b, 8 * PAGE, false, unlimited) };
    // b's pages are clean now.
    layer.trim();
    // SAFETY: as above.
    unsafe { layer.give_back(c, 8 * PAGE, false, unlimited) };
    // One range: b (clean), c (dirty), the segment's clean rest.
    assert_eq!(layer.dirty_bytes(), 8 * PAGE as u64);
    let again = layer.obtain(8 * PAGE, PAGE, false, any()).unwrap();
    assert_eq!(
        again, c,
        "served from the resident pages, not the range's clean head"
    );
    assert_eq!(layer.dirty_bytes(), 0);
    layer.check(&[(a, 8 * PAGE), (again, 8 * PAGE)]);
    // SAFETY: as above.
    unsafe {
        layer.give_back(a, 8 * PAGE, false, unlimited);
        layer.give_back(again, 8 * PAGE, false, unlimited);
    }
}

/// Segments grow to `SEGMENT_MAX` and stay there, however many were mapped and unmapped
/// before: the doubling wrapped to 0 from 42 maps to 63, and every segment then was only as
/// large as its request (one map per block).
#[test]
#[cfg_attr(miri, ignore = "maps 50 segments")]
fn segments_stay_large_after_many_maps() {
    let layer = PageLayer::new(u64::MAX);
    for _ in 0..50 {
        let block = layer.obtain(PAGE, PAGE, false, room(u64::MAX)).unwrap();
        // SAFETY: ours, not used again.
        unsafe { layer.give_back(block, PAGE, false, unlimited) };
        layer.trim();
        assert_eq!(layer.mapped_bytes(), 0, "the segment went back");
    }
    let block = layer.obtain(PAGE, PAGE, false, room(u64::MAX)).unwrap();
    assert_eq!(layer.mapped_bytes(), super::SEGMENT_MAX as u64);
    // SAFETY: ours, not used again.
    unsafe { layer.give_back(block, PAGE, false, unlimited) };
}

/// A request that no resident run holds whole goes where it covers the most resident pages,
/// not to the shortest clean range: each resident page it takes is one fault fewer, and one
/// page the budget need not purge elsewhere.
#[test]
fn a_request_no_resident_run_holds_takes_the_most_resident_pages() {
    let layer = PageLayer::new(u64::MAX);
    let any = || room(u64::MAX);
    let pages = |n: usize| layer.obtain(n * PAGE, PAGE, false, any()).unwrap();
    let (a, b, c, d, e, f) = (pages(2), pages(2), pages(2), pages(1), pages(3), pages(1));
    // SAFETY: ours, not used again.
    unsafe {
        layer.give_back(c, 2 * PAGE, false, unlimited);
        layer.give_back(e, 3 * PAGE, false, unlimited);
    }
    // c's and e's pages are clean now.
    layer.trim();
    // SAFETY: ours, not used again.
    unsafe { layer.give_back(b, 2 * PAGE, false, unlimited) };
    // Free: b (2 pages, resident) + c (2, clean); e (3, clean), the shortest that holds 3.
    let got = pages(3);
    assert_eq!(got, b, "the piece that covers b's resident pages");
    assert_eq!(layer.dirty_bytes(), 0);
    layer.check(&[(a, 2 * PAGE), (got, 3 * PAGE), (d, PAGE), (f, PAGE)]);
    // SAFETY: ours, not used again.
    unsafe {
        layer.give_back(a, 2 * PAGE, false, unlimited);
        layer.give_back(got, 3 * PAGE, false, unlimited);
        layer.give_back(d, PAGE, false, unlimited);
        layer.give_back(f, PAGE, false, unlimited);
    }
}

/// The budget's purge takes the fragment with the fewest resident pages first, and leaves a
/// large resident range whole for the next large request.
#[test]
#[cfg_attr(miri, ignore = "maps segments of several MiB")]
fn a_purge_takes_the_smallest_resident_fragment_first() {
    const MIB: usize = 1 << 20;
    let layer = PageLayer::new(u64::MAX);
    let any = || room(u64::MAX);
    let held = [(); 3].map(|()| layer.obtain(PAGE, PAGE, false, any()).unwrap());
    let fragment = layer.obtain(2 * MIB, PAGE, false, any()).unwrap();
    let between = layer.obtain(PAGE, PAGE, false, any()).unwrap();
    let large = layer.obtain(8 * MIB, PAGE, false, any()).unwrap();
    let last = layer.obtain(PAGE, PAGE, false, any()).unwrap();
    // SAFETY: ours, not used again.
    unsafe {
        layer.give_back(fragment, 2 * MIB, false, unlimited);
        layer.give_back(large, 8 * MIB, false, unlimited);
    }
    assert_eq!(layer.dirty_bytes(), 10 * MIB as u64);
    // Held after the next carve: 5 pages and 9 MiB. The budget leaves room for all but one
    // resident page: the purge takes that page and PURGE_SLACK more, from the fragment.
    let budget = (5 * PAGE + 9 * MIB + 10 * MIB - PAGE) as u64;
    let clean = layer.obtain(9 * MIB, PAGE, false, room(budget)).unwrap();
    assert_eq!(layer.purged_bytes(), (PURGE_SLACK + PAGE) as u64);
    let before = layer.dirty_bytes();
    let again = layer.obtain(8 * MIB, PAGE, false, any()).unwrap();
    let taken = before - layer.dirty_bytes();
    assert_eq!(
        taken,
        8 * MIB as u64,
        "the large range is still resident whole"
    );
    assert_eq!(again, large);
    // SAFETY: ours, not used again.
    unsafe {
        for block in held.into_iter().chain([between, last]) {
            layer.give_back(block, PAGE, false, unlimited);
        }
        layer.give_back(clean, 9 * MIB, false, unlimited);
        layer.give_back(again, 8 * MIB, false, unlimited);
    }
}

#[test]
fn a_block_given_back_zero_is_dirty_but_not_cleared_again_and_a_written_neighbour_is() {
    let layer = PageLayer::new(u64::MAX);
    let a = layer.obtain(16 * PAGE, PAGE, true, room(u64::MAX)).unwrap();
    let b = layer
        .obtain(16 * PAGE, PAGE, false, room(u64::MAX))
        .unwrap();
    // `a` goes back said to be zero (here it is not, so that a skipped clear shows), `b`
    // written.
    // SAFETY: both ours, not used again.
    unsafe {
        a.as_ptr().write_bytes(7, 16 * PAGE);
        b.as_ptr().write_bytes(9, 16 * PAGE);
        layer.give_back(a, 16 * PAGE, true, unlimited);
    }
    assert_eq!(layer.dirty_bytes(), 16 * PAGE as u64, "dirty all the same");
    let again = layer.obtain(16 * PAGE, PAGE, true, room(u64::MAX)).unwrap();
    assert_eq!(again, a, "the warm pages first");
    // SAFETY: ours.
    let bytes = unsafe { std::slice::from_raw_parts(again.as_ptr(), 16 * PAGE) };
    assert!(
        bytes.iter().all(|&x| x == 7),
        "a zero block is not cleared again"
    );
    // Both back, `again` said zero and `b` written: a carve across both is cleared.
    // SAFETY: ours, not used again.
    unsafe {
        layer.give_back(again, 16 * PAGE, true, unlimited);
        layer.give_back(b, 16 * PAGE, false, unlimited);
    }
    let both = layer.obtain(32 * PAGE, PAGE, true, room(u64::MAX)).unwrap();
    // SAFETY: ours.
    let bytes = unsafe { std::slice::from_raw_parts(both.as_ptr(), 32 * PAGE) };
    assert!(
        bytes.iter().all(|&x| x == 0),
        "written pages in the carve: cleared"
    );
    layer.check(&[(both, 32 * PAGE)]);
    // SAFETY: ours, not used again.
    unsafe { layer.give_back(both, 32 * PAGE, false, unlimited) };
}
