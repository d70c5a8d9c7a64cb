"""Reads bench/ddp JSON lines on stdin; prints step times, DDP overhead over
one process for each implementation, and Ferry/PyTorch ratios."""
import json
import sys

rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]


def key(r):
    return (r["impl"], r["mode"], r["fp16"], r["optimizer_in_backward"])


by = {key(r): r for r in rows}
print(f"{'impl':14} {'mode':7} {'fp16':5} {'opt-in-bw':9} {'step ms':>8} "
      f"{'overhead':>9} {'bytes/step':>11}")
for r in rows:
    single = by.get((r["impl"], "single", False, False))
    over = ""
    if r["mode"] == "ddp" and single:
        over = f"{100 * (r['time_us'] / single['time_us'] - 1):+.1f}%"
    print(f"{r['impl']:14} {r['mode']:7} {str(r['fp16']):5} "
          f"{str(r['optimizer_in_backward']):9} {r['time_us'] / 1000:8.2f} "
          f"{over:>9} {r['allreduce_bytes']:>11}")
f = by.get(("ferry", "ddp", False, False))
t = next((r for k, r in by.items()
          if k[0].startswith("pytorch") and k[1:] == ("ddp", False, False)), None)
if f and t:
    print(f"Ferry DDP / PyTorch DDP step time ({f.get('device', 'cpu')}): "
          f"{f['time_us'] / t['time_us']:.2f}")
