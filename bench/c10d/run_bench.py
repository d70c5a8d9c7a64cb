"""Runs bench/c10d: Ferry's gloo, shm and mpi backends and PyTorch 1.13's
ProcessGroupGloo, 2 and 4 ranks as processes on this host, and prints a side-by-side table,
one JSON line per figure, and a PNG plot of allreduce bus bandwidth."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_job(cmd_for_rank, world):
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        procs = [subprocess.Popen(cmd_for_rank(r, world, init),
                                  stdout=subprocess.PIPE, text=True)
                 for r in range(world)]
        outs = [p.communicate(timeout=1800)[0] for p in procs]
        for r, p in enumerate(procs):
            if p.returncode != 0:
                sys.exit("rank %d of %s exited %d" % (r, cmd_for_rank(r, world, init), p.returncode))
    return [json.loads(l) for l in outs[0].splitlines() if l.startswith("{")]


MPIRUN = "/usr/bin/mpirun"


def run_mpi_job(cmd, world):
    """One mpirun starting `world` ranks of cmd (rank 0 prints the JSON)."""
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        argv = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np",
                str(world), "--mca", "btl", "self,vader", "--mca",
                "btl_vader_single_copy_mechanism", "none"] + cmd(init)
        out = subprocess.run(argv, stdout=subprocess.PIPE, text=True,
                             timeout=1800, env=dict(os.environ, TMPDIR="/tmp"))
        if out.returncode != 0:
            sys.exit("%s exited %d" % (" ".join(argv), out.returncode))
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


def fmt_bytes(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return "%d %s" % (b // div, unit)
    return "%d B" % b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--allreduce_sizes", default=None)
    ap.add_argument("--other_sizes", default=None)
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs per implementation, alternating; best kept")
    a = ap.parse_args()
    extra = []
    if a.allreduce_sizes:
        extra.append("--allreduce_sizes=" + a.allreduce_sizes)
    if a.other_sizes:
        extra.append("--other_sizes=" + a.other_sizes)
    impls = {
        "ferry-gloo": lambda r, w, init: [a.bin, "--rank=%d" % r,
                                          "--world_size=%d" % w,
                                          "--init=" + init] + extra,
        # Without the per-call argument check (one network round fewer).
        "ferry-gloo-unchecked": lambda r, w, init: [
            a.bin, "--rank=%d" % r, "--world_size=%d" % w, "--init=" + init,
            "--check_args=false", "--impl=ferry-gloo-unchecked"] + extra,
        # Same-host shared memory in front of gloo (the default registry's
        # choice when every rank is on one host).
        "ferry-shm": lambda r, w, init: [
            a.bin, "--rank=%d" % r, "--world_size=%d" % w, "--init=" + init,
            "--shm=true", "--impl=ferry-shm"] + extra,
        "pytorch-1.13-gloo": lambda r, w, init: [
            "/usr/bin/python3", os.path.join(HERE, "torch_bench.py"),
            "--rank=%d" % r, "--world_size=%d" % w, "--init=" + init] + extra,
    }
    # Ferry's MPI backend (Open MPI, shared memory between ranks), started
    # by mpirun; only where mpirun is installed.
    mpi = {}
    if os.access(MPIRUN, os.X_OK):
        mpi["ferry-mpi"] = lambda init: [
            a.bin, "--init=" + init, "--backend=mpi", "--impl=ferry-mpi"] + extra
    # The host is shared and noisy: alternate implementations and keep each
    # figure's best run.
    best = {}
    for rep in range(a.repeat):
        for world in [int(x) for x in a.ranks.split(",")]:
            jobs = [(name, lambda c=cmd, w=world: run_job(c, w))
                    for name, cmd in impls.items()]
            jobs += [(name, lambda c=cmd, w=world: run_mpi_job(c, w))
                     for name, cmd in mpi.items()]
            for name, job in jobs:
                print("# run %d: %s with %d ranks..." % (rep + 1, name, world),
                      flush=True)
                for r in job():
                    k = (r["impl"], r["op"], r["ranks"], r["bytes"])
                    if k not in best or r["busbw_GBps"] > best[k]["busbw_GBps"]:
                        best[k] = r
    results = list(best.values())
    try:
        load = open("/proc/loadavg").read().split()[:3]
        print("# load average after the runs: %s (%d CPUs)" % (" ".join(load), os.cpu_count()))
    except OSError:
        pass

    os.makedirs(a.out, exist_ok=True)
    key = lambda r: (r["op"], r["ranks"], r["bytes"])
    ferry = {key(r): r for r in results if r["impl"] == "ferry-gloo"}
    unchecked = {key(r): r for r in results if r["impl"] == "ferry-gloo-unchecked"}
    torch = {key(r): r for r in results if r["impl"] == "pytorch-1.13-gloo"}
    shm = {key(r): r for r in results if r["impl"] == "ferry-shm"}
    mpis = {key(r): r for r in results if r["impl"] == "ferry-mpi"}
    nan = {"busbw_GBps": float("nan"), "time_us": float("nan")}
    print()
    print("Ferry is timed in C++ (c10d_bench); PyTorch 1.13 from Python "
          "(torch_bench.py), as its users run it.")
    print("Each figure is the best of %d alternating runs per implementation."
          % a.repeat)
    print("busbw in GB/s, time per call in us; ratio = Ferry / PyTorch busbw.")
    print("alg: Ferry's algorithm for that row: 'direct' = the small-message "
          "exchange (busbw = size * (N-1) / time),")
    print("'ring' = Gloo's ring (busbw = algbw * 2(N-1)/N for allreduce, "
          "(N-1)/N for allgather, 1 for broadcast).")
    print("shm: Ferry's shared-memory backend (busbw with the ring factors); "
          "shm-x = PyTorch time / shm time.")
    print("mpi: Ferry's mpi backend under mpirun (Open MPI's own algorithm, "
          "argument check on); mpi-x = PyTorch time / mpi time.")
    print("%-9s %5s %7s %6s | %7s %9s %7s %6s | %9s %9s %9s | %9s %6s | %9s %6s" % (
        "op", "ranks", "size", "alg", "Ferry", "Ferry-nc", "PyTorch", "ratio",
        "Ferry us", "Ferry-nc", "PyTorch", "shm us", "shm-x", "mpi us",
        "mpi-x"))
    print("-" * 137)
    for k in sorted(ferry, key=lambda k: (["allreduce", "broadcast", "allgather"].index(k[0]), k[1], k[2])):
        f, u, t = ferry[k], unchecked.get(k, nan), torch.get(k, nan)
        sm = shm.get(k, nan)
        ratio = f["busbw_GBps"] / t["busbw_GBps"] if t is not nan else float("nan")
        shm_x = t["time_us"] / sm["time_us"]
        mp = mpis.get(k, nan)
        mpi_x = t["time_us"] / mp["time_us"]
        print("%-9s %5d %7s %6s | %7.3f %9.3f %7.3f %5.2fx | %9.1f %9.1f %9.1f | %9.1f %5.2fx | %9.1f %5.2fx" % (
            k[0], k[1], fmt_bytes(k[2]), f.get("algorithm", "?"),
            f["busbw_GBps"], u["busbw_GBps"],
            t["busbw_GBps"], ratio, f["time_us"], u["time_us"], t["time_us"],
            sm["time_us"], shm_x, mp["time_us"], mpi_x))
    print("(Ferry-nc: Ferry with check_args=false, no per-call argument "
          "exchange, always Gloo's ring; PyTorch's busbw uses the ring formula)")
    print()
    with open(os.path.join(a.out, "results.jsonl"), "w") as fh:
        for r in sorted(results, key=lambda r: (r["impl"], r["op"], r["ranks"], r["bytes"])):
            line = json.dumps(r)
            print(line)
            fh.write(line + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl, style in (("ferry-gloo", "-o"), ("ferry-gloo-unchecked", ":^"),
                        ("ferry-shm", "-.D"), ("ferry-mpi", "-v"),
                        ("pytorch-1.13-gloo", "--s")):
        for world in sorted({r["ranks"] for r in results}):
            pts = sorted((r["bytes"], r["busbw_GBps"]) for r in results
                         if r["impl"] == impl and r["ranks"] == world and r["op"] == "allreduce")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style,
                        label="%s, %d ranks" % (impl, world))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("allreduce bus bandwidth (GB/s)")
    ax.set_title("allreduce SUM float32, processes on one host (gloo: loopback TCP)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    png = os.path.join(a.out, "allreduce_busbw.png")
    fig.savefig(png, dpi=120, bbox_inches="tight")
    print("# plot: %s" % png)


if __name__ == "__main__":
    main()
