#!/bin/bash
# DDP re-form after a SIGKILL at 4 ranks (bench/fault/ddp_reform.py).
# Usage: bench/fault/run.sh [ddp_reform.py flags, e.g. --trials 5]
# Builds the fault-tolerant trainer and the standalone store in the default
# (fastbuild) configuration: the figures are dominated by timeouts and
# rendezvous, not by compute.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build //examples/ddp:ddp_elastic //store:ferry_store >&2
bin="$(bazel info bazel-bin 2>/dev/null)"
exec python3 bench/fault/ddp_reform.py \
  --worker "$bin/examples/ddp/ddp_elastic" \
  --store "$bin/store/ferry_store" "$@"
