#!/bin/bash
# Server death in the parameter-server job (issue #33): time from a
# server's SIGKILL to its restarted process rejoining, to the trainers
# having re-created their state on it, and to the first step completed
# after recovery; and the applied steps lost (kill step minus the restored
# checkpoint's). Optimized build unless BENCH_BIN names a bazel-bin.
#
#   bench/fault/server_kill.sh [--runs=N] [--iterations=I]
#                              [--checkpoint_every=K]
#
# Prints a line per run, a table and one JSON line per figure
# (server_kill.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z "${BENCH_BIN:-}" ]]; then
  bazel build -c opt //tools/launcher:ferry_run \
    //examples/parameter_server:parameter_server >&2
  BENCH_BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
fi
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# bench/fault/server_kill.sh $*  (binaries: $BENCH_BIN)"
exec python3 bench/fault/server_kill.py --bin "$BENCH_BIN" "$@"
