"""PyTorch 1.13 side of the TCPStore benchmark; same subcommands and output
lines as store_bench (see store_bench.cc), driven by run_bench.py."""
import argparse
import datetime
import os
import resource
import statistics
import sys
import threading
import time

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=600)


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def out(line):
    print(line, flush=True)


def client(port, world):
    return dist.TCPStore("127.0.0.1", port, world if world > 0 else None, False, TIMEOUT)


def server(a):
    out("STARTING")
    start = time.perf_counter()
    s = dist.TCPStore("127.0.0.1", a.port, a.world_size, True, TIMEOUT,
                      wait_for_workers=True)
    out(f"INIT_DONE {time.perf_counter() - start:.6f}")
    sys.stdin.read()
    os._exit(0)  # skip thousands of TCPStore destructors


def init_clients(a):
    out("READY")
    sys.stdin.readline()
    start = time.perf_counter()
    clients = []
    for i in range(a.count):
        clients.append(client(a.port, a.world_size))
        if a.verbose and time.perf_counter() - start > 1 and i % 16 == 0:
            print(f"init_clients: {i} after {time.perf_counter() - start:.1f}s",
                  file=sys.stderr, flush=True)
    out(f"JOINED {time.perf_counter() - start:.3f}")
    sys.stdin.read()
    os._exit(0)  # skip thousands of TCPStore destructors


def barrier(a):
    slowest = [0.0]
    lock = threading.Lock()
    ready = threading.Barrier(a.count)

    def rank():
        s = client(a.port, a.world_size)
        ready.wait()

        def one(r):
            key = f"{a.key_prefix}barrier/{r}"
            if s.add(key, 1) == a.world_size:
                s.set(key + "/last", "1")
            s.wait([key + "/last"])

        one(-1)
        start = time.perf_counter()
        for r in range(a.rounds):
            one(r)
        took = time.perf_counter() - start
        with lock:
            slowest[0] = max(slowest[0], took)

    threads = [threading.Thread(target=rank) for _ in range(a.count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out(f"BARRIER {slowest[0] / a.rounds:.9f}")


def latency(a):
    s = client(a.port, 0)

    def timed(name, op):
        for i in range(a.iters // 10):
            op(i)
        t = []
        for i in range(a.iters):
            t0 = time.perf_counter()
            op(i)
            t.append((time.perf_counter() - t0) * 1e6)
        out(f"LAT {name} {statistics.median(t):.2f}")

    timed("set", lambda i: s.set("lat/k", str(i)))
    timed("get", lambda i: s.get("lat/k"))
    timed("add", lambda i: s.add("lat/n", 1))


def throughput(a):
    clients = [client(a.port, 0) for _ in range(a.count)]
    total = [0]
    lock = threading.Lock()
    go = threading.Barrier(a.count + 1)
    end = [0.0]

    def worker(i):
        key = f"tp/{i % 8}"
        go.wait()
        n = 0
        s = clients[i]
        while time.perf_counter() < end[0]:
            s.add(key, 1)
            n += 1
        with lock:
            total[0] += n

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.count)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    end[0] = t0 + a.seconds
    go.wait()
    for t in threads:
        t.join()
    out(f"OPS {total[0]} {time.perf_counter() - t0:.6f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--world_size", type=int, default=1)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=2)
    p.add_argument("--key_prefix", default="")
    p.add_argument("--verbose", type=int, default=0)
    a = p.parse_args()
    raise_fd_limit()
    {"server": server, "init_clients": init_clients, "barrier": barrier,
     "latency": latency, "throughput": throughput}[a.mode](a)


if __name__ == "__main__":
    main()
