"""PyTorch 1.13 side of the distributed-autograd benchmark (TensorPipe).

    /usr/bin/python3 bench/dist_autograd/torch_dist_autograd_bench.py \
        --transport=default|tcp [--steps=200] [--ps_steps=300] [--batch=64]

The same two jobs as dist_autograd_bench (names and JSON fields match):
  step: a trainer whose Linear 64->64 lives on "ps"; per step a
        dist_autograd context, forward through rpc_sync, MSE loss here,
        dist_autograd.backward, DistributedOptimizer(SGD) step; beside it the
        same model's local step and the rpc_sync no-op round trip.
  ps:   2 trainers and 2 parameter servers (ps0: Linear 64->64, ps1: Linear
        64->10), trainers stepping asynchronously; samples/s of both.
"""

import argparse
import json
import os
import sys
import threading
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.optim import DistributedOptimizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from torch_procs import run_roles, tensorpipe_options  # noqa: E402

DIM = 64
LR = 0.01
MODEL = None
REPORTS = []
REPORTED = threading.Event()


def noop():
    return None


def forward(x):
    # Through clones of the parameters: with two trainers stepping
    # asynchronously, another trainer's optimizer step would otherwise bump
    # the version of a weight this pass saved, and PyTorch's backward refuses
    # it ("modified by an inplace operation"). Gradients still reach the
    # parameters (hogwild, as Ferry's servers run, which keep no versions).
    return torch.nn.functional.linear(x, MODEL.weight.clone(),
                                      MODEL.bias.clone())


def param_rrefs():
    return [rpc.RRef(p) for p in MODEL.parameters()]


def report_rate(rate):
    REPORTS.append(rate)
    REPORTED.set()


def names(job):
    return ["trainer", "ps"] if job == "step" else [
        "trainer0", "trainer1", "ps0", "ps1"]


def summarize(us):
    us = sorted(us)
    n = len(us)
    return dict(p50_us=us[n // 2], mean_us=sum(us) / n,
                p99_us=us[min(n - 1, n * 99 // 100)], iters=n)


def time_iters(op, iters, warmup=10):
    for _ in range(warmup):
        op()
    us = []
    for _ in range(iters):
        t0 = time.perf_counter()
        op()
        us.append((time.perf_counter() - t0) * 1e6)
    return summarize(us)


def emit(impl, name, line, **fields):
    print(line)
    print(json.dumps(dict(bench="dist_autograd", impl=impl, name=name,
                          **fields)), flush=True)


def report(impl, name, s):
    emit(impl, name, f"{name:<22} p50 {s['p50_us']:9.1f} us  mean "
         f"{s['mean_us']:9.1f} us  p99 {s['p99_us']:9.1f} us  "
         f"({s['iters']} steps)", **s)


def make_optimizer(servers):
    params = []
    for s in servers:
        params += rpc.rpc_sync(s, param_rrefs)
    return DistributedOptimizer(torch.optim.SGD, params, lr=LR)


def dist_step(opt, servers, x, target):
    def step():
        with dist_autograd.context() as ctx:
            h = x
            for i, s in enumerate(servers):
                if i > 0:
                    h = torch.relu(h)
                h = rpc.rpc_sync(s, forward, args=(h,))
            loss = torch.nn.functional.mse_loss(h, target)
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
    return step


def step_job(args, impl):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(args.batch, DIM, generator=g)
    target = torch.randn(args.batch, DIM, generator=g)
    report(impl, "rpc_sync_noop",
           time_iters(lambda: rpc.rpc_sync("ps", noop), args.steps))
    local = torch.nn.Linear(DIM, DIM)
    sgd = torch.optim.SGD(local.parameters(), lr=LR)

    def local_step():
        sgd.zero_grad()
        torch.nn.functional.mse_loss(local(x), target).backward()
        sgd.step()

    l = time_iters(local_step, args.steps)
    report(impl, "local_step", l)
    d = time_iters(dist_step(make_optimizer(["ps"]), ["ps"], x, target),
                   args.steps)
    report(impl, "dist_step", d)
    over = d["p50_us"] - l["p50_us"]
    emit(impl, "dist_step_overhead",
         f"{'dist_step_overhead':<22} p50 {over:9.1f} us", p50_us=over)


def ps_job(args, impl, rank):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(args.batch, DIM, generator=g)
    target = torch.randn(args.batch, 10, generator=g)
    step = dist_step(make_optimizer(["ps0", "ps1"]), ["ps0", "ps1"], x,
                     target)
    for _ in range(10):
        step()
    t0 = time.perf_counter()
    for _ in range(args.ps_steps):
        step()
    rate = args.ps_steps * args.batch / (time.perf_counter() - t0)
    if rank != 0:
        rpc.rpc_sync("trainer0", report_rate, args=(rate,))
        return
    if not REPORTED.wait(300):
        raise RuntimeError("trainer1 did not report its rate")
    total = rate + REPORTS[0]
    emit(impl, "ps_throughput",
         f"{'ps_throughput':<22} {total:9.0f} samples/s (trainer0 {rate:.0f}"
         f" + trainer1 {REPORTS[0]:.0f}; batch {args.batch}, {args.ps_steps}"
         f" steps each)", samples_per_s=total, trainers=2, servers=2,
         batch=args.batch, steps=args.ps_steps)


def run_rank(args):
    global MODEL
    impl = "pytorch" if args.transport == "default" else "pytorch_tcp"
    torch.manual_seed(1)
    ranks = names(args.job)
    name = ranks[args.rank]
    if name in ("ps", "ps0"):
        MODEL = torch.nn.Linear(DIM, DIM)
    elif name == "ps1":
        MODEL = torch.nn.Linear(DIM, 10)
    rpc.init_rpc(name, rank=args.rank, world_size=len(ranks),
                 rpc_backend_options=tensorpipe_options(args.transport,
                                                        args.port))
    try:
        if name == "trainer":
            step_job(args, impl)
        elif name.startswith("trainer"):
            ps_job(args, impl, args.rank)
    finally:
        rpc.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--transport", choices=["default", "tcp"],
                   default="default")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ps_steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--job", choices=["step", "ps"])
    p.add_argument("--role", default="")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.role:
        args.rank = int(args.role)
        return run_rank(args)
    if args.job:
        return run_roles(__file__, [str(r) for r in
                                    range(len(names(args.job)))])
    for job in ("step", "ps"):
        sys.argv.append(f"--job={job}")
        rc = run_roles(__file__, [str(r) for r in range(len(names(job)))])
        sys.argv.pop()
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
