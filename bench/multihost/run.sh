#!/bin/bash
# Network-shape benchmark, one command, unattended (root: network namespaces):
#
#   bench/multihost/run.sh [run_bench.py flags, e.g. --rtts_us=0,500,5000
#                           --sizes=4096,262144,4194304 --shape=emulator]
#
# Two "hosts" in network namespaces (tests/multihost/netns_hosts.sh) at each
# added round trip (default 0, 0.5 ms, 5 ms: each host's egress delayed by
# half, with tc netem where the kernel has sch_netem, else link_emulator):
# rpc_sync latency and 2-rank all-reduce time, Ferry (gRPC agent, c10d gloo)
# vs PyTorch 1.13 (TensorPipe over TCP, ProcessGroupGloo) with the raw TCP
# floor through the same link. Installs Debian's python3-torch if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $(id -u) -ne 0 ]]; then
  echo "bench/multihost/run.sh: needs root (network namespaces)" >&2
  exit 2
fi
bench/install_torch.sh
bazel build -c opt //bench/multihost:net_bench //tests/multihost:link_emulator
BIN="$(bazel info -c opt bazel-bin)"
echo "== load before: $(uptime)"
echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); $(nproc) CPUs"
exec /usr/bin/python3 bench/multihost/run_bench.py \
  --bin="$BIN/bench/multihost/net_bench" \
  --emulator="$BIN/tests/multihost/link_emulator" "$@"
