"""PyTorch's side of bench/c10d/nccl_bench.cc: ProcessGroupNCCL at one rank
on one GPU, the same rows timed the same way (float32 SUM in place).

  allreduce      dist.all_reduce(t) then torch.cuda.synchronize() per call
                 (what Ferry's Work::Wait guarantees: the result is in device
                 memory);
  allreduce_x16  16 calls, then one synchronize (per call);
  h2d / d2h      t.cuda() (caching allocator + copy from pageable memory) /
                 t.cpu().
One JSON line per figure: {"impl","op","bytes","us","gbps"}."""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist


def time_per_call(fn, budget):
    fn(3)
    t0 = time.perf_counter()
    fn(1)
    one = max(1e-6, time.perf_counter() - t0)
    n = int(min(2000, max(3, budget / 3 / one)))
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes",
                    default="4096,65536,1048576,4194304,16777216,67108864")
    ap.add_argument("--budget_s", type=float, default=0.5)
    a = ap.parse_args()
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("nccl", init_method="file://" +
                                os.path.join(d, "rdzv"), rank=0, world_size=1)
        impl = "torch-%s-nccl" % torch.__version__.split("+")[0]
        out = []
        for size in [int(s) for s in a.sizes.split(",")]:
            host = torch.ones(size // 4)
            t = host.cuda()

            def calls(n):
                for _ in range(n):
                    dist.all_reduce(t)
                    torch.cuda.synchronize()

            def batch(n):
                for _ in range(n):
                    for _ in range(16):
                        dist.all_reduce(t)
                    torch.cuda.synchronize()

            def h2d(n):
                for _ in range(n):
                    host.cuda()

            def d2h(n):
                for _ in range(n):
                    t.cpu()

            for op, fn, per in (("allreduce", calls, 1),
                                ("allreduce_x16", batch, 16),
                                ("h2d", h2d, 1), ("d2h", d2h, 1)):
                us = time_per_call(fn, a.budget_s) / per * 1e6
                out.append({"impl": impl, "op": op, "bytes": size, "us": us,
                            "gbps": size / us / 1e3})
        dist.destroy_process_group()
    for r in out:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
