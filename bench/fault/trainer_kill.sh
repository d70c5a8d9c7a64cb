#!/bin/bash
# Trainer death in the parameter-server job (issue #33): time from a
# trainer's SIGKILL to the servers releasing its state, and the other
# trainers' largest step gap around the kill against their median step
# (and against the same window of runs without a kill). Optimized build.
#
#   bench/fault/trainer_kill.sh [--runs=N] [--iterations=I] [--kill_at=K]
#
# Prints a table and one JSON line per figure (trainer_kill.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt //tools/launcher:ferry_run \
  //examples/parameter_server:parameter_server >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# bench/fault/trainer_kill.sh $*"
exec python3 bench/fault/trainer_kill.py --bin "$bin" "$@"
