#!/bin/bash
# Cost of Ferry's gloo argument check, with host noise cancelled by
# alternating calls between a checked and an unchecked group in the same
# processes (see gloo_check_ab.cc):
#   bench/c10d/gloo_check_ab.sh [RANKS...]   (default: 2 4)
# Extra flags via GLOO_AB_FLAGS, e.g. GLOO_AB_FLAGS="--calls=40".
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt //bench/c10d:gloo_check_ab
BIN="$(bazel info -c opt bazel-bin)/bench/c10d/gloo_check_ab"
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
for n in "${ranks[@]}"; do
  dir="$(mktemp -d)"
  pids=()
  for ((r = 1; r < n; r++)); do
    "$BIN" --rank=$r --world_size=$n --store="$dir/store" ${GLOO_AB_FLAGS:-} &
    pids+=($!)
  done
  "$BIN" --rank=0 --world_size=$n --store="$dir/store" ${GLOO_AB_FLAGS:-}
  for p in "${pids[@]}"; do wait "$p"; done
  rm -rf "$dir"
done
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
