#!/bin/bash
# RPC benchmark, Ferry vs PyTorch 1.13's TensorPipe agent, with raw gRPC and
# raw TCP floors, in one run:
#
#   bench/rpc/run.sh [--sizes=4096,...] [--seconds=S]
#
# Ferry and the floors: rpc_bench (2 processes, TcpStore rendezvous).
# PyTorch: torch_bench.py twice (default transport = shared memory; TCP only).
# Installs Debian's python3-torch if missing (root). Prints each side's table
# and JSON lines, then the side-by-side comparison (report.py).
set -euo pipefail
cd "$(dirname "$0")/../.."

sizes="4096,65536,1048576,16777216,67108864,268435456"
seconds=3
for arg in "$@"; do
  case "$arg" in
    --sizes=*) sizes="${arg#--sizes=}" ;;
    --seconds=*) seconds="${arg#--seconds=}" ;;
    *) echo "usage: $0 [--sizes=B,B,...] [--seconds=S]" >&2; exit 2 ;;
  esac
done

bench/install_torch.sh
bazel build -c opt //bench/rpc:rpc_bench
BIN="$(bazel info -c opt bazel-bin)/bench/rpc/rpc_bench"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
start=$SECONDS
echo "== load before: $(uptime)"
echo "== Ferry + raw gRPC + raw TCP (rpc_bench)"
"$BIN" --sizes="$sizes" --seconds="$seconds" | tee "$out/ferry.txt"
echo
echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') TensorPipe, default transports"
/usr/bin/python3 bench/rpc/torch_bench.py --transport=default \
  --sizes="$sizes" --seconds="$seconds" 2> >(grep -v "shutting down\|InitGoogleLogging" >&2) \
  | tee "$out/torch.txt"
echo
echo "== PyTorch TensorPipe, TCP transport only (uv + basic channel)"
/usr/bin/python3 bench/rpc/torch_bench.py --transport=tcp \
  --sizes="$sizes" --seconds="$seconds" 2> >(grep -v "shutting down\|InitGoogleLogging" >&2) \
  | tee "$out/torch_tcp.txt"
echo
echo "== load after: $(uptime)"
echo "== Side by side ($(nproc) CPUs, loopback; whole run $((SECONDS - start)) s)"
/usr/bin/python3 bench/rpc/report.py "$out"/*.txt
