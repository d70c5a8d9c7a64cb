"""One rank of the PyTorch 1.13 ProcessGroupGloo side of bench/c10d.

Same figures, timing and conventions as c10d_bench.cc (see there)."""
import argparse
import json
import sys
import time

import torch
import torch.distributed as dist


def iters_for(nbytes):
    return max(5, min(200, (256 << 20) // max(nbytes, 1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world_size", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--allreduce_sizes",
                    default="4096,16384,65536,262144,1048576,4194304,16777216,67108864")
    ap.add_argument("--other_sizes", default="1048576,16777216")
    a = ap.parse_args()
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank,
                            world_size=a.world_size)
    n = a.world_size

    def run(op, nbytes, call):
        for _ in range(2):
            call()
        iters = iters_for(nbytes)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        sec = (time.perf_counter() - start) / iters
        dist.barrier()
        algbw = (n * nbytes if op == "allgather" else nbytes) / sec / 1e9
        factor = {"allreduce": 2.0 * (n - 1) / n,
                  "allgather": (n - 1) / n}.get(op, 1.0)
        if a.rank == 0:
            print(json.dumps({
                "bench": "c10d", "impl": "pytorch-1.13-gloo", "op": op,
                "ranks": n, "bytes": nbytes, "iters": iters,
                "time_us": round(sec * 1e6, 1),
                "algbw_GBps": round(algbw, 4),
                "busbw_GBps": round(algbw * factor, 4)}), flush=True)

    for nbytes in [int(s) for s in a.allreduce_sizes.split(",") if s]:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        run("allreduce", nbytes, lambda: dist.all_reduce(t))
    for nbytes in [int(s) for s in a.other_sizes.split(",") if s]:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        run("broadcast", nbytes, lambda: dist.broadcast(t, 0))
        outs = [torch.zeros(nbytes // 4) for _ in range(n)]
        run("allgather", nbytes, lambda: dist.all_gather(outs, t))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
