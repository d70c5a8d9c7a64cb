"""Reads the JSON lines of bench/autograd on stdin and prints the
side-by-side table (Ferry time / PyTorch time per figure), keeping the
best of the rounds for each implementation and figure."""
import json
import sys

best = {}
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    key = (r["impl"], r["figure"], r.get("mlp", ""), r.get("zero_grad", ""))
    if key not in best or r["time_us"] < best[key]["time_us"]:
        best[key] = r
rows = list(best.values())
torch_rows = {(r["figure"], r.get("mlp", ""), r.get("zero_grad", "")): r
              for r in rows
              if r["impl"].startswith("pytorch")}
print("%-10s %-22s %-16s %12s %12s %8s" %
      ("figure", "shape", "impl", "time_us", "torch_us", "ratio"))
for r in rows:
    key = (r["figure"], r.get("mlp", ""), r.get("zero_grad", ""))
    shape = (r.get("mlp", "") or ("%d->%d" % (r["dim"], r["dim"])
                                  if "dim" in r else "")) + (
        " b%d" % r["batch"] if "batch" in r else
        "%d adds x%d" % (r["ops"], r["numel"]))
    if r.get("zero_grad") == "in_place":
        shape += " zero_"
    t = torch_rows.get(key)
    ratio = "%.2f" % (r["time_us"] / t["time_us"]) if t else "-"
    print("%-10s %-22s %-16s %12.1f %12s %8s" %
          (r["figure"], shape, r["impl"], r["time_us"],
           "%.1f" % t["time_us"] if t else "-", ratio))
