#!/usr/bin/env python3
"""Trainer death in the parameter-server job (examples/parameter_server
--fault_tolerant under ferry_run --elastic_ranks), issue #33's trainer figures.

Each "kill" run starts 2 servers and 3 trainers; trainer0 SIGKILLs itself
(--kill_trainer/--kill_at_step: kill(getpid(), SIGKILL) between its forward
and backward pass) in iteration --kill_at_step. Figures per run:
  release_ms      SIGKILL (the victim's unix_us, printed just before) to the
                  moment each server released its state (its log line's
                  unix_us); the later of the two servers
  detect_ms       the servers' "detected N ms after its last request" (their
                  own view: heartbeat period + probe)
  gap_ms          the other trainers' largest gap between consecutive step
                  ends in [kill - 1 s, kill + 2 s]
  gap_end_after_kill_ms  where that gap ended, relative to the kill
  near_gap_ms     their largest step that overlapped [kill, kill + 300 ms]
                  (detection and release happen there)
  median_step_ms  their median step time over the whole run
Each "base" run is the same job without a kill; its gap is taken in the same
window (at the time trainer0 reached the same iteration), the noise floor.
Prints a table and one JSON line per figure ("bench": "fault/trainer_kill").

  bench/fault/trainer_kill.py --bin BAZEL_BIN [--runs N] [--iterations I]
"""

import argparse
import json
import re
import statistics
import subprocess
import sys


def run(bin_dir, iterations, kill_at, kill):
    argv = [f"{bin_dir}/tools/launcher/ferry_run", "--nproc=5",
            "--timeout_s=300", "--elastic_ranks=2-4", "--",
            f"{bin_dir}/examples/parameter_server/parameter_server",
            "--servers=2", "--trainers=3", f"--iterations={iterations}",
            f"--log_every={iterations}", "--vocab=200",
            "--target_accuracy=0.85", "--fault_tolerant",
            "--print_step_times"]
    if kill:
        argv += ["--kill_trainer=0", f"--kill_at_step={kill_at}"]
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=400)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"run failed ({p.returncode}):\n{out[-4000:]}")
    steps = {}
    for m in re.finditer(r"\]: (trainer\d) step_end_unix_us: ([\d,]+)", out):
        steps[m.group(1)] = [int(x) for x in m.group(2).split(",")]
    killed = re.search(r"trainer0: killing itself \(SIGKILL\) in iteration "
                       r"\d+ at unix_us (\d+)", out)
    released = [int(x) for x in re.findall(
        r"ps\d: trainer0 \(id \d+\) died at its step \d+ here, detected .*? "
        r"at unix_us (\d+)", out)]
    detected = [float(x) for x in re.findall(
        r"ps\d: trainer0 \(id \d+\) died .*?detected (\d+) ms after", out)]
    if kill and (killed is None or len(released) != 2):
        sys.exit(f"kill run: no kill or release line:\n{out[-4000:]}")
    if kill:
        t0 = int(killed.group(1))
    else:
        t0 = steps["trainer0"][kill_at - 1]
    others = [t for t in ("trainer1", "trainer2")]
    gaps, medians, near = [], [], []
    for t in others:
        ends = steps[t]
        d = [(b - a) / 1000 for a, b in zip(ends, ends[1:])]
        medians.append(statistics.median(d))
        # (gap, where it ended relative to the kill), in the window.
        w = [((b - a) / 1000, (b - t0) / 1000) for a, b in zip(ends, ends[1:])
             if t0 - 1_000_000 <= b <= t0 + 2_000_000]
        if w:
            gaps.append(max(w))
        # The step in flight at the kill up to the release (+ 300 ms).
        near.append(max([(b - a) / 1000 for a, b in zip(ends, ends[1:])
                         if t0 <= b and a <= t0 + 300_000] or [0]))
    gap, at = max(gaps)
    r = dict(gap_ms=gap, gap_end_after_kill_ms=at,
             near_gap_ms=max(near),
             median_step_ms=statistics.median(medians))
    if kill:
        r["release_ms"] = (max(released) - t0) / 1000
        r["detect_ms"] = max(detected)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=600)
    ap.add_argument("--kill_at", type=int, default=300)
    a = ap.parse_args()
    rows = []
    for i in range(a.runs):
        for kill in (True, False):
            r = run(a.bin, a.iterations, a.kill_at, kill)
            r["kind"] = "kill" if kill else "base"
            rows.append(r)
            print(f"run {i} {r['kind']}: " +
                  " ".join(f"{k}={v:.1f}" for k, v in r.items()
                           if k != "kind"), flush=True)
    print()
    print(f"{'figure':<34}{'kind':<6}{'median':>9}{'max':>9}{'n':>4}")
    figures = []
    for kind, names in (("kill", ("release_ms", "detect_ms", "gap_ms",
                                  "gap_end_after_kill_ms", "near_gap_ms",
                                  "median_step_ms")),
                        ("base", ("gap_ms", "gap_end_after_kill_ms",
                                  "near_gap_ms", "median_step_ms"))):
        for name in names:
            v = [r[name] for r in rows if r["kind"] == kind]
            f = dict(bench="fault/trainer_kill", impl="ferry", kind=kind,
                     name=name, median=statistics.median(v), max=max(v),
                     n=len(v), values=v)
            figures.append(f)
            print(f"{name:<34}{kind:<6}{f['median']:>9.1f}{f['max']:>9.1f}"
                  f"{len(v):>4}")
    kill_gap = [r["gap_ms"] / r["median_step_ms"] for r in rows
                if r["kind"] == "kill"]
    base_gap = [r["gap_ms"] / r["median_step_ms"] for r in rows
                if r["kind"] == "base"]
    for kind, v in (("kill", kill_gap), ("base", base_gap)):
        f = dict(bench="fault/trainer_kill", impl="ferry", kind=kind,
                 name="gap_over_median_step", median=statistics.median(v),
                 max=max(v), n=len(v), values=v)
        figures.append(f)
        print(f"{'gap_over_median_step':<34}{kind:<6}{f['median']:>9.1f}"
              f"{f['max']:>9.1f}{len(v):>4}")
    rel = [r["release_ms"] for r in rows if r["kind"] == "kill"]
    print()
    print(f"goal: release <= 1000 ms after SIGKILL: "
          f"{'MET' if max(rel) <= 1000 else 'NOT MET'} (max {max(rel):.0f} ms)")
    print()
    for f in figures:
        print(json.dumps(f))


if __name__ == "__main__":
    main()
