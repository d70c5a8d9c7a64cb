"""PyTorch 1.13 side of bench/autograd: same figures, timing and JSON
conventions as autograd_bench.cc (see there)."""
import argparse
import json
import time

import torch


def best_seconds(repeats, iters, fn):
    for _ in range(max(2, iters // 5)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def mlp_step(spec, batch, repeats, threads, in_place=False):
    widths = [int(w) for w in spec.split("-")]
    layers = []
    for i in range(len(widths) - 1):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    model = torch.nn.Sequential(*layers)
    params = sum(p.numel() for p in model.parameters())
    torch.manual_seed(1)
    x = torch.randn(batch, widths[0])
    y = torch.arange(batch) % widths[-1]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=not in_place)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    iters = 10 if params > 1000000 else 50
    sec = best_seconds(repeats, iters, step)
    print(json.dumps({"bench": "autograd", "impl": "pytorch-1.13",
                      "figure": "mlp_step", "mlp": spec, "batch": batch,
                      "params": params, "threads": threads,
                      "zero_grad": "in_place" if in_place else "none",
                      "time_us": round(sec * 1e6, 1)}), flush=True)


def chain_add(repeats, threads):
    ops = 100
    x = torch.ones(4, requires_grad=True)

    def run():
        y = x
        for _ in range(ops):
            y = y + x
        x.grad = None
        y.sum().backward()

    sec = best_seconds(repeats, 200, run)
    print(json.dumps({"bench": "autograd", "impl": "pytorch-1.13",
                      "figure": "chain_add", "ops": ops, "numel": 4,
                      "threads": threads, "time_us": round(sec * 1e6, 1),
                      "per_op_us": round(sec * 1e6 / ops, 3)}), flush=True)


def linear_step(repeats, threads):
    dim, batch = 64, 64
    model = torch.nn.Linear(dim, dim)
    torch.manual_seed(7)
    x = torch.randn(batch, dim)
    target = torch.randn(batch, dim)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), target).backward()
        opt.step()

    sec = best_seconds(repeats, 2000, step)
    print(json.dumps({"bench": "autograd", "impl": "pytorch-1.13",
                      "figure": "linear_step", "dim": dim, "batch": batch,
                      "threads": threads, "time_us": round(sec * 1e6, 2)}),
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlps", default="784-256-10,1024-1024-1024-10")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--zero_grad_in_place", action="store_true")
    ap.add_argument("--figures", default="mlp_step,chain_add,linear_step")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    figures = a.figures.split(",")
    if "mlp_step" in figures:
        for spec in a.mlps.split(","):
            mlp_step(spec, a.batch, a.repeats, a.threads,
                     a.zero_grad_in_place)
    if "chain_add" in figures:
        chain_add(a.repeats, a.threads)
    if "linear_step" in figures:
        linear_step(a.repeats, a.threads)


if __name__ == "__main__":
    main()
