"""Side by side: nccl_bench.cc (Ferry, raw NCCL / CUDA) and
torch_nccl_bench.py (PyTorch ProcessGroupNCCL) JSON lines, one table with
time per call and the ratios torch/ferry (>1: Ferry is faster) and
floor/ferry (1.0: Ferry adds nothing to the raw call).

  python3 nccl_report.py ferry.jsonl torch.jsonl"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from report_util import fmt, ratio  # noqa: E402


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(l) for l in f if l.startswith("{")]
    return rows


def main():
    rows = load(sys.argv[1:])
    by = {}
    for r in rows:
        by.setdefault((r["op"], r["bytes"]), {})[r["impl"]] = r["us"]
    torch_impl = next((r["impl"] for r in rows if r["impl"].startswith("torch")),
                      None)
    print("%-14s %10s %12s %12s %12s %10s %10s" %
          ("op", "bytes", "ferry us", "floor us", "torch us", "torch/ferry",
           "floor/ferry"))
    for (op, size) in sorted(by, key=lambda k: (k[0], k[1])):
        v = by[(op, size)]
        ferry = v.get("ferry-nccl")
        floor = v.get("raw-nccl", v.get("raw-cuda"))
        torch = v.get(torch_impl) if torch_impl else None
        print("%-14s %10d %s %s %s %s %s" % (
            op, size, fmt(ferry, "12.2f"), fmt(floor, "12.2f"),
            fmt(torch, "12.2f"), fmt(ratio(torch, ferry), "10.2f"),
            fmt(ratio(floor, ferry), "10.2f")))
        if ferry and torch:
            print(json.dumps({"op": op, "bytes": size, "ferry_us": ferry,
                              "floor_us": floor, "torch_us": torch,
                              "torch_impl": torch_impl,
                              "torch_over_ferry": ratio(torch, ferry)}))


if __name__ == "__main__":
    main()
