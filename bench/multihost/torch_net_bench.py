"""PyTorch 1.13 side of the network-shape benchmark (bench/multihost/run.sh).

One rank per "host" (network namespace), rank 0 at --master_addr, the same
figures, iteration counts and JSON fields as net_bench.cc:
  rpc_sync   torch.distributed.rpc.rpc_sync of a no-op (int in, int out),
             TensorPipe pinned to its TCP transport ("uv") and "basic"
             channel (shared memory cannot cross hosts);
  allreduce  dist.all_reduce of N bytes of float32 on ProcessGroupGloo.
TP_SOCKET_IFNAME / GLOO_SOCKET_IFNAME are set to eth0 (the host's link).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

WARMUP = 5


def noop(x):
    return x


def iterations_for(nbytes):
    return 100 if nbytes <= 65536 else 40 if nbytes <= (1 << 20) else 15


def timed(iters, fn):
    us = []
    for i in range(WARMUP + iters):
        t0 = time.perf_counter()
        fn()
        if i >= WARMUP:
            us.append((time.perf_counter() - t0) * 1e6)
    return us


def report(a, name, nbytes, us, backend=None):
    us = sorted(us)
    n = len(us)
    rec = dict(bench="multihost", impl="pytorch-1.13", name=name,
               bytes=nbytes, rtt_us=a.rtt_us, shape=a.shape,
               p50_us=round(us[n // 2], 1), mean_us=round(sum(us) / n, 1),
               p99_us=round(us[min(n - 1, n * 99 // 100)], 1), iters=n)
    if backend:
        rec["backend"] = backend
    print(f"{'pytorch-1.13':<12} {name:<10} {nbytes:>10} B  "
          f"rtt+{a.rtt_us:<6} us  p50 {rec['p50_us']:10.1f} us  "
          f"mean {rec['mean_us']:10.1f} us  p99 {rec['p99_us']:10.1f} us  "
          f"n={n}")
    print(json.dumps(rec), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--master_addr", required=True)
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--sizes", default="4096,262144,4194304")
    ap.add_argument("--rpc_iters", type=int, default=200)
    ap.add_argument("--rtt_us", type=int, default=0)
    ap.add_argument("--shape", default="none")
    a = ap.parse_args()
    os.environ.setdefault("TP_SOCKET_IFNAME", "eth0")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")

    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=16, rpc_timeout=120,
        init_method=f"tcp://{a.master_addr}:{a.port + 1}",
        _transports=["uv"], _channels=["basic"])
    rpc.init_rpc(f"worker{a.rank}", rank=a.rank, world_size=2,
                 rpc_backend_options=opts)
    if a.rank == 0:
        us = timed(a.rpc_iters, lambda: rpc.rpc_sync("worker1", noop,
                                                     args=(1,)))
        report(a, "rpc_sync", 8, us)
    rpc.shutdown()

    dist.init_process_group("gloo",
                            init_method=f"tcp://{a.master_addr}:{a.port + 2}",
                            rank=a.rank, world_size=2)
    for nbytes in [int(s) for s in a.sizes.split(",") if s]:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        us = timed(iterations_for(nbytes), lambda: dist.all_reduce(t))
        if a.rank == 0:
            report(a, "allreduce", nbytes, us, backend="gloo")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
