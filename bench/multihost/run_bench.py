"""Drives the network-shape benchmark: for each added round trip, builds two
hosts in network namespaces (tests/multihost/netns_hosts.sh, each host's
egress delayed rtt/2 by tc netem or link_emulator), runs net_bench (raw TCP
floor + Ferry) and torch_net_bench.py (PyTorch 1.13) with rank 0 on host 0
and rank 1 on host 1, removes the hosts, and prints the side-by-side table
(p50 per figure; ratios Ferry/PyTorch and Ferry/raw floor) plus one JSON
line per figure and per ratio. Needs root (network namespaces).

  /usr/bin/python3 bench/multihost/run_bench.py --bin=PATH --emulator=PATH
      [--rtts_us=0,500,5000] [--sizes=4096,262144,4194304] [--rpc_iters=200]
      [--shape=auto|netem|emulator] [--limit_s=300]

--shape=auto: a zero round trip is the plain veth link; a named shape puts
netem or the emulator on the link at every round trip, 0 included (its own
cost then shows in that row). p50 is the median of the timed iterations.
"""
import argparse
import json
import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HOSTS = os.path.join(ROOT, "tests", "multihost", "netns_hosts.sh")


_pending = {}


def read_line(proc, deadline):
    """One line of proc's stdout before `deadline` ("" at EOF/timeout)."""
    fd = proc.stdout.fileno()
    buf = _pending.get(fd, b"")
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    line, sep, rest = buf.partition(b"\n")
    _pending[fd] = rest
    return line.decode() if sep else ""


class Hosts:
    """Two namespaced hosts, held until close()."""

    def __init__(self, a, rtt_us):
        argv = ["bash", HOSTS, f"--shape={a.shape}",
                f"--emulator={a.emulator}", f"--seed={a.seed}"]
        if rtt_us:
            argv.append(f"--delay_us={rtt_us // 2}")
        argv.append("2")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.ns, self.addr, self.shape = [], [], "none"
        deadline = time.monotonic() + 60
        for _ in range(10):  # 2 hosts, switch, shape, ready.
            line = read_line(self.proc, deadline)
            f = line.split(" ")
            if line.startswith(("skip:", "error")) or not line:
                self.close()
                raise RuntimeError(f"netns_hosts.sh: {line or 'no answer'}")
            if f[0] == "host":
                self.ns.append(f[2])
                self.addr.append(f[3])
            elif f[0] == "shape":
                self.shape = f[1]
                print(f"== {line}", flush=True)
            elif f[0] == "ready":
                return
        self.close()
        raise RuntimeError("netns_hosts.sh: no 'ready'")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_pair(hosts, argv, limit_s):
    """argv + --rank=R on host R; returns rank 0's JSON records. Both are
    killed when either fails or `limit_s` passes."""
    procs = []
    # Both stacks told to use the host's link (Gloo would otherwise resolve
    # the host name, and Ferry's tcp:// c10d init would pick loopback).
    env = dict(os.environ, FERRY_SOCKET_IFNAME="eth0", FERRY_LOG_LEVEL="error",
               GLOO_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0")
    for rank in (1, 0):
        cmd = ["ip", "netns", "exec", hosts.ns[rank]] + argv + [
            f"--rank={rank}", f"--master_addr={hosts.addr[0]}"]
        procs.append(subprocess.Popen(
            cmd, env=env,
            stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL))
    peer, rank0 = procs
    records = []
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline and peer.poll() in (None, 0):
            line = read_line(rank0, min(deadline, time.monotonic() + 1))
            if line.startswith("{"):
                records.append(json.loads(line))
            elif line:
                print(line, flush=True)
            elif rank0.poll() is not None:
                break
        for p in procs:
            p.wait(timeout=max(1, min(10, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        print(f"!! {' '.join(argv[:2])}: exit codes "
              f"{[p.returncode for p in procs]}", file=sys.stderr, flush=True)
    return records


def summarize(records):
    fig = {(r["rtt_us"], r["name"], r["bytes"] if r["name"] == "allreduce"
            else 0, r["impl"]): r for r in records}
    keys = sorted({k[:3] for k in fig})
    print()
    print(f"{'rtt_us':>7} {'shape':<9} {'figure':<10} {'bytes':>9}  "
          f"{'raw-tcp':>10} {'ferry':>10} {'pytorch':>10}  "
          f"{'ferry/pt':>8} {'ferry/raw':>9}  (p50 us)")
    for rtt, name, nbytes in keys:
        get = lambda impl: fig.get((rtt, name, nbytes, impl))  # noqa: E731
        raw, fer, pt = get("raw-tcp"), get("ferry"), get("pytorch-1.13")
        p = lambda r: r["p50_us"] if r else None  # noqa: E731
        ratio = lambda x, y: x / y if x and y else None  # noqa: E731
        shape = next(r["shape"] for r in (raw, fer, pt) if r)
        r_pt, r_raw = ratio(p(fer), p(pt)), ratio(p(fer), p(raw))
        cell = lambda v, w, f: (format(v, f) if v is not None  # noqa: E731
                                else "-").rjust(w)
        print(f"{rtt:>7} {shape:<9} {name:<10} {nbytes or '-':>9}  "
              f"{cell(p(raw), 10, '.1f')} {cell(p(fer), 10, '.1f')} "
              f"{cell(p(pt), 10, '.1f')}  {cell(r_pt, 8, '.2f')} "
              f"{cell(r_raw, 9, '.2f')}")
        print(json.dumps(dict(bench="multihost-ratio", rtt_us=rtt,
                              shape=shape, name=name, bytes=nbytes,
                              ferry_over_pytorch=r_pt,
                              ferry_over_raw_tcp=r_raw)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="net_bench")
    ap.add_argument("--emulator", required=True, help="link_emulator")
    ap.add_argument("--rtts_us", default="0,500,5000")
    ap.add_argument("--sizes", default="4096,262144,4194304")
    ap.add_argument("--rpc_iters", type=int, default=200)
    ap.add_argument("--shape", default="auto")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no_torch", action="store_true")
    ap.add_argument("--limit_s", type=int, default=300)
    a = ap.parse_args()
    records = []
    for rtt in [int(s) for s in a.rtts_us.split(",") if s]:
        hosts = Hosts(a, rtt)
        try:
            print(f"== added rtt {rtt} us; load {os.getloadavg()}", flush=True)
            common = [f"--sizes={a.sizes}", f"--rpc_iters={a.rpc_iters}",
                      f"--rtt_us={rtt}", f"--shape={hosts.shape}"]
            records += run_pair(hosts, [a.bin, "--port=29600"] + common,
                                a.limit_s)
            if not a.no_torch:
                records += run_pair(
                    hosts, ["/usr/bin/python3",
                            os.path.join(HERE, "torch_net_bench.py"),
                            "--port=29700"] + common, a.limit_s)
        finally:
            hosts.close()
    for r in records:
        print(json.dumps(r))
    summarize(records)
    print(f"== load after: {os.getloadavg()}")
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
