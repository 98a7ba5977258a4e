#!/usr/bin/env bash
# Runs a command in a memory cgroup of LIMIT bytes, as a container would hold it, and prints
# its exit code and the cgroup's peak use. Needs root and a memory controller (cgroup v1's
# memory.limit_in_bytes, or v2's memory.max). Swap is kept out, so the limit is a ceiling.
#   train-replay/scripts/in_cgroup.sh LIMIT COMMAND [ARGS...]
# e.g. a fitted run in 1.05 x its budget + 16 MiB:
#   budget=$((512 << 20)); limit=$((budget * 105 / 100 + (16 << 20)))
#   train-replay/scripts/in_cgroup.sh $limit target/release/train-replay train --json \
#       --preset gpt2-mini --budget $budget
set -uo pipefail
if [ "$#" -lt 2 ]; then
  echo "usage: in_cgroup.sh LIMIT COMMAND [ARGS...]" >&2
  exit 2
fi
limit=$1
shift
name="train-replay-$$"
if [ -d /sys/fs/cgroup/memory ]; then
  dir=/sys/fs/cgroup/memory/$name
  mkdir "$dir" || exit 2
  echo "$limit" > "$dir/memory.limit_in_bytes"
  # Swap may be off or unaccounted; where it is accounted, the same ceiling holds for both.
  echo "$limit" > "$dir/memory.memsw.limit_in_bytes" 2>/dev/null || true
  peak_file=$dir/memory.max_usage_in_bytes
else
  dir=/sys/fs/cgroup/$name
  mkdir "$dir" || exit 2
  echo "$limit" > "$dir/memory.max"
  echo 0 > "$dir/memory.swap.max" 2>/dev/null || true
  peak_file=$dir/memory.peak
fi
# The child joins the cgroup before it starts the command.
bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$dir" "$@"
code=$?
peak=$(cat "$peak_file" 2>/dev/null || echo 0)
echo "cgroup: limit $limit bytes ($((limit >> 20)) MiB), exit code $code, peak use $peak bytes ($((peak >> 20)) MiB)" >&2
rmdir "$dir" 2>/dev/null || true
exit "$code"
