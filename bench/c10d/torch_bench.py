"""One rank of the PyTorch 1.13 ProcessGroupGloo side of bench/c10d.

Same figures, sizes, timing and conventions as c10d_bench.cc (see there).
ProcessGroupGloo has no reduce_scatter in 1.13: that row times what a user
does instead, all_reduce of the whole input and a copy of the own chunk
(algorithm "ring+slice"). all_to_all is all_to_all_single (Gloo's only
all-to-all), allgather the list form (Gloo has no all_gather_into_tensor)."""
import argparse
import json
import sys
import time

import torch
import torch.distributed as dist


def iters_for(volume):
    return max(3, min(200, (256 << 20) // max(volume, 1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world_size", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--ops",
                    default="allreduce,broadcast,allgather,reducescatter,alltoall")
    ap.add_argument("--sizes",
                    default="4096,16384,65536,262144,1048576,4194304,16777216,67108864")
    ap.add_argument("--budget_s", type=float, default=1.0)
    # As c10d_bench's --settle_s: untimed calls before the first figure.
    ap.add_argument("--settle_s", type=float, default=1.0)
    a = ap.parse_args()
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank,
                            world_size=a.world_size)
    n = a.world_size
    ring = (n - 1) / n
    factors = {"allreduce": 2 * ring, "broadcast": 1.0}
    algorithms = {"allreduce": "ring", "broadcast": "tree",
                  "allgather": "ring", "reducescatter": "ring+slice",
                  "alltoall": "pairwise"}

    settled = []

    def run(op, nbytes, call):
        volume = n * nbytes if op == "allgather" else nbytes
        if not settled and a.settle_s > 0:
            settled.append(True)
            t0 = time.perf_counter()
            call()
            first = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(first, op=dist.ReduceOp.MAX)
            for _ in range(int(max(2, min(1 << 20, a.settle_s /
                                          max(first.item(), 1e-9))))):
                call()
        for _ in range(1 if volume >= (16 << 20) else 2):
            t0 = time.perf_counter()
            call()
            warm = time.perf_counter() - t0
        # Same count on every rank: agree on the slowest warm-up call.
        slowest = torch.tensor([warm], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        iters = int(max(2, min(iters_for(volume),
                               a.budget_s / max(slowest.item(), 1e-9))))
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        sec = (time.perf_counter() - start) / iters
        dist.barrier()
        algbw = volume / sec / 1e9
        if a.rank == 0:
            print(json.dumps({
                "bench": "c10d", "impl": "pytorch-1.13-gloo", "op": op,
                "algorithm": algorithms[op], "ranks": n, "bytes": nbytes,
                "iters": iters, "time_us": round(sec * 1e6, 1),
                "algbw_GBps": round(algbw, 4),
                "busbw_GBps": round(algbw * factors.get(op, ring), 4)}),
                flush=True)

    sizes = [int(s) for s in a.sizes.split(",") if s]
    for op in [o for o in a.ops.split(",") if o]:
        for nbytes in sizes:
            numel = max(nbytes // 4 // n, 1) * n
            t = torch.ones(numel, dtype=torch.float32)
            if op == "allreduce":
                run(op, nbytes, lambda: dist.all_reduce(t))
            elif op == "broadcast":
                run(op, nbytes, lambda: dist.broadcast(t, 0))
            elif op == "allgather":
                outs = [torch.zeros(numel) for _ in range(n)]
                run(op, nbytes, lambda: dist.all_gather(outs, t))
            elif op == "reducescatter":
                out = torch.zeros(numel // n)
                chunk = numel // n

                def rs():
                    dist.all_reduce(t)
                    out.copy_(t[a.rank * chunk:(a.rank + 1) * chunk])
                run(op, nbytes, rs)
            elif op == "alltoall":
                out = torch.zeros(numel)
                run(op, nbytes, lambda: dist.all_to_all_single(out, t))
            else:
                sys.exit("unknown op " + op)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
