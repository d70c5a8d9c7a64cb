#!/bin/bash
# DDP benchmark, Ferry vs PyTorch 1.13 (Gloo), one command:
#
#   bench/ddp/run.sh [--threads=N] [--world=W]     (defaults: 1, 2)
#
# Step time of the 1024-1024-1024-10 MLP (batch 64 per rank, float32, SGD)
# in one process and under DDP with W ranks, for Ferry (ranks launched by
# ferry_run) and PyTorch (torch.multiprocessing); Ferry also with the fp16
# hook and with the optimizer in backward. Each process uses N BLAS/torch
# threads. (PyTorch with its fp16 hook over Gloo hung here, so it is not
# run.) Installs python3-torch if missing (root). Prints the JSON lines,
# then a table (overhead = DDP step / single-process step - 1).
set -euo pipefail
cd "$(dirname "$0")/../.."

threads=1
world=2
for arg in "$@"; do
  case "$arg" in
    --threads=*) threads="${arg#--threads=}" ;;
    --world=*) world="${arg#--world=}" ;;
    *) echo "usage: $0 [--threads=N] [--world=W]" >&2; exit 2 ;;
  esac
done

bench/install_torch.sh

bazel build -c opt //bench/ddp:ddp_bench //tools/launcher:ferry_run
bin="$(bazel info -c opt bazel-bin)"
bench="$bin/bench/ddp/ddp_bench"
run="$bin/tools/launcher/ferry_run"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

export OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads"
common=(--threads="$threads")
{
  "$bench" --mode=single "${common[@]}"
  "$run" --nproc "$world" -- "$bench" --mode=ddp "${common[@]}" | sed 's/^\[0\]: //'
  "$run" --nproc "$world" -- "$bench" --mode=ddp --fp16 "${common[@]}" | sed 's/^\[0\]: //'
  "$run" --nproc "$world" -- "$bench" --mode=ddp --optimizer_in_backward "${common[@]}" | sed 's/^\[0\]: //'
  /usr/bin/python3 bench/ddp/torch_ddp_bench.py --mode=single "${common[@]}"
  /usr/bin/python3 bench/ddp/torch_ddp_bench.py --mode=ddp --world="$world" "${common[@]}"
} | grep '^{' | tee "$tmp/lines"
echo
/usr/bin/python3 bench/ddp/report.py < "$tmp/lines"
