#!/usr/bin/env bash
# Runs the unit and integration tests under AddressSanitizer, then ThreadSanitizer.
# Needs nightly (and rust-src for ThreadSanitizer's -Zbuild-std); skips with a message when
# the toolchain is missing. Sets `--cfg ferropool_sanitizer` so that tests that count page
# faults (which sanitizer shadow memory adds to) stand aside.
#   scripts/sanitize.sh            both
#   scripts/sanitize.sh address    one of them (address | thread)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "skipping: no nightly toolchain (sanitizers need -Zsanitizer)"
  exit 0
fi
target=x86_64-unknown-linux-gnu
which=${1:-all}
if [ "$which" = all ] || [ "$which" = address ]; then
  echo "== AddressSanitizer (with LeakSanitizer)"
  RUSTFLAGS="-Zsanitizer=address --cfg ferropool_sanitizer" RUSTDOCFLAGS="-Zsanitizer=address" \
    CARGO_TARGET_DIR=target/asan cargo +nightly test --target "$target" --lib --tests
fi
if [ "$which" = all ] || [ "$which" = thread ]; then
  if ! rustup +nightly component list --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "skipping ThreadSanitizer: rust-src is not installed (rustup +nightly component add rust-src)"
    exit 0
  fi
  echo "== ThreadSanitizer"
  RUSTFLAGS="-Zsanitizer=thread --cfg ferropool_sanitizer" RUSTDOCFLAGS="-Zsanitizer=thread" \
    CARGO_TARGET_DIR=target/tsan cargo +nightly test -Zbuild-std --target "$target" --lib --tests
fi
