"""PyTorch 1.13 side of the RPC benchmark: the TensorPipe agent.

    /usr/bin/python3 bench/rpc/torch_bench.py --transport=default|tcp

Starts two processes of itself ("caller" rank 0, "callee" rank 1) that meet
through init_method tcp://127.0.0.1:<free port>, like rpc_bench does. The
caller measures the same figures as rpc_bench (names and JSON fields match):
rpc_sync no-op and 4-element tensor echo round trips, rpc_async with 64 calls
in flight, and tensor echo bandwidth (one way = bytes / (median rtt / 2)).

--transport=default lets TensorPipe pick (shared memory on one host);
--transport=tcp pins it to its TCP transport ("uv") and "basic" channel, the
same path Ferry's gRPC agent takes.
"""

import argparse
import collections
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


def echo(t):
    return t


def options(args):
    return tensorpipe_options(args.transport, args.port)


def summarize(us):
    us = sorted(us)
    n = len(us)
    return dict(mean=sum(us) / n, p50=us[n // 2],
                p99=us[min(n - 1, n * 99 // 100)], iters=n)


def time_loop(op, iters, seconds, warmup=50):
    for _ in range(warmup):
        op()
    limit = time.perf_counter() + seconds
    us = []
    for _ in range(iters):
        t0 = time.perf_counter()
        op()
        t1 = time.perf_counter()
        us.append((t1 - t0) * 1e6)
        if t1 > limit:
            break
    return us


def emit(record, line):
    print(line)
    print(json.dumps(record), flush=True)


def report_latency(impl, name, us):
    s = summarize(us)
    emit(dict(bench="rpc", impl=impl, name=name, unit="us", **s),
         f"{impl:<12} {name:<20} {'':>12} {s['mean']:10.1f} us  "
         f"(p50 {s['p50']:.1f}, p99 {s['p99']:.1f}, n={s['iters']})")


def report_rate(impl, name, calls, secs):
    rate = calls / secs
    emit(dict(bench="rpc", impl=impl, name=name, unit="calls/s", value=rate,
              calls=calls, seconds=secs),
         f"{impl:<12} {name:<20} {'':>12} {rate:10.0f} calls/s  "
         f"({calls} calls in {secs:.2f} s)")


def report_bandwidth(impl, name, nbytes, us):
    s = summarize(us)
    gbps = nbytes / (s["p50"] / 2) / 1e3
    emit(dict(bench="rpc", impl=impl, name=name, unit="GB/s", bytes=nbytes,
              value=gbps, rtt_p50_ms=s["p50"] / 1e3,
              rtt_mean_ms=s["mean"] / 1e3, iters=s["iters"],
              definition="bytes / (median round trip / 2)"),
         f"{impl:<12} {name:<20} {nbytes:>12} {gbps:10.3f} GB/s one way  "
         f"(rtt p50 {s['p50'] / 1e3:.3f} ms, n={s['iters']})")


def echo_iters(nbytes):
    return max(3, min(300, (1 << 30) // nbytes))


def windowed(calls, window, seconds, issue):
    """`calls` calls with `window` in flight; returns (completed, seconds)."""
    inflight = collections.deque()
    limit = time.perf_counter() + seconds
    t0 = time.perf_counter()
    issued = done = 0
    while done < calls:
        while issued < calls and len(inflight) < window:
            inflight.append(issue())
            issued += 1
        inflight.popleft().wait()
        done += 1
        if time.perf_counter() > limit:
            calls = min(calls, issued)
    return done, time.perf_counter() - t0


def caller(args):
    impl = "pytorch" if args.transport == "default" else "pytorch_tcp"
    rpc.init_rpc("caller", rank=0, world_size=2,
                 rpc_backend_options=options(args))
    try:
        report_latency(impl, "rpc_sync_noop", time_loop(
            lambda: rpc.rpc_sync("callee", noop), args.iters, args.seconds))
        four = torch.tensor([1.0, 2.0, 3.0, 4.0])
        report_latency(impl, "rpc_sync_tensor4", time_loop(
            lambda: rpc.rpc_sync("callee", echo, args=(four,)), args.iters,
            args.seconds))
        issue = lambda: rpc.rpc_async("callee", noop)  # noqa: E731
        windowed(1000, 64, args.seconds, issue)  # Warm-up.
        calls, secs = windowed(args.async_calls, 64, args.seconds, issue)
        report_rate(impl, "rpc_async_64", calls, secs)
        for n in args.sizes:
            t = torch.full((n // 4,), 7.0)
            got = []

            def op():
                r = rpc.rpc_sync("callee", echo, args=(t,))
                got.append(r.numel() * r.element_size())

            report_bandwidth(impl, "tensor_echo", n, time_loop(
                op, echo_iters(n), args.seconds, warmup=1))
            if got[-1] != n:
                raise RuntimeError(f"echo returned {got[-1]} bytes, not {n}")
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
    p.add_argument("--sizes", default="4096,65536,1048576,16777216,"
                                      "67108864,268435456")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--iters", type=int, default=3000)
    p.add_argument("--async_calls", type=int, default=20000)
    p.add_argument("--role", choices=["caller", "callee"])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.role == "caller":
        return caller(args)
    if args.role == "callee":
        return callee(args)
    return run_roles(__file__, ["callee", "caller"])

if __name__ == "__main__":
    sys.exit(main())
