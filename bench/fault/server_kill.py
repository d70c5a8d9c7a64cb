#!/usr/bin/env python3
"""Server death in the parameter-server job (examples/parameter_server
--fault_tolerant --checkpoint_dir under ferry_run --restart_ranks), issue
#33's server figures.

Each run starts 2 servers and 2 trainers; server ps<victim> SIGKILLs itself
(--kill_server/--kill_server_at_step: kill(getpid(), SIGKILL) right after
applying that step) at a drawn applied step; ferry_run restarts it, it
restores its newest checkpoint and rejoins; the trainers wait for it and go
on. Figures per run (all from the processes' own unix_us log stamps):
  rejoin_ms       SIGKILL (the victim's stamp, printed just before) to the
                  restarted server's "rejoined the group" (restart by the
                  launcher, exec, restore, gRPC join)
  back_ms         SIGKILL to the later trainer's "is back" (WaitForWorker
                  returned, RRefs and optimizer re-created)
  first_step_ms   SIGKILL to the first step completed by any trainer after
                  its recovery (--print_step_times)
  steps_lost      the victim's applied-step counter at the kill minus the
                  restored one (updates applied after the newest checkpoint
                  written; --checkpoint_every bounds it when the writer keeps
                  up)
  median_step_ms  the trainers' median step time over the run
Prints one line per run, a table, and one JSON line per figure
("bench": "fault/server_kill").

  bench/fault/server_kill.py --bin BAZEL_BIN [--runs N] [--iterations I]
      [--checkpoint_every K] [--seed S]
"""

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile


def run(bin_dir, iterations, every, victim, kill_at):
    with tempfile.TemporaryDirectory(prefix="ferry_server_kill.") as d:
        argv = [f"{bin_dir}/tools/launcher/ferry_run", "--nproc=4",
                "--timeout_s=300", "--elastic_ranks=2-3",
                "--restart_ranks=0-1", "--rank_restarts=1", "--",
                f"{bin_dir}/examples/parameter_server/parameter_server",
                "--servers=2", "--trainers=2", f"--iterations={iterations}",
                f"--log_every={iterations}", "--vocab=200",
                "--target_accuracy=0.85", "--fault_tolerant",
                f"--checkpoint_dir={d}", f"--checkpoint_every={every}",
                f"--kill_server={victim}",
                f"--kill_server_at_step={kill_at}", "--print_step_times"]
        p = subprocess.run(argv, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=400)
    out = p.stdout
    if p.returncode != 0:
        sys.exit(f"run failed ({p.returncode}):\n{out[-6000:]}")
    v = f"ps{victim}"
    kill = re.search(rf"{v}: killing itself \(SIGKILL\) at applied step "
                     rf"(\d+) \(newest checkpoint written: step (-?\d+)\) "
                     rf"at unix_us (\d+)", out)
    rest = re.search(rf"{v}: restarted \(FERRY_RUN_RESTART=1\): restored "
                     rf"applied step (\d+)", out)
    rejoin = re.search(rf"{v}: rejoined the group under its name as worker "
                       rf"\d+ at unix_us (\d+)", out)
    backs = {m.group(1): int(m.group(2)) for m in re.finditer(
        rf"(trainer\d+): iteration \d+: {v} is back as worker \d+ after "
        rf"\S+ s, .* at unix_us (\d+)", out)}
    steps = {m.group(1): [int(x) for x in m.group(2).split(",")]
             for m in re.finditer(r"(trainer\d+) step_end_unix_us: (\S+)",
                                  out)}
    if not (kill and rest and rejoin and backs and steps):
        sys.exit(f"a log line is missing:\n{out[-6000:]}")
    k_us = int(kill.group(3))
    firsts = [next((s for s in steps[t] if s > backs[t]), None)
              for t in backs if t in steps]
    firsts = [f for f in firsts if f is not None]
    deltas = []
    for ends in steps.values():
        deltas += [(b - a) / 1000 for a, b in zip(ends, ends[1:])]
    return {
        "victim": v, "kill_at": int(kill.group(1)),
        "written": int(kill.group(2)), "restored": int(rest.group(1)),
        "rejoin_ms": (int(rejoin.group(1)) - k_us) / 1000,
        "back_ms": (max(backs.values()) - k_us) / 1000,
        "first_step_ms": (min(firsts) - k_us) / 1000 if firsts else None,
        "steps_lost": int(kill.group(1)) - int(rest.group(1)),
        "median_step_ms": statistics.median(deltas),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--iterations", type=int, default=600)
    ap.add_argument("--checkpoint_every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=20261127)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    figures = ["rejoin_ms", "back_ms", "first_step_ms", "steps_lost",
               "median_step_ms"]
    rows = []
    for i in range(a.runs):
        victim = i % 2 == 0 and 1 or 0
        kill_at = rng.randint(2 * a.checkpoint_every, 2 * a.iterations - 100)
        r = run(a.bin, a.iterations, a.checkpoint_every, victim, kill_at)
        rows.append(r)
        print(f"run {i}: {r['victim']} killed at applied step {r['kill_at']} "
              f"(written {r['written']}), restored {r['restored']}: " +
              " ".join(f"{f}={r[f]}" for f in figures), flush=True)
    print()
    print(f"{'figure':<18}{'median':>10}{'max':>10}{'n':>4}")
    for f in figures:
        vals = [r[f] for r in rows if r[f] is not None]
        if not vals:
            continue
        print(f"{f:<18}{statistics.median(vals):>10.1f}{max(vals):>10.1f}"
              f"{len(vals):>4}")
        print(json.dumps({"bench": "fault/server_kill", "figure": f,
                          "median": statistics.median(vals),
                          "max": max(vals), "n": len(vals)}))


if __name__ == "__main__":
    main()
