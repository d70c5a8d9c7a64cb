#!/usr/bin/env python3
"""DDP re-form after a SIGKILL: time from the kill to the first completed step.

Runs N trainers of examples/ddp/ddp_elastic (fault-tolerant DDP over a
Quorum, Gloo over TCP) against a standalone ferry_store on loopback; one of
them raises SIGKILL inside backward at --die_at_step. Every worker prints
"<EVENT> id=.. t_ms=<unix ms> ..." lines (same host, same clock), from which
each trial reports:

  detect_ms   kill -> first survivor's failed step (collective error)
  form_ms     kill -> last survivor's FORMED (generation 2 committed: the
              dead member's heartbeat went stale)
  reform_ms   kill -> last survivor's REFORMED (new generation, new group,
              parameters and optimizer state re-broadcast)
  first_ms    kill -> last survivor's first completed step after re-form
  group_ms    the slowest survivor's creation of the new Gloo group (not
              counted from the kill)
  commit_us   mean time a survivor spent per step in Quorum::Commit (the
              per-step agreement through the store; includes waiting for
              the slowest member to finish its backward)
  steps_lost  steps applied before the kill that were lost (0: the step in
              flight is discarded on every member and redone)

Prints a table and one JSON line per figure. Usage:
  bench/fault/ddp_reform.py --worker BIN --store BIN [--trials 3]
      [--heartbeat_ms 5000,2000,1000] [--world 4]
(bench/fault/run.sh builds the binaries and passes their paths.)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

EVENT = re.compile(r"^(\w+) id=(\S+) t_ms=(\d+)(.*)$")


def parse(text):
    out = []
    for line in text.splitlines():
        m = EVENT.match(line)
        if not m:
            continue
        fields = dict(kv.split("=", 1) for kv in m.group(4).split() if "=" in kv)
        out.append((m.group(1), m.group(2), int(m.group(3)), fields))
    return out


def start_store(store_bin):
    p = subprocess.Popen([store_bin, "--host=127.0.0.1", "--port=0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = p.stdout.readline()
        m = re.search(r"port (\d+)", line)
        if m:
            return p, int(m.group(1))
        if not line and p.poll() is not None:
            break
    p.kill()
    raise RuntimeError("ferry_store did not report its port")


def trial(args, hb_ms, coll_ms, probe):
    store, port = start_store(args.store)
    procs = []
    try:
        for i in range(args.world):
            argv = [args.worker, "--port=%d" % port, "--id=w%d" % i,
                    "--min_size=%d" % args.world, "--steps=%d" % args.steps,
                    "--heartbeat_timeout_ms=%d" % hb_ms,
                    "--collective_timeout_ms=%d" % coll_ms,
                    "--probe=%s" % ("true" if probe else "false")]
            if i == args.victim:
                argv.append("--die_at_step=%d" % args.die_at_step)
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            outs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        store.kill()
        store.wait()
    events = [e for _, out in outs for e in parse(out)]
    dying = [e for e in events if e[0] == "DYING"]
    if len(dying) != 1:
        raise RuntimeError("no DYING line:\n" + "\n".join(o for _, o in outs))
    t_kill = dying[0][2]
    survivors = [i for i in range(args.world) if i != args.victim]
    for i in survivors:
        if outs[i][0] != 0:
            raise RuntimeError("survivor w%d exit %d:\n%s" %
                               (i, outs[i][0], outs[i][1]))
    failed = [e[2] for e in events if e[0] == "STEP_FAILED"]
    reformed = [e for e in events if e[0] == "REFORMED" and e[3]["gen"] == "2"]
    formed = [e for e in events if e[0] == "FORMED" and e[3]["gen"] == "2"]
    first = {}
    for name, who, t, f in events:
        if name == "STEP" and f.get("gen") == "2" and who not in first:
            first[who] = t
    finals = [e for e in events if e[0] == "FINAL"]
    if len(reformed) != len(survivors) or len(first) != len(survivors):
        raise RuntimeError("not every survivor re-formed and stepped")
    if len(finals) != len(survivors) or \
            len({f[3]["hash"] for f in finals}) != 1 or \
            any(f[3]["identical"] != "1" for f in finals):
        raise RuntimeError("survivors' final state differs")
    resumed_at = int(reformed[0][3]["step"])
    group_ms = max(int(e[3].get("group_ms", -1)) for e in reformed)
    return {
        "detect_ms": min(failed) - t_kill,
        "form_ms": max(e[2] for e in formed) - t_kill,
        "reform_ms": max(e[2] for e in reformed) - t_kill,
        "first_ms": max(first.values()) - t_kill,
        # Steps completed before the kill: die_at_step - 1.
        "steps_lost": (args.die_at_step - 1) - resumed_at,
        # Mean time in Quorum::Commit per step, over the survivors.
        "commit_us": int(statistics.mean(
            int(f[3]["commit_us_mean"]) for f in finals)),
        # The slowest survivor's new Gloo group (rendezvous + connect).
        "group_ms": group_ms,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--victim", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--die_at_step", type=int, default=10)
    ap.add_argument("--trials", type=int, default=3)
    # Heartbeat timeouts; "+probe" adds the liveness probe (QuorumOptions::
    # probe_host) to that configuration.
    ap.add_argument("--heartbeat_ms", default="5000+probe,5000,2000,1000")
    ap.add_argument("--collective_ms", type=int, default=5000)
    args = ap.parse_args()
    rows = []
    for conf in args.heartbeat_ms.split(","):
        probe = conf.endswith("+probe")
        hb = int(conf.replace("+probe", ""))
        results = [trial(args, hb, args.collective_ms, probe)
                   for _ in range(args.trials)]
        for key in ("detect_ms", "form_ms", "group_ms", "reform_ms",
                    "first_ms", "steps_lost", "commit_us"):
            vals = [r[key] for r in results]
            rows.append((conf, key, vals))
    print("%-14s %-11s %8s %8s %8s  %s" %
          ("heartbeat_ms", "figure", "median", "min", "max", "trials"))
    for hb, key, vals in rows:
        print("%-14s %-11s %8d %8d %8d  %s" %
              (hb, key, statistics.median(vals), min(vals), max(vals), vals))
    for hb, key, vals in rows:
        print(json.dumps({
            "bench": "ddp_reform", "world": args.world,
            "heartbeat_timeout_ms": int(hb.replace("+probe", "")),
            "probe": hb.endswith("+probe"),
            "collective_timeout_ms": args.collective_ms, "figure": key,
            "median": statistics.median(vals), "min": min(vals),
            "max": max(vals), "trials": vals}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
