"""Side-by-side table of the RRef benchmark's JSON lines (bench/rref/run.sh).

    python3 bench/rref/report.py FILE...

Reads every line starting with '{' whose bench is "rref" (rref_bench and
torch_rref_bench.py output), prints the comparison with ratios and the
issue's goals, and one JSON line per ratio. Latencies compare medians (p50):
this VM's tails are noisy.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from report_util import fmt, load, print_goals, ratio  # noqa: E402

IMPLS = ("ferry", "pytorch", "pytorch_tcp")
LATENCIES = ("rpc_sync_noop", "remote_to_here_tensor4", "proxy_rpc_sync_noop")


def main():
    fig = load(sys.argv[1:], "rref")

    def get(impl, name, field):
        r = fig.get((impl, name))
        return None if r is None else r.get(field)

    ratios = []
    print("\nFerry timed in C++ (rref_bench); PyTorch 1.13 TensorPipe from "
          "Python (torch_rref_bench.py), as its users run it.")
    print("\n## Latency, median (us); lower is better")
    print(f"{'figure':<24} {'Ferry':>8} {'PT shm':>8} {'PT tcp':>8} "
          f"{'Ferry/PT shm':>12} {'Ferry/PT tcp':>12} {'x own rpc_sync':>14}")
    floor = {i: get(i, "rpc_sync_noop", "p50_us") for i in IMPLS}
    for name in LATENCIES:
        f, p, pt = (get(i, name, "p50_us") for i in IMPLS)
        row = dict(figure=name, ferry_over_pytorch=ratio(f, p),
                   ferry_over_pytorch_tcp=ratio(f, pt),
                   ferry_over_ferry_rpc_sync=ratio(f, floor["ferry"]),
                   pytorch_over_pytorch_rpc_sync=ratio(p, floor["pytorch"]))
        ratios.append(row)
        print(f"{name:<24} {fmt(f, '8.1f')} {fmt(p, '8.1f')} {fmt(pt, '8.1f')} "
              f"{fmt(row['ferry_over_pytorch'], '12.2f')} "
              f"{fmt(row['ferry_over_pytorch_tcp'], '12.2f')} "
              f"{fmt(row['ferry_over_ferry_rpc_sync'], '14.2f')}")

    print("\n## Create + drop RRefs (us per RRef, protocol messages per RRef)")
    print(f"{'impl':<12} {'us/RRef':>9} {'msgs/RRef':>9} {'RRefs':>7}")
    for i in IMPLS:
        print(f"{i:<12} {fmt(get(i, 'create_drop', 'us_per_rref'), '9.1f')} "
              f"{fmt(get(i, 'create_drop', 'messages_per_rref'), '9.2f')} "
              f"{fmt(get(i, 'create_drop', 'rrefs'), '7d')}")
    f = get("ferry", "create_drop", "us_per_rref")
    row = dict(figure="create_drop",
               ferry_over_pytorch=ratio(f, get("pytorch", "create_drop",
                                               "us_per_rref")),
               ferry_over_pytorch_tcp=ratio(f, get("pytorch_tcp",
                                                   "create_drop",
                                                   "us_per_rref")))
    ratios.append(row)
    print(f"Ferry/PT shm {fmt(row['ferry_over_pytorch'], '6.2f')}, "
          f"Ferry/PT tcp {fmt(row['ferry_over_pytorch_tcp'], '6.2f')}")

    print("\n## Issue goals (same run)")
    rt = get("ferry", "remote_to_here_tensor4", "p50_us")
    goals = [
        ("remote()+to_here() <= 1.5x Ferry's rpc_sync no-op",
         ratio(rt, floor["ferry"]), lambda r: r <= 1.5),
        ("remote()+to_here() <= 0.7x PyTorch (shared memory)",
         ratio(rt, get("pytorch", "remote_to_here_tensor4", "p50_us")),
         lambda r: r <= 0.7),
    ]
    print_goals(goals, ratios, width=54)
    print()
    for r in ratios:
        print(json.dumps(dict(bench="rref_ratio", **r)))


if __name__ == "__main__":
    main()
