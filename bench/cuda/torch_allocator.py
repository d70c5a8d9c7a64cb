"""PyTorch's CUDA caching allocator on the sequence allocator_bench.cc uses.

    python3 bench/cuda/torch_allocator.py [--cycles=10000] [--window=16] [--reps=5]

Times torch.empty(n, dtype=uint8, device="cuda") and the release of the
oldest of the last `window` tensors, from Python as its users call it (so
the figure includes the binding's overhead; the "python loop floor" row is
the same loop allocating host bytearrays of 1 byte). Prints a table and one
JSON line per figure; exits 0 with a note when no GPU is visible.
"""
import argparse
import collections
import json
import time


def sizes(n):
    out, x = [], 42
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        bits = 9 + (x >> 33) % 18
        out.append((1 << bits) + (x >> 20) % (1 << bits))
    return out


def ns_per_cycle(seq, window, reps, alloc):
    best = float("inf")
    for _ in range(reps):
        live = collections.deque()
        t0 = time.perf_counter()
        for n in seq:
            live.append(alloc(n))
            if len(live) > window:
                live.popleft()
        t1 = time.perf_counter()
        live.clear()
        best = min(best, (t1 - t0) * 1e9 / len(seq))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("# torch %s: no GPU visible" % torch.__version__)
        return
    seq = sizes(args.cycles)
    rows = [
        ("pytorch %s caching" % torch.__version__,
         ns_per_cycle(seq, args.window, args.reps,
                      lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"))),
        ("python loop floor",
         ns_per_cycle(seq, args.window, args.reps, lambda n: bytearray(1))),
    ]
    torch.cuda.synchronize()
    print("%-6s %-44s %12s" % ("api", "impl", "ns/cycle"))
    for impl, ns in rows:
        print("%-6s %-44s %12.1f" % ("cuda", impl, ns))
    for impl, ns in rows:
        print(json.dumps({"bench": "cuda_allocator", "api": "cuda", "impl": impl,
                          "cycles": args.cycles, "window": args.window,
                          "ns_per_cycle": round(ns, 1)}))


if __name__ == "__main__":
    main()
