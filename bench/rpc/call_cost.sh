#!/bin/bash
# Instructions per rpc_sync round trip (caller + callee, one process), by
# callgrind, for Ferry's serving paths and the raw gRPC floors:
#
#   bench/rpc/call_cost.sh [N1] [N2]      (defaults 200 and 1200 calls)
#
# Each mode runs at N1 and N2 calls; (Ir(N2) - Ir(N1)) / (N2 - N1) removes
# start-up and shutdown. Instruction counts are repeatable on a loaded
# machine where wall-clock latencies are not; they do not price thread
# wake-ups or scheduling (see bench/rpc/run.sh for latencies).
# Ends with the ratios of issue #12's goals: each Ferry mode over raw gRPC
# unary (grpc_sync; goals: no-op <= 1.15, 4-float tensor <= 1.3) and over
# the callback API (grpc_callback, the client pattern Ferry uses); then the
# modes with 64 calls in flight over raw gRPC's (grpc_callback_64).
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
declare -A per
modes=(grpc_sync grpc_callback ferry ferry_inline ferry_tensor4
       ferry_tensor4_inline grpc_callback_64 ferry_async_64
       ferry_async_64_inline ferry_async_64_chained)
printf "%-22s %14s\n" mode "instr/call"
for mode in "${modes[@]}"; do
  a="$(ir "$mode" "$n1")"
  b="$(ir "$mode" "$n2")"
  per[$mode]=$(( (b - a) / (n2 - n1) ))
  printf "%-22s %14d\n" "$mode" "${per[$mode]}"
  printf '{"bench": "rpc_call_cost", "mode": "%s", "unit": "instructions/call", "value": %d, "calls": [%d, %d]}\n' \
    "$mode" "${per[$mode]}" "$n1" "$n2"
done
echo
printf "%-22s %16s %20s %6s\n" mode "vs grpc_sync" "vs grpc_callback" goal
for mode in ferry ferry_inline ferry_tensor4 ferry_tensor4_inline; do
  case "$mode" in
    ferry_tensor4*) goal="1.30" ;;
    *) goal="1.15" ;;
  esac
  sync_ratio="$(awk -v a="${per[$mode]}" -v b="${per[grpc_sync]}" 'BEGIN { printf "%.3f", a / b }')"
  cb_ratio="$(awk -v a="${per[$mode]}" -v b="${per[grpc_callback]}" 'BEGIN { printf "%.3f", a / b }')"
  printf "%-22s %15sx %19sx %5sx\n" "$mode" "$sync_ratio" "$cb_ratio" "$goal"
  printf '{"bench": "rpc_call_cost_ratio", "mode": "%s", "vs_grpc_sync": %s, "vs_grpc_callback": %s, "goal_vs_grpc_sync": %s}\n' \
    "$mode" "$sync_ratio" "$cb_ratio" "$goal"
done
echo
# 64 in flight: instructions per call over raw gRPC's callback chain. The
# throughput goal (>= 0.8x its calls/s) would need <= 1.25x its instructions
# if time followed instructions (it does not count wake-ups: see run.sh).
printf "%-22s %20s %6s\n" mode "vs grpc_callback_64" goal
for mode in ferry_async_64 ferry_async_64_inline ferry_async_64_chained; do
  ratio="$(awk -v a="${per[$mode]}" -v b="${per[grpc_callback_64]}" 'BEGIN { printf "%.3f", a / b }')"
  printf "%-22s %19sx %5sx\n" "$mode" "$ratio" "1.25"
  printf '{"bench": "rpc_call_cost_ratio", "mode": "%s", "vs_grpc_callback_64": %s, "goal_vs_grpc_callback_64": 1.25}\n' \
    "$mode" "$ratio"
done
