"""PyTorch 1.13 side of the RRef benchmark: the TensorPipe agent.

    /usr/bin/python3 bench/rref/torch_rref_bench.py --transport=default|tcp

Starts two processes of itself ("caller" rank 0, "callee" rank 1) meeting
through init_method tcp://127.0.0.1:<free port>, as rref_bench does, and
measures the same figures (names and JSON fields match rref_bench's):
  rpc_sync_noop           rpc_sync round trip, no argument
  remote_to_here_tensor4  rpc.remote() of a function returning a 4-float
                          tensor, then to_here(), then the RRef dropped
  proxy_rpc_sync_noop     rref.rpc_sync().noop() on a remote object
  create_drop             N rpc.remote() RRefs created and dropped at once,
                          until the owner holds none (per RRef)
The latency figures run interleaved in rounds; each reports its best round
(lowest p50), as rref_bench does. PyTorch exposes no count of its RRef protocol messages; messages_per_rref is
reported as null.

--transport=default lets TensorPipe pick (shared memory on one host);
--transport=tcp pins its TCP transport ("uv") and "basic" channel.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed.rpc as rpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from torch_procs import run_roles, tensorpipe_options  # noqa: E402


def noop():
    return None


def tensor4():
    return torch.full((4,), 1.5)


def one():
    return 1


def owned_rrefs():
    info = torch._C._distributed_rpc._rref_context_get_debug_info()
    return int(info["num_owner_rrefs"])


class Acc:
    def __init__(self, x):
        self.x = x

    def noop(self):
        return None


def options(args):
    return tensorpipe_options(args.transport, args.port)


def time_loop(op, seconds, max_iters=200000, warmup=50):
    for _ in range(warmup):
        op()
    limit = time.perf_counter() + seconds
    us = []
    while len(us) < max_iters:
        t0 = time.perf_counter()
        op()
        t1 = time.perf_counter()
        us.append((t1 - t0) * 1e6)
        if t1 > limit:
            break
    us.sort()
    n = len(us)
    return dict(mean_us=sum(us) / n, p50_us=us[n // 2],
                p99_us=us[min(n - 1, n * 99 // 100)], iters=n)


def report(impl, name, s):
    print(f"{name:<24} mean {s['mean_us']:8.1f} us  p50 {s['p50_us']:8.1f} us"
          f"  p99 {s['p99_us']:8.1f} us  ({s['iters']} iters)")
    print(json.dumps(dict(bench="rref", impl=impl, name=name, **s)),
          flush=True)


def wait_owner_empty(limit_s):
    deadline = time.monotonic() + limit_s
    while rpc.rpc_sync("callee", owned_rrefs) != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("callee still owns RRefs after "
                               f"{limit_s} s")
        time.sleep(0.001)


def caller(args):
    impl = "pytorch" if args.transport == "default" else "pytorch_tcp"
    rpc.init_rpc("caller", rank=0, world_size=2,
                 rpc_backend_options=options(args))
    try:
        def remote_to_here():
            t = rpc.remote("callee", tensor4).to_here()
            if t.numel() != 4:
                raise RuntimeError(f"to_here returned {t}")

        acc = rpc.remote("callee", Acc, args=(0,))
        ops = {"rpc_sync_noop": lambda: rpc.rpc_sync("callee", noop),
               "remote_to_here_tensor4": remote_to_here,
               "proxy_rpc_sync_noop": lambda: acc.rpc_sync().noop()}
        best = {}
        for _ in range(max(args.rounds, 1)):
            for name, op in ops.items():
                s = time_loop(op, args.seconds / max(args.rounds, 1))
                if name not in best or s["p50_us"] < best[name]["p50_us"]:
                    best[name] = s
        for name, s in best.items():
            report(impl, name, s)
        del acc
        wait_owner_empty(60)
        n = args.rrefs
        t0 = time.perf_counter()
        for _ in range(n):
            rpc.remote("callee", one)  # Dropped at once.
        wait_owner_empty(300)
        us = (time.perf_counter() - t0) * 1e6 / n
        print(f"{'create_drop':<24} {us:8.1f} us per RRef, messages not "
              f"exposed by PyTorch, {n} RRefs")
        print(json.dumps(dict(bench="rref", impl=impl, name="create_drop",
                              us_per_rref=us, messages_per_rref=None,
                              rrefs=n)), flush=True)
    finally:
        rpc.shutdown()


def callee(args):
    rpc.init_rpc("callee", rank=1, world_size=2,
                 rpc_backend_options=options(args))
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--transport", choices=["default", "tcp"],
                   default="default")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rrefs", type=int, default=10000)
    p.add_argument("--role", choices=["caller", "callee"])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    if args.role == "caller":
        return caller(args)
    if args.role == "callee":
        return callee(args)
    return run_roles(__file__, ["callee", "caller"])

if __name__ == "__main__":
    sys.exit(main())
