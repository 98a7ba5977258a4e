#!/usr/bin/env bash
# Runs the loom models.
#   scripts/loom.sh            bound 2 (what CI runs)
#   scripts/loom.sh 3          bound 3
#   scripts/loom.sh --planted  plants each known bug in turn (a patch from loom_tests/planted/
#                              applied to a scratch copy); every model must then FAIL
#                              (PLANTED_ONLY="bug ..." limits it to some bugs)
#   scripts/loom.sh --planted-check  only applies each planted patch and type-checks the tree
#                              (CI runs it, so that no patch rots while the code moves on)
set -euo pipefail
cd "$(dirname "$0")/.."

bound=2
planted=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --planted) planted=1 ;;
    --planted-check) planted=1; check_only=1 ;;
    [0-9]*) bound=$arg ;;
    *) echo "usage: scripts/loom.sh [BOUND] [--planted]" >&2; exit 2 ;;
  esac
done

# Each loom target, and the planted bug (a patch in loom_tests/planted/) that must make one
# of its models fail: "target:model:bug".
targets=(loom_arena loom_pool loom_retain loom_checkpoint loom_evict)
planted_cases=(
  "loom_arena:get_racing_remove:free_immediately"
  "loom_arena:get_racing_discard:free_immediately"
  "loom_arena:stale_key_never_sees_a_reinserted_value:unchecked_generation"
  "loom_arena:concurrent_inserts_grow_a_page:page_overwrite"
  "loom_arena:racing_removes_drop_exactly_once:remove_without_cas"
  "loom_arena:shrink_racing_the_collector:ready_take_store"
  "loom_arena:insert_steals_from_another_shard:stack_pop_store"
  "loom_arena:a_dry_shard_grows_before_it_steals:steal_before_growing"
  "loom_arena:trim_racing_an_insert:trim_unfrozen"
  "loom_arena:a_trim_releases_the_page_a_claim_allocated:claim_into_a_released_page"
  "loom_arena:a_trim_releases_the_page_a_lost_claim_allocated:trim_keeps_a_lost_claims_page"
  "loom_arena:a_claim_whose_frontier_a_trim_brought_back:claim_into_a_released_page"
  "loom_arena:a_claim_whose_frontier_a_trim_brought_back:claim_keeps_a_stale_floor"
  "loom_arena:a_discard_racing_a_trim:trim_without_waiting_out"
  "loom_arena:get_racing_a_discard_flushed_from_a_partial_batch:flush_without_grace"
  "loom_arena:a_flush_takes_a_lane_its_owner_is_using:lane_drain_unfenced"
  "loom_arena:a_flush_takes_a_lane_its_owner_discards_into:lane_drain_unfenced"
  "loom_arena:an_insert_at_the_cap_racing_a_trim:cap_pops_unfrozen"
  "loom_arena:an_insert_at_the_cap_racing_a_trim:cap_ignores_drainers"
  "loom_arena:an_insert_at_the_cap_racing_a_trim:hand_back_before_push"
  "loom_arena:an_insert_at_the_cap_racing_a_trim:cap_takes_no_hands"
  "loom_pool:cross_thread_free_racing_alloc:stack_push_store"
  "loom_pool:cross_thread_free_racing_trim:take_all_store"
  "loom_pool:racing_spare_pops_leave_a_block_listed:spare_look_then_pop"
  "loom_pool:owner_racing_a_drain_of_its_cache:drain_unfenced"
  "loom_pool:owner_racing_a_drain_of_its_cache:enter_relaxed"
  "loom_pool:a_free_reaches_the_thread_that_allocated:free_to_own_cache"
  "loom_pool:a_zero_mark_never_outlives_a_write:mark_zero_after_free"
  "loom_pool:a_second_thread_ends_the_sole_writers_counting:join_without_waiting_out"
  "loom_pool:close_racing_a_free_in_flight:close_without_wait"
  "loom_pool:last_buffers_dropped_on_two_threads:remaining_load_store"
  "loom_pool:peak_reserved_while_a_reservation_races_a_trim:peak_reserved_late"
  "loom_pool:the_peak_since_a_reset_is_exact_under_a_reader:raise_across_a_reset"
  "loom_pool:a_reservation_the_system_refuses_never_reaches_the_figures:peak_before_grant"
  "loom_pool:stats_never_count_a_free_before_its_allocation:totals_cache_by_cache"
  "loom_pool:stats_never_count_a_free_before_its_allocation:frees_relaxed"
  "loom_pool:two_carves_from_the_page_layer_at_once:pages_look_then_carve"
  "loom_retain:clone_read_drop_on_a_shared_group:clone_without_count"
  "loom_checkpoint:shared_chains_dropped_on_two_threads:chain_drop_leaks"
  "loom_evict:an_eviction_asked_for_racing_a_pin:evict_pinned"
  "loom_evict:an_eviction_for_a_refused_request_racing_a_pin:evict_pinned"
  "loom_evict:a_window_eviction_racing_a_pin:evict_pinned"
  "loom_evict:queries_racing_an_eviction_never_refuse_the_request:query_pins"
  "loom_evict:two_readers_of_an_evicted_value_recompute_it_once:claim_twice"
  "loom_evict:a_reader_waiting_for_a_failed_recompute_takes_it_over:abandon_without_waking"
  "loom_evict:a_recompute_racing_an_eviction_and_the_drops:evict_recomputing"
)

base_flags="--cfg loom --cfg crossbeam_loom -C debug-assertions=on"
export LOOM_MAX_PREEMPTIONS=$bound

if [ "$planted" = 0 ]; then
  for t in "${targets[@]}"; do
    echo "== loom: $t (preemption bound $bound)"
    CARGO_TARGET_DIR=target/loom RUSTFLAGS="$base_flags" \
      cargo test --release --test "$t" -- --test-threads=2 --nocapture
  done
  exit 0
fi

# Each bug is a patch applied to a scratch copy of the crate, so the shipped source holds
# only the real code. The copies share one build directory.
root=$PWD
scratch=$root/target/planted-tree
export CARGO_TARGET_DIR=$root/target/loom-planted
export RUSTFLAGS="$base_flags"
failures=0
declare -A checked=()
for case in "${planted_cases[@]}"; do
  IFS=: read -r t model bug <<<"$case"
  if [ "$check_only" = 1 ]; then
    [ -n "${checked[$bug]:-}" ] && continue
    checked[$bug]=1
  fi
  # PLANTED_ONLY="bug1 bug2" re-checks a subset.
  if [ -n "${PLANTED_ONLY:-}" ] && [[ " $PLANTED_ONLY " != *" $bug "* ]]; then
    continue
  fi
  if [ "$check_only" = 1 ]; then
    echo "== planted bug '$bug' applies and builds"
  else
    echo "== planted bug '$bug' must fail $t::$model"
  fi
  rm -rf "$scratch"
  mkdir -p "$scratch"
  tar -C "$root" --exclude=target --exclude=./.git --exclude=./fuzz -cf - . | tar -C "$scratch" -xf -
  if ! patch -s -p1 -d "$scratch" <"$root/loom_tests/planted/$bug.patch"; then
    echo "   the patch no longer applies: update loom_tests/planted/$bug.patch" >&2
    exit 1
  fi
  log=$(mktemp)
  if [ "$check_only" = 1 ]; then
    if ! (cd "$scratch" && cargo check --release --test "$t") >"$log" 2>&1; then
      cat "$log" >&2
      echo "   the planted tree does not build: update loom_tests/planted/$bug.patch" >&2
      exit 1
    fi
    rm -f "$log"
    continue
  fi
  # A build failure must not pass for a caught bug: build first, and stop if it fails.
  if ! (cd "$scratch" && cargo test --release --test "$t" --no-run) >"$log" 2>&1; then
    cat "$log" >&2
    echo "   the planted build failed" >&2
    exit 1
  fi
  if (cd "$scratch" && cargo test --release --test "$t" "$model" -- --exact) >"$log" 2>&1; then
    echo "   NOT CAUGHT: the model passed with the bug planted"
    failures=$((failures + 1))
  else
    { grep -E -A1 "panicked at|Allocation leaked|double free|signal:" "$log" || true; } |
      grep -v -E "scheduler.rs|^--$" | head -2 | sed 's/^/   /'
    echo "   caught"
  fi
  rm -f "$log"
done
rm -rf "$scratch"
if [ "$check_only" = 1 ]; then
  echo "every planted patch applies and builds"
  exit 0
fi
if [ "$failures" -ne 0 ]; then
  echo "$failures planted bug(s) were not caught" >&2
  exit 1
fi
echo "every planted bug was caught"
