#!/bin/bash
# RRef benchmark, Ferry vs PyTorch 1.13's TensorPipe agent (shared-memory and
# TCP transports), in one run:
#
#   bench/rref/run.sh [--seconds=S] [--rrefs=N]
#
# Ferry: rref_bench (2 processes, TcpStore rendezvous), its rpc_sync no-op
# being the floor. PyTorch: torch_rref_bench.py twice (default transport =
# shared memory; TCP only). Installs Debian's python3-torch if missing (root).
# Prints each side's table and JSON lines, then the comparison (report.py).
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=5
rrefs=10000
for arg in "$@"; do
  case "$arg" in
    --seconds=*) seconds="${arg#--seconds=}" ;;
    --rrefs=*) rrefs="${arg#--rrefs=}" ;;
    *) echo "usage: $0 [--seconds=S] [--rrefs=N]" >&2; exit 2 ;;
  esac
done

bench/install_torch.sh
bazel build -c opt //bench/rref:rref_bench
BIN="$(bazel info -c opt bazel-bin)/bench/rref/rref_bench"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
start=$SECONDS
quiet() { grep -v "shutting down\|InitGoogleLogging" >&2; }
echo "== Ferry (rref_bench)"
"$BIN" --seconds="$seconds" --rrefs="$rrefs" | tee "$out/ferry.txt"
for transport in default tcp; do
  echo
  echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') TensorPipe, transport: $transport"
  /usr/bin/python3 bench/rref/torch_rref_bench.py --transport="$transport" \
    --seconds="$seconds" --rrefs="$rrefs" 2> >(quiet) | tee "$out/torch_$transport.txt"
done
echo
echo "== Side by side ($(nproc) CPUs, loopback; whole run $((SECONDS - start)) s)"
/usr/bin/python3 bench/rref/report.py "$out"/*.txt
