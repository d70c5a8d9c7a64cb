#!/bin/bash
# Distributed-autograd benchmark, Ferry vs PyTorch 1.13 (TensorPipe shared
# memory and TCP), in one run:
#
#   bench/dist_autograd/run.sh [--steps=N] [--ps_steps=N]
#
# Ferry: dist_autograd_bench (its own processes, TcpStore rendezvous).
# PyTorch: torch_dist_autograd_bench.py twice (default transport = shared
# memory; TCP only). One BLAS/intra-op thread on both sides. Installs Debian's
# python3-torch if missing (root). Prints each side's table and JSON lines,
# then the comparison (report.py).
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=200
ps_steps=300
for arg in "$@"; do
  case "$arg" in
    --steps=*) steps="${arg#--steps=}" ;;
    --ps_steps=*) ps_steps="${arg#--ps_steps=}" ;;
    *) echo "usage: $0 [--steps=N] [--ps_steps=N]" >&2; exit 2 ;;
  esac
done

bench/install_torch.sh
bazel build -c opt //bench/dist_autograd:dist_autograd_bench
BIN="$(bazel info -c opt bazel-bin)/bench/dist_autograd/dist_autograd_bench"
cpus="$(nproc)"  # Before OMP_NUM_THREADS, which nproc honors.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
start=$SECONDS
quiet() { grep -v "shutting down\|InitGoogleLogging" >&2; }
echo "== Ferry (dist_autograd_bench)"
"$BIN" --steps="$steps" --ps_steps="$ps_steps" | tee "$out/ferry.txt"
for transport in default tcp; do
  echo
  echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') TensorPipe, transport: $transport"
  /usr/bin/python3 bench/dist_autograd/torch_dist_autograd_bench.py \
    --transport="$transport" --steps="$steps" --ps_steps="$ps_steps" \
    2> >(quiet) | tee "$out/torch_$transport.txt"
done
echo
echo "== Side by side ($cpus CPUs, loopback; whole run $((SECONDS - start)) s)"
/usr/bin/python3 bench/dist_autograd/report.py "$out"/*.txt
