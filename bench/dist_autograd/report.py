"""Side-by-side table of the distributed-autograd benchmark's JSON lines
(bench/dist_autograd/run.sh): per-step medians, the step overhead
(distributed - local), parameter-server throughput, Ferry's server handler
p50s, ratios and the issue's goals, then one JSON line per ratio.

    python3 bench/dist_autograd/report.py FILE...
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from report_util import fmt, load, print_goals, ratio  # noqa: E402

IMPLS = ("ferry", "pytorch", "pytorch_tcp")


def main():
    fig = load(sys.argv[1:], "dist_autograd")

    def get(impl, name, field):
        r = fig.get((impl, name))
        return None if r is None else r.get(field)

    ratios = []
    print("\nFerry timed in C++; PyTorch 1.13 from Python, as its users run "
          "it. Linear 64->64 on the server, batch 64.")
    print("\n## Per step, median (us); lower is better")
    print(f"{'figure':<20} {'Ferry':>9} {'PT shm':>9} {'PT tcp':>9} "
          f"{'Ferry/PT shm':>12} {'Ferry/PT tcp':>12}")
    for name in ("rpc_sync_noop", "local_step", "dist_step",
                 "dist_step_separate_step", "dist_step_overhead"):
        f, p, pt = (get(i, name, "p50_us") for i in IMPLS)
        row = dict(figure=name, ferry_over_pytorch=ratio(f, p),
                   ferry_over_pytorch_tcp=ratio(f, pt))
        ratios.append(row)
        print(f"{name:<20} {fmt(f, '9.1f')} {fmt(p, '9.1f')} {fmt(pt, '9.1f')} "
              f"{fmt(row['ferry_over_pytorch'], '12.2f')} "
              f"{fmt(row['ferry_over_pytorch_tcp'], '12.2f')}")
    print("\n## Parameter server, 2 trainers + 2 servers (samples/s); higher "
          "is better")
    f, p, pt = (get(i, "ps_throughput", "samples_per_s") for i in IMPLS)
    row = dict(figure="ps_throughput", ferry_over_pytorch=ratio(f, p),
               ferry_over_pytorch_tcp=ratio(f, pt))
    ratios.append(row)
    print(f"Ferry {fmt(f, '8.0f')}  PT shm {fmt(p, '8.0f')}  PT tcp "
          f"{fmt(pt, '8.0f')}  Ferry/PT shm "
          f"{fmt(row['ferry_over_pytorch'], '5.2f')}  Ferry/PT tcp "
          f"{fmt(row['ferry_over_pytorch_tcp'], '5.2f')}")
    print("\n## Ferry requests per step (trainer -> server)")
    for name in ("dist_step_separate_step_messages", "dist_step_messages"):
        print(f"{name:<34} {fmt(get('ferry', name, 'requests_per_op'), '6.2f')}"
              f"  {get('ferry', name, 'by_type')}")
    print("\n## Ferry server handlers, p50 (us; agent stats, last 1024 calls)")
    for name in ("noop_rtt", "echo_rtt", "server_noop_handler",
                 "server_echo_handler", "server_forward_handler",
                 "server_forward_body", "server_backward_handler"):
        print(f"{name:<34} {fmt(get('ferry', name, 'p50_us'), '9.1f')}")
    print("\n## Issue goals (same run)")
    goals = [
        ("step overhead <= 0.3x PyTorch's (shared memory)",
         ratio(get("ferry", "dist_step_overhead", "p50_us"),
               get("pytorch", "dist_step_overhead", "p50_us")),
         lambda r: r <= 0.3),
        ("local step <= 1.0x PyTorch's",
         ratio(get("ferry", "local_step", "p50_us"),
               get("pytorch", "local_step", "p50_us")),
         lambda r: r <= 1.0),
        ("parameter-server throughput >= 3x PyTorch (shared memory)",
         ratio(f, p), lambda r: r >= 3),
        ("requests per step == 2",
         get("ferry", "dist_step_messages", "requests_per_op"),
         lambda r: r <= 2.0 + 1e-9),
    ]
    print_goals(goals, ratios, width=58)
    print()
    for r in ratios:
        print(json.dumps(dict(bench="dist_autograd_ratio", **r)))


if __name__ == "__main__":
    main()
