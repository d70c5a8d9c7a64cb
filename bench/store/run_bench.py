"""TCPStore benchmark driver: Ferry vs PyTorch 1.13 in one run.

Figures (clients spread over a few processes, all on loopback):
  1. init: server start until N handles joined and wait-for-workers returned.
  2. barrier: store-based barrier (add + wait on a last-worker key), time per
     barrier for N ranks.
  3. latency: single-client set/get/add median, next to a raw TCP round trip
     measured in the same run; aggregate add ops/s with 1..256 clients.
Prints a table and one JSON line per figure; plots init time vs N to a PNG.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
TORCH = os.path.join(HERE, "torch_bench.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """A set of processes killed together (and after `limit` seconds)."""

    def __init__(self, limit):
        self.procs = []
        self.timer = threading.Timer(limit, self.kill)
        self.timer.start()
        self.timed_out = False

    def spawn(self, cmd):
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, bufsize=1)
        self.procs.append(p)
        return p

    def kill(self):
        self.timed_out = True
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def finish(self):
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        # The measurement is over: processes that linger (PyTorch 1.13
        # clients whose watch-key threads outlive the server) are killed.
        deadline = time.time() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.timer.cancel()


def expect(p, prefix):
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"process ended before {prefix!r}")
        if line.startswith(prefix):
            return line.split()[1:]


def cmd(kind, mode, **flags):
    base = [PY, TORCH, mode] if kind == "pytorch" else [BIN, mode]
    return base + [f"--{k}={v}" for k, v in flags.items()]


def wait_listening(port, limit=30):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.001)
    raise RuntimeError(f"nothing listening on {port}")


def split(n, parts):
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def bench_init(n, server_kind, client_kind, procs, limit):
    port = free_port()
    job = Job(limit)
    try:
        clients = [job.spawn(cmd(client_kind, "init_clients", port=port, count=c,
                                 world_size=n))
                   for c in split(n - 1, procs) if c > 0]
        for c in clients:
            expect(c, "READY")
        server = job.spawn(cmd(server_kind, "server", port=port, world_size=n))
        expect(server, "STARTING")
        wait_listening(port)
        for c in clients:
            c.stdin.write("go\n")
            c.stdin.flush()
        return float(expect(server, "INIT_DONE")[0])
    except Exception as e:  # noqa: BLE001 - reported in the table
        return f"failed ({'timeout' if job.timed_out else e})"
    finally:
        job.finish()


def bench_relay_init(n, relays, max_per_proc, limit):
    """Init of n handles, n-1 of them through `relays` relays (Ferry only).

    Returns (server INIT_DONE seconds, seconds from the server's spawn until
    every client process printed JOINED, [(local, upstream, coalesced) per
    relay]) or an error string.
    """
    port = free_port()
    job = Job(limit)
    try:
        clients = []  # (relay index, process)
        for i, count in enumerate(split(n - 1, relays)):
            procs = max(1, -(-count // max_per_proc))
            clients += [(i, job.spawn(cmd("ferry", "init_clients", port=0,
                                          count=c, world_size=n)))
                        for c in split(count, procs) if c > 0]
        for _, c in clients:
            expect(c, "READY")
        t0 = time.time()
        server = job.spawn(cmd("ferry", "server", port=port, world_size=n))
        expect(server, "STARTING")
        wait_listening(port)
        # Relays bind port 0 (a port picked in advance may be taken by then:
        # the clients' connections use most of the ephemeral range).
        rs = [job.spawn(cmd("ferry", "relay", port=0, upstream_port=port))
              for _ in range(relays)]
        relay_ports = [int(expect(r, "RELAY")[0]) for r in rs]
        for i, c in clients:
            c.stdin.write(f"go {relay_ports[i]}\n")
            c.stdin.flush()
        init = float(expect(server, "INIT_DONE")[0])
        for _, c in clients:
            expect(c, "JOINED")
        joined = time.time() - t0
        stats = []
        for r in rs:
            r.stdin.close()
            stats.append(tuple(int(x) for x in expect(r, "RELAY_STATS")))
        return init, joined, stats
    except Exception as e:  # noqa: BLE001 - reported in the table
        return f"failed ({'timeout' if job.timed_out else e})"
    finally:
        job.finish()


def serve(job, kind, port):
    server = job.spawn(cmd(kind, "server", port=port, world_size=1))
    expect(server, "INIT_DONE")
    return server


def bench_barrier(n, kind, procs, rounds, limit):
    port = free_port()
    job = Job(limit)
    try:
        serve(job, kind, port)
        ps = [job.spawn(cmd(kind, "barrier", port=port, count=c, world_size=n,
                            rounds=rounds))
              for c in split(n, min(procs, n))]
        return max(float(expect(p, "BARRIER")[0]) for p in ps)
    except Exception as e:  # noqa: BLE001
        return f"failed ({'timeout' if job.timed_out else e})"
    finally:
        job.finish()


def bench_latency(kind, iters, limit):
    port = free_port()
    job = Job(limit)
    try:
        serve(job, kind, port)
        p = job.spawn(cmd(kind, "latency", port=port, iters=iters))
        return {op: float(expect(p, "LAT")[1]) for op in ("set", "get", "add")}
    finally:
        job.finish()


def cpu_ticks(pid):
    """(user, system) CPU time of process `pid` so far, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def bench_throughput(kind, clients, procs, seconds, limit, server_kind=None,
                     legacy=False):
    """Aggregate add ops/s of `kind` clients against a `server_kind` server
    (default: the same kind), and the server's (user, system) CPU seconds
    per op. Ferry's clients speak 1.13's protocol to PyTorch's server, and
    to Ferry's with `legacy`."""
    server_kind = server_kind or kind
    port = free_port()
    job = Job(limit)
    try:
        server = serve(job, server_kind, port)
        before = cpu_ticks(server.pid)
        extra = {"legacy_protocol": "true"} if (
            kind == "ferry" and (server_kind == "pytorch" or legacy)) else {}
        ps = [job.spawn(cmd(kind, "throughput", port=port, count=c,
                            seconds=seconds, **extra))
              for c in split(clients, min(procs, clients))]
        total, longest = 0, 0.0
        for p in ps:
            ops, secs = expect(p, "OPS")
            total += int(ops)
            longest = max(longest, float(secs))
        after = cpu_ticks(server.pid)
        hz = os.sysconf("SC_CLK_TCK")
        per_op = tuple((a - b) / hz / max(total, 1) for a, b in zip(after, before))
        return total / longest, per_op
    finally:
        job.finish()


def rtt(iters):
    """(same-process echo, echo in another process in epoll_wait) in us."""
    out = subprocess.run([BIN, "rtt", f"--iters={iters}"], capture_output=True,
                         text=True, check=True).stdout
    vals = dict(line.split() for line in out.splitlines())
    return float(vals["RTT"]), float(vals["RTT_EPOLL"])


def emit(record):
    print("JSON " + json.dumps(record), flush=True)


def fmt(v, unit=""):
    return f"{v:.4g}{unit}" if isinstance(v, float) else str(v)


def main():
    global BIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="store_bench binary")
    ap.add_argument("--init_sizes", default="1024,4096,8192")
    ap.add_argument("--ferry_only_sizes", default="16384",
                    help="init sizes run for Ferry alone (PyTorch 1.13 takes "
                         "minutes there and its clients need 2 sockets each)")
    ap.add_argument("--barrier_sizes", default="64,256,1024")
    ap.add_argument("--skip_init", action="store_true")
    ap.add_argument("--relay_sizes", default="",
                    help="init sizes run through relays (Ferry only), e.g. "
                         "98304; --relays relays, each client process under "
                         "--relay_clients_per_proc descriptors")
    ap.add_argument("--relays", type=int, default=12)
    ap.add_argument("--relay_clients_per_proc", type=int, default=16000)
    ap.add_argument("--skip_barrier", action="store_true")
    ap.add_argument("--skip_latency", action="store_true")
    ap.add_argument("--tp_clients", default="1,16,64,256")
    ap.add_argument("--server_tp_clients", default="16,64",
                    help="client counts for the servers-alone comparison (3c)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--latency_repeats", type=int, default=3)
    ap.add_argument("--tp_repeats", type=int, default=3)
    ap.add_argument("--limit", type=float, default=240, help="per-run limit (s)")
    ap.add_argument("--plot", default=os.path.join(HERE, "results", "init_time.png"))
    a = ap.parse_args()
    BIN = a.bin
    sizes = [int(x) for x in a.init_sizes.split(",") if x]
    print(f"# TCPStore benchmark: {os.cpu_count()} CPUs, loopback, "
          f"clients over {a.procs} processes", flush=True)
    print("# Ferry and the raw-TCP floor are timed in C++ (store_bench); "
          "PyTorch 1.13 from Python (torch_bench.py), as its users run it.",
          flush=True)

    # 1. init
    print("\n## 1. init: server start -> N joined, wait-for-workers done (s)")
    print(f"{'N':>6} {'ferry':>10} {'pytorch':>10} {'ferry srv+pt cli':>17} {'speedup':>8}")
    init = {}
    ferry_only = [int(x) for x in a.ferry_only_sizes.split(",") if x]
    for n in ([] if a.skip_init else sizes + ferry_only):
        f = bench_init(n, "ferry", "ferry", a.procs, a.limit)
        if n in ferry_only:
            x = p = "not run"
        else:
            x = bench_init(n, "ferry", "pytorch", a.procs, a.limit)
            p = bench_init(n, "pytorch", "pytorch", a.procs, a.limit)
        init[n] = (f, p, x)
        sp = p / f if isinstance(f, float) and isinstance(p, float) else "-"
        print(f"{n:>6} {fmt(f):>10} {fmt(p):>10} {fmt(x):>17} {fmt(sp):>8}", flush=True)
        for impl, v in (("ferry", f), ("pytorch", p), ("ferry_server_pytorch_clients", x)):
            if v == "not run":
                continue
            emit({"figure": "store_init_seconds", "impl": impl, "clients": n,
                  "value": v if isinstance(v, float) else None,
                  **({} if isinstance(v, float) else {"error": v})})

    # 1b. init through node relays
    relay_sizes = [int(x) for x in a.relay_sizes.split(",") if x]
    if relay_sizes:
        print(f"\n## 1b. init through {a.relays} relays: server start -> N "
              "joined (s)")
        print(f"{'N':>6} {'init':>8} {'all joined':>10} {'local reqs':>10} "
              f"{'upstream reqs':>13} {'coalesced':>9}")
    for n in relay_sizes:
        r = bench_relay_init(n, a.relays, a.relay_clients_per_proc, a.limit)
        if isinstance(r, str):
            print(f"{n:>6} {r}", flush=True)
            emit({"figure": "store_init_seconds", "impl": "ferry_relays",
                  "relays": a.relays, "clients": n, "value": None, "error": r})
            continue
        init_s, joined_s, stats = r
        local = sum(x[0] for x in stats)
        upstream = sum(x[1] for x in stats)
        coal = sum(x[2] for x in stats)
        print(f"{n:>6} {init_s:>8.3f} {joined_s:>10.3f} {local:>10} "
              f"{upstream:>13} {coal:>9}", flush=True)
        emit({"figure": "store_init_seconds", "impl": "ferry_relays",
              "relays": a.relays, "clients": n, "value": init_s,
              "all_joined_s": joined_s, "relay_local_requests": local,
              "relay_upstream_requests": upstream, "relay_coalesced": coal})

    # 2. barrier
    print("\n## 2. store_based_barrier: time per barrier (ms)")
    print(f"{'ranks':>6} {'ferry':>10} {'pytorch':>10} {'speedup':>8}")
    for n in ([] if a.skip_barrier else
              [int(x) for x in a.barrier_sizes.split(",") if x]):
        f = bench_barrier(n, "ferry", a.procs, a.rounds, a.limit)
        p = bench_barrier(n, "pytorch", a.procs, a.rounds, a.limit)
        fm = f * 1e3 if isinstance(f, float) else f
        pm = p * 1e3 if isinstance(p, float) else p
        sp = p / f if isinstance(f, float) and isinstance(p, float) else "-"
        print(f"{n:>6} {fmt(fm):>10} {fmt(pm):>10} {fmt(sp):>8}", flush=True)
        for impl, v in (("ferry", fm), ("pytorch", pm)):
            emit({"figure": "store_barrier_ms", "impl": impl, "ranks": n,
                  "value": v if isinstance(v, float) else None})

    # 3. latency and throughput
    print("\n## 3a. single-client latency, median (us)")
    # Interleaved repeats, best median of each: the 2 cores are shared, and
    # a burst of other load during one measurement would skew the ratio.
    runs = {"rtt": [], "rtt_epoll": [], "ferry": [], "pytorch": []}
    if a.skip_latency:
        print("skipped (--skip_latency)")
    else:
        for _ in range(a.latency_repeats):
            same, cross = rtt(a.iters)
            runs["rtt"].append(same)
            runs["rtt_epoll"].append(cross)
            runs["ferry"].append(bench_latency("ferry", a.iters, a.limit))
            runs["pytorch"].append(bench_latency("pytorch", a.iters, a.limit))
        r = min(runs["rtt"])
        re = min(runs["rtt_epoll"])
        fl = {op: min(x[op] for x in runs["ferry"]) for op in ("set", "get", "add")}
        pl = {op: min(x[op] for x in runs["pytorch"]) for op in ("set", "get", "add")}
        print(f"raw TCP round trip (C++, same run): {r:.1f} us "
              f"(best of {a.latency_repeats} interleaved runs, as are the ops)")
        print(f"raw TCP round trip to another process in epoll_wait: {re:.1f} us")
        print(f"{'op':>4} {'ferry':>8} {'pytorch':>8} {'ferry/rtt':>9} {'ferry/rtt_epoll':>15}")
        for op in ("set", "get", "add"):
            print(f"{op:>4} {fl[op]:>8.1f} {pl[op]:>8.1f} {fl[op] / r:>9.2f} "
                  f"{fl[op] / re:>15.2f}")
        emit({"figure": "raw_tcp_rtt_us", "value": r})
        emit({"figure": "raw_tcp_rtt_epoll_process_us", "value": re})
        for op in ("set", "get", "add"):
            emit({"figure": "store_latency_us", "op": op, "ferry": fl[op],
                  "pytorch": pl[op], "ferry_over_rtt": fl[op] / r,
                  "ferry_over_rtt_epoll": fl[op] / re})

    print(f"\n## 3b. aggregate add ops/s (best of {a.tp_repeats} interleaved runs)")
    print(f"{'clients':>7} {'ferry':>10} {'pytorch':>10} {'ratio':>6}")
    for c in [int(x) for x in a.tp_clients.split(",") if x]:
        # Interleaved repeats, best of each (shared 2-core machine).
        fs, ps_ = [], []
        for _ in range(a.tp_repeats):
            fs.append(bench_throughput("ferry", c, a.procs, a.seconds, a.limit)[0])
            ps_.append(bench_throughput("pytorch", c, a.procs, a.seconds, a.limit)[0])
        f, p = max(fs), max(ps_)
        print(f"{c:>7} {f:>10.0f} {p:>10.0f} {f / p:>6.2f}", flush=True)
        emit({"figure": "store_ops_per_s", "clients": c, "ferry": f, "pytorch": p})

    # The servers alone: the same C++ clients against each, and where the
    # server's time goes (user vs kernel, from /proc), per op.
    print(f"\n## 3c. servers side by side: Ferry's C++ clients speaking 1.13's "
          f"protocol to each server, add ops/s and server CPU per op in us "
          f"(best of {a.tp_repeats} interleaved runs)")
    print(f"{'clients':>7} {'ferry':>10} {'pytorch':>10} {'ratio':>6} "
          f"{'ferry usr/sys':>14} {'pytorch usr/sys':>16}")
    for c in [int(x) for x in a.server_tp_clients.split(",") if x]:
        fs, ps_ = [], []
        for _ in range(a.tp_repeats):
            # The same client and the same protocol (1.13's) against both.
            fs.append(bench_throughput("ferry", c, a.procs, a.seconds, a.limit,
                                       legacy=True))
            ps_.append(bench_throughput("ferry", c, a.procs, a.seconds, a.limit,
                                        server_kind="pytorch"))
        (f, fcpu), (p, pcpu) = max(fs), max(ps_)
        print(f"{c:>7} {f:>10.0f} {p:>10.0f} {f / p:>6.2f} "
              f"{fcpu[0] * 1e6:>6.1f}/{fcpu[1] * 1e6:<7.1f} "
              f"{pcpu[0] * 1e6:>7.1f}/{pcpu[1] * 1e6:<8.1f}", flush=True)
        emit({"figure": "store_server_ops_per_s", "clients": c, "ferry": f,
              "pytorch": p, "ferry_server_user_us": fcpu[0] * 1e6,
              "ferry_server_sys_us": fcpu[1] * 1e6,
              "pytorch_server_user_us": pcpu[0] * 1e6,
              "pytorch_server_sys_us": pcpu[1] * 1e6})

    # Plot.
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        os.makedirs(os.path.dirname(a.plot), exist_ok=True)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, log in zip(axes, (False, True)):
            for idx, label in ((0, "Ferry (libuv server, C++ clients)"),
                               (1, "PyTorch 1.13 TCPStore"),
                               (2, "Ferry server, PyTorch 1.13 clients")):
                pts = [(n, v[idx]) for n, v in sorted(init.items())
                       if isinstance(v[idx], float)]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-",
                            label=label)
            ax.set_xlabel("clients (N)")
            ax.set_ylabel("store initialization time (s)")
            if log:
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_title("log-log")
            else:
                ax.set_title("TCPStore initialization time vs clients")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print(f"\nplot: {a.plot}")
    except ImportError:
        print("\nplot skipped: matplotlib not installed")


if __name__ == "__main__":
    main()
