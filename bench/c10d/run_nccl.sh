#!/bin/bash
# The nccl backend on one GPU beside raw NCCL/CUDA and PyTorch's
# ProcessGroupNCCL (needs a CUDA device and a python3 whose torch has CUDA):
#   bench/c10d/run_nccl.sh [--sizes=...] [--budget_s=0.5]
# Or with a prebuilt binary: NCCL_BENCH=path bench/c10d/run_nccl.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z "${NCCL_BENCH:-}" ]]; then
  bazel build -c opt //bench/c10d:nccl_bench
  NCCL_BENCH="$(bazel info -c opt bazel-bin)/bench/c10d/nccl_bench"
fi
export NCCL_SOCKET_IFNAME=lo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$NCCL_BENCH" "$@" | tee "$tmp/ferry.jsonl" | grep -v '^{'
"${PYTHON:-python3}" bench/c10d/torch_nccl_bench.py "$@" >"$tmp/torch.jsonl"
"${PYTHON:-python3}" bench/c10d/nccl_report.py "$tmp/ferry.jsonl" "$tmp/torch.jsonl"
