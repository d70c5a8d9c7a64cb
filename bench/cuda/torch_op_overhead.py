"""PyTorch's per-op overhead beside bench/cuda/op_overhead_bench.cc.

    python3 bench/cuda/torch_op_overhead.py [--elements=256] [--chain=300]
        [--reps=5]

The same chain ((y + 0.5) * w, ReLU, chain / 3 times) on a float32 tensor of
cuda:0, under torch.no_grad() and with autograd (forward, then backward from
the sum), the best of `reps` chains between torch.cuda.synchronize() calls,
in microseconds per op. Prints one JSON line per mode; exits 0 with a note
when no GPU is visible.
"""
import argparse
import json
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=256)
    p.add_argument("--chain", type=int, default=300)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("torch_op_overhead: no CUDA device visible to torch")
        return
    chain = a.chain // 3 * 3
    x = torch.randn(a.elements, device="cuda")
    w = torch.randn(a.elements, device="cuda")
    leaf = x.detach().clone().requires_grad_(True)

    def forward(y):
        for _ in range(chain // 3):
            y = torch.relu((y + 0.5) * w)
        return y

    def no_grad():
        with torch.no_grad():
            forward(x)
        torch.cuda.synchronize()

    def with_grad():
        forward(leaf).sum().backward()
        torch.cuda.synchronize()

    def best(run, reps):
        out = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            out = min(out, (time.perf_counter() - t0) * 1e6 / chain)
        return out

    for run in (no_grad, with_grad):
        best(run, 2)
    for mode, run in (("no_grad", no_grad), ("autograd", with_grad)):
        print(json.dumps({"bench": "cuda_op_overhead",
                          "impl": "pytorch-" + torch.__version__,
                          "mode": mode, "elements": a.elements,
                          "chain": chain, "us_per_op": round(best(run, a.reps), 3)}))


if __name__ == "__main__":
    main()
