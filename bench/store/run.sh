#!/bin/bash
# TCPStore benchmark, Ferry vs PyTorch 1.13, one command:
#   bench/store/run.sh [run_bench.py flags, e.g. --init_sizes=1024,4096]
# Installs Debian's python3-torch and python3-matplotlib if missing (root).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null || \
   ! /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    python3-torch python3-matplotlib
fi
bazel build -c opt //bench/store:store_bench
BIN="$(bazel info -c opt bazel-bin)/bench/store/store_bench"
ulimit -n "$(ulimit -Hn)"
exec /usr/bin/python3 bench/store/run_bench.py --bin="$BIN" "$@"
