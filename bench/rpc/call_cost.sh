#!/bin/bash
# Instructions per rpc_sync round trip (caller + callee, one process), by
# callgrind, for Ferry's two serving paths and the raw gRPC floors:
#
#   bench/rpc/call_cost.sh [N1] [N2]      (defaults 200 and 1200 calls)
#
# Each mode runs at N1 and N2 calls; (Ir(N2) - Ir(N1)) / (N2 - N1) removes
# start-up and shutdown. Instruction counts are repeatable on a loaded
# machine where wall-clock latencies are not; they do not price thread
# wake-ups or scheduling (see bench/rpc/run.sh for latencies).
set -euo pipefail
cd "$(dirname "$0")/../.."
n1="${1:-200}"
n2="${2:-1200}"
bazel build -c opt //bench/rpc:call_cost
BIN="$(bazel info -c opt bazel-bin)/bench/rpc/call_cost"
ir() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" \
    --mode="$1" --calls="$2" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf "%-14s %14s\n" mode "instr/call"
for mode in grpc_sync grpc_callback ferry ferry_inline; do
  a="$(ir "$mode" "$n1")"
  b="$(ir "$mode" "$n2")"
  per=$(( (b - a) / (n2 - n1) ))
  printf "%-14s %14d\n" "$mode" "$per"
  printf '{"bench": "rpc_call_cost", "mode": "%s", "unit": "instructions/call", "value": %d, "calls": [%d, %d]}\n' \
    "$mode" "$per" "$n1" "$n2"
done
