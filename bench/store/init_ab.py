"""Init time of several store_bench builds, interleaved, medians and ratios.

  python3 bench/store/init_ab.py --reps=3 --sizes=8192,16384 \
      before=/path/to/store_bench after=/path/to/store_bench

Runs run_bench.py's init figure (Ferry server and clients, 4 client
processes) for every build and size in turn, `reps` times, so that load from
other jobs on a shared machine falls on every build alike. Prints each run,
then a table of medians with the largest/smallest size ratio, and one JSON
line per build. Raise the descriptor limit first (`ulimit -n 20000`).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_bench as rb  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="8192,16384")
    ap.add_argument("--limit", type=float, default=240)
    ap.add_argument("builds", nargs="+", help="name=path of a store_bench")
    a = ap.parse_args()
    builds = [b.split("=", 1) for b in a.builds]
    sizes = [int(x) for x in a.sizes.split(",")]
    runs = {}
    for r in range(a.reps):
        for name, path in builds:
            rb.BIN = path
            for n in sizes:
                t = rb.bench_init(n, "ferry", "ferry", 4, a.limit)
                runs.setdefault((name, n), []).append(t)
                print(f"rep {r} {name} {n} {t}", flush=True)
    lo, hi = sizes[0], sizes[-1]
    print(f"\n{'build':>10} " + " ".join(f"{n:>8}" for n in sizes) +
          f" {'ratio':>6}")
    for name, _ in builds:
        med = {}
        for n in sizes:
            ok = [t for t in runs[(name, n)] if isinstance(t, float)]
            med[n] = statistics.median(ok) if ok else None
        ratio = med[hi] / med[lo] if med[hi] and med[lo] else None
        print(f"{name:>10} " + " ".join(
            f"{med[n]:>8.3f}" if med[n] else f"{'failed':>8}" for n in sizes) +
            (f" {ratio:>6.2f}" if ratio else ""))
        print("JSON " + json.dumps({
            "figure": "store_init_seconds_median", "build": name,
            "reps": a.reps, "medians": {str(n): med[n] for n in sizes},
            "runs": {str(n): runs[(name, n)] for n in sizes},
            f"ratio_{hi}_over_{lo}": ratio}), flush=True)


if __name__ == "__main__":
    main()
