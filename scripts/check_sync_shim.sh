#!/usr/bin/env bash
# Fails if a library module other than the sync shim (src/sync.rs) names std's atomics, Arc,
# UnsafeCell, atomic fences or raw allocation functions: loom sees only what goes through the
# shim. (clippy's disallowed-types cannot say this: the shim re-exports std's own types, and
# the lint resolves a re-export to the type it names, so it would flag every use.)
# Doc comments (`///`, `//!`) and comments are skipped: their examples run outside the crate.
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='std::sync::(atomic|Arc)|core::sync::atomic|std::cell::UnsafeCell|core::cell::UnsafeCell|std::alloc::(alloc|alloc_zeroed|dealloc|realloc)\b|std::sync::\{[^}]*\b(Arc|atomic)\b'
found=$(grep -rnE "$pattern" src --include='*.rs' | grep -v '^src/sync\.rs:' | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
if [ -n "$found" ]; then
    echo "outside the sync shim (use crate::sync instead):"
    echo "$found"
    exit 1
fi
echo "sync shim: no module but src/sync.rs names std's atomics, Arc, UnsafeCell or raw allocation"
