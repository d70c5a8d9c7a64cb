#!/bin/bash
# Autograd benchmark, Ferry (OpenBLAS and reference BLAS builds) vs PyTorch
# 1.13 from Debian, one command:
#
#   bench/autograd/run.sh [--threads=N] [--rounds=R]   (defaults: 1, 3)
#
# Figures (see autograd_bench.cc): MLP training step 784-256-10 and
# 1024-1024-1024-10 at batch 64, with the gradients dropped between steps
# (zero_grad(set_to_none=True)) and zeroed in place (set_to_none=False, as
# bench/ddp's single row: PyTorch then reuses its gradient buffers instead of
# faulting fresh 4 MB pages in each step); 100 chained adds on 4 elements,
# forward + backward; the dist bench's local step (linear_step). BLAS and PyTorch use N threads (OPENBLAS_NUM_THREADS,
# torch.set_num_threads). Installs python3-torch if missing (root). Prints
# the JSON lines, then a table with Ferry/PyTorch ratios (< 1: Ferry faster).
# The three programs run in turn R times (interleaved, so a load change on a
# shared machine hits all of them); the table keeps each figure's best round.
set -euo pipefail
cd "$(dirname "$0")/../.."

threads=1
rounds=3
for arg in "$@"; do
  case "$arg" in
    --threads=*) threads="${arg#--threads=}" ;;
    --rounds=*) rounds="${arg#--rounds=}" ;;
    *) echo "usage: $0 [--threads=N] [--rounds=R]" >&2; exit 2 ;;
  esac
done

bench/install_torch.sh

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bin_dir="$(bazel info -c opt bazel-bin)/bench/autograd"
bazel build -c opt --define=ferry_blas=reference //bench/autograd:autograd_bench
cp "$bin_dir/autograd_bench" "$tmp/bench_reference"
bazel build -c opt //bench/autograd:autograd_bench
cp "$bin_dir/autograd_bench" "$tmp/bench_openblas"

export OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads"
for ((r = 0; r < rounds; ++r)); do
  "$tmp/bench_openblas" --impl=ferry-openblas --threads="$threads"
  "$tmp/bench_openblas" --impl=ferry-openblas --threads="$threads" \
    --figures=mlp_step --zero_grad_in_place
  "$tmp/bench_reference" --impl=ferry-refblas --threads="$threads"
  /usr/bin/python3 bench/autograd/torch_bench.py --threads="$threads"
  /usr/bin/python3 bench/autograd/torch_bench.py --threads="$threads" \
    --figures=mlp_step --zero_grad_in_place
done | tee "$tmp/lines"
echo
/usr/bin/python3 bench/autograd/report.py < "$tmp/lines"
