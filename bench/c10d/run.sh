#!/bin/bash
# c10d benchmark: Ferry's default CPU backend (shm + gloo), Ferry's gloo alone
# and PyTorch 1.13 ProcessGroupGloo side by side, all five collectives, 2 and
# 4 ranks, 4 KiB .. 64 MiB, one command:
#   bench/c10d/run.sh [run_bench.py flags, e.g. --ranks=4 --ops=allreduce
#                      --sizes=1048576,67108864 --impls=ferry-shm,pytorch-1.13-gloo
#                      --repeat=1]
# Installs Debian's python3-torch and python3-matplotlib if missing (root).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null || \
   ! /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    python3-torch python3-matplotlib
fi
bazel build -c opt //bench/c10d:c10d_bench
BIN="$(bazel info -c opt bazel-bin)/bench/c10d/c10d_bench"
exec /usr/bin/python3 bench/c10d/run_bench.py --bin="$BIN" "$@"
