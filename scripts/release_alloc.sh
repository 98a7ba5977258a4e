#!/usr/bin/env bash
# The global allocator where users run it: release builds, in which the optimiser inlines
# `PoolAllocator` into the allocation functions rustc generates (the crate's tests build
# in debug and cannot see what it then assumes; see release-check/src/lib.rs).
#   scripts/release_alloc.sh            release-check at opt-level 3, then with fat LTO and
#                                       one codegen unit; the main job built in release and
#                                       trained a few steps under each allocator (what CI runs)
#   scripts/release_alloc.sh --planted  puts the defect back in a scratch copy (a patch from
#                                       release-check/planted/): release-check must then FAIL
#   scripts/release_alloc.sh --runtime-bench
#                                       also runtime-bench (burn: a long build), trained a few
#                                       steps under each allocator
set -euo pipefail
cd "$(dirname "$0")/.."

planted=0
runtime_bench=0
for arg in "$@"; do
  case "$arg" in
    --planted) planted=1 ;;
    --runtime-bench) runtime_bench=1 ;;
    *) echo "usage: scripts/release_alloc.sh [--planted] [--runtime-bench]" >&2; exit 2 ;;
  esac
done

# The two builds a user makes: the release profile as it is, and fat LTO with one codegen
# unit (its own target directory, so that neither build undoes the other's).
check() {
  echo "== release-check, opt-level 3"
  cargo test --release -p ferropool-release-check
  echo "== release-check, opt-level 3 with lto = \"fat\" and codegen-units = 1"
  CARGO_TARGET_DIR=target/release-lto CARGO_PROFILE_RELEASE_LTO=fat \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 cargo test --release -p ferropool-release-check
}

if [ "$planted" = 1 ]; then
  # Each build of the scratch copy must succeed and its tests must fail: a patch that no
  # longer builds proves nothing.
  planted_fails() {
    cargo test --release -p ferropool-release-check --no-run || {
      echo "the planted copy does not build"
      exit 1
    }
    ! cargo test --release -p ferropool-release-check 2>&1 | tail -20
  }
  failed=0
  for patch in release-check/planted/*.patch; do
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$scratch"
    (cd "$scratch" && patch -s -p1 < "$OLDPWD/$patch")
    echo "== planted: $(basename "$patch" .patch), opt-level 3"
    (cd "$scratch" && planted_fails) || { echo "NOT CAUGHT: $patch"; failed=1; }
    echo "== planted: $(basename "$patch" .patch), fat LTO and one codegen unit"
    (cd "$scratch" && CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
      planted_fails) || { echo "NOT CAUGHT (fat LTO): $patch"; failed=1; }
    rm -rf "$scratch"
    trap - EXIT
  done
  [ "$failed" = 0 ] && echo "every planted defect was caught, in both builds"
  exit "$failed"
fi

check

echo "== the main job, built in release, a few steps under each allocator (GPT, then MLP)"
cargo build --release -p train-replay
# `compare` runs the pool over mimalloc (the default), glibc and mimalloc, each in a child
# process, and fails if one does; the pool over glibc runs on its own.
target/release/train-replay compare --steps 3 >/dev/null
target/release/train-replay compare --model mlp --steps 3 >/dev/null
TRAIN_REPLAY_ALLOCATOR=pool target/release/train-replay --steps 3 >/dev/null
echo "the main job trains under each allocator"

if [ "$runtime_bench" = 1 ]; then
  echo "== runtime-bench, built in release, a few steps under each allocator"
  (cd runtime-bench && cargo build --release &&
    target/release/runtime-bench --compare --steps 4 --rounds 1 >/dev/null)
  echo "runtime-bench trains under each allocator"
fi
