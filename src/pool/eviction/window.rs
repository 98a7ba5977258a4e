//! Coop's window search (NeurIPS 2023), for the eviction's first step: a pure function
//! over the candidates' blocks and the free pages beside them, held to an exhaustive search
//! by a property test.

use crate::pool::pages::Beside;

/// The lightest window over `blocks` (sorted by address, with the free bytes beside each
/// filled in): a run `first..=last` of blocks each of which reaches the next (its free
/// bytes after end where the next starts, in one segment), whose span (the free bytes
/// before the first, the run, the free bytes after the last) holds `need` bytes and whose
/// blocks hold at most `cap` bytes, with the least sum of `weight(i)`, then the shortest
/// span. `None` if no such run exists.
///
/// Linear: only the shortest spanning run from each first block can win (a longer one
/// weighs and holds more), and it ends no earlier than the previous first block's (a run
/// spans less from a later first block), so `last` only moves forward.
pub(super) fn lightest_window(
    blocks: &[Beside],
    weight: impl Fn(usize) -> f64,
    need: usize,
    cap: usize,
) -> Option<(usize, usize)> {
    // Sums over `first..=last` as differences of prefix sums.
    let mut weights = vec![0.0];
    let mut lens = vec![0usize];
    for (i, block) in blocks.iter().enumerate() {
        weights.push(weights[i] + weight(i));
        lens.push(lens[i].saturating_add(block.len));
    }
    let span = |first: usize, last: usize| {
        let run = (blocks[last].start + blocks[last].len).saturating_sub(blocks[first].start);
        blocks[first]
            .before
            .saturating_add(run)
            .saturating_add(blocks[last].after)
    };
    let mut best: Option<(f64, usize, usize, usize)> = None;
    let mut last = 0;
    for first in 0..blocks.len() {
        last = last.max(first);
        while span(first, last) < need
            && last + 1 < blocks.len()
            && blocks[last].reaches(&blocks[last + 1])
        {
            last += 1;
        }
        let (sum, held, spanned) = (
            weights[last + 1] - weights[first],
            lens[last + 1] - lens[first],
            span(first, last),
        );
        if spanned >= need && held <= cap && best.is_none_or(|(w, s, ..)| (sum, spanned) < (w, s)) {
            best = Some((sum, spanned, first, last));
        }
    }
    best.map(|(_, _, first, last)| (first, last))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::lightest_window;
    use crate::pool::pages::Beside;

    const MIB: usize = 1 << 20;

    /// Blocks of 1 MiB at the given MiB offsets of one segment, with the free MiB beside.
    fn blocks(layout: &[(usize, usize, usize)]) -> Vec<Beside> {
        layout
            .iter()
            .map(|&(at, before, after)| Beside {
                start: (64 + at) * MIB,
                len: MIB,
                before: before * MIB,
                after: after * MIB,
                segment: 64 * MIB,
            })
            .collect()
    }

    #[test]
    fn the_lightest_run_that_spans_the_request_wins() {
        let any = usize::MAX;
        // 0 1 2 3 held end to end: a 2 MiB request takes two neighbours, the lighter pair.
        let four = blocks(&[(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)]);
        let weights = [1.0, 9.0, 1.0, 2.0];
        assert_eq!(
            lightest_window(&four, |i| weights[i], 2 * MIB, any),
            Some((2, 3))
        );
        // A block with a free MiB beside it spans 2 MiB alone: the lighter of the two that do.
        let lone = blocks(&[(0, 0, 1), (2, 1, 0)]);
        let weights = [2.0, 1.0];
        assert_eq!(
            lightest_window(&lone, |i| weights[i], 2 * MIB, any),
            Some((1, 1))
        );
        // A held block in between (not a candidate) breaks the run: no window.
        let split = blocks(&[(0, 0, 0), (2, 0, 0)]);
        assert_eq!(lightest_window(&split, |_| 1.0, 2 * MIB, any), None);
        // Free pages between two blocks join them.
        let gap = blocks(&[(0, 0, 1), (2, 1, 0)]);
        assert_eq!(lightest_window(&gap, |_| 1.0, 3 * MIB, any), Some((0, 1)));
        // The run restarts past a break, and a later run can win.
        let runs = blocks(&[(0, 0, 0), (1, 0, 0), (3, 0, 0), (4, 0, 0)]);
        let weights = [5.0, 5.0, 1.0, 1.0];
        assert_eq!(
            lightest_window(&runs, |i| weights[i], 2 * MIB, any),
            Some((2, 3))
        );
    }

    #[test]
    fn a_window_never_holds_more_than_its_cap() {
        // Two 1 MiB neighbours for a 2 MiB request: within a cap of 2 MiB, not of 1 MiB.
        let two = blocks(&[(0, 0, 0), (1, 0, 0)]);
        assert_eq!(
            lightest_window(&two, |_| 1.0, 2 * MIB, 2 * MIB),
            Some((0, 1))
        );
        assert_eq!(lightest_window(&two, |_| 1.0, 2 * MIB, MIB), None);
        // A 1 MiB request: either block alone, never both.
        assert_eq!(
            lightest_window(&two, |i| [3.0, 1.0][i], MIB, MIB),
            Some((1, 1))
        );
    }

    /// Every run tried, for each first block every last one: what the linear search must
    /// agree with.
    fn every_run(
        blocks: &[Beside],
        weight: &[f64],
        need: usize,
        cap: usize,
    ) -> Option<(usize, usize)> {
        let mut best: Option<(f64, usize, usize, usize)> = None;
        for first in 0..blocks.len() {
            let (mut sum, mut held) = (0.0, 0);
            for last in first..blocks.len() {
                if last > first && !blocks[last - 1].reaches(&blocks[last]) {
                    break;
                }
                sum += weight[last];
                held += blocks[last].len;
                let run = blocks[last].start + blocks[last].len - blocks[first].start;
                let span = blocks[first].before + run + blocks[last].after;
                if span >= need {
                    if held <= cap && best.is_none_or(|(w, s, ..)| (sum, span) < (w, s)) {
                        best = Some((sum, span, first, last));
                    }
                    break;
                }
            }
        }
        best.map(|(_, _, first, last)| (first, last))
    }

    proptest::proptest! {
        #[test]
        fn the_linear_search_finds_the_lightest_run(
            // (free MiB before, held MiB, weight) for each block, end to end in a segment,
            // or (a zero length) a held block between that is no candidate.
            layout in proptest::collection::vec((0usize..3, 0usize..4, 1u32..9), 0..12),
            need in 1usize..10,
            cap in 1usize..12,
        ) {
            let mut blocks: Vec<Beside> = Vec::new();
            let mut weights = Vec::new();
            let mut at = 64 * MIB;
            // Free bytes since the last held block (candidate or not), and whether that
            // block was a candidate (then those bytes are its `after`).
            let mut free_run = 0;
            let mut after_candidate = false;
            for (free, len, weight) in layout {
                at += free * MIB;
                free_run += free * MIB;
                if after_candidate {
                    blocks.last_mut().unwrap().after = free_run;
                }
                if len == 0 {
                    at += MIB; // a held block that is no candidate
                    (free_run, after_candidate) = (0, false);
                    continue;
                }
                blocks.push(Beside {
                    start: at,
                    len: len * MIB,
                    before: free_run,
                    after: 0,
                    segment: 64 * MIB,
                });
                weights.push(f64::from(weight));
                at += len * MIB;
                (free_run, after_candidate) = (0, true);
            }
            proptest::prop_assert_eq!(
                lightest_window(&blocks, |i| weights[i], need * MIB, cap * MIB),
                every_run(&blocks, &weights, need * MIB, cap * MIB)
            );
        }
    }

    #[test]
    fn blocks_of_two_segments_never_make_one_window() {
        let mut two = blocks(&[(0, 0, 0), (1, 0, 0)]);
        two[1].segment += MIB; // end to end in memory, but another segment
        assert_eq!(lightest_window(&two, |_| 1.0, 2 * MIB, usize::MAX), None);
        assert_eq!(
            lightest_window(&two, |_| 1.0, MIB, usize::MAX),
            Some((0, 0))
        );
    }
}
