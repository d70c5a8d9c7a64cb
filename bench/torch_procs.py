"""Process plumbing shared by the PyTorch sides of the benchmarks.

A benchmark script runs itself once per role (rank); run_roles starts those
processes, meeting through tcp://127.0.0.1:<free port>, and fails the run
(stopping the others) when any of them fails or the time limit passes.
"""

import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorpipe_options(transport, port, threads=16):
    """TensorPipe options: "default" lets it pick (shared memory on one
    host); "tcp" pins its TCP transport ("uv") and "basic" channel."""
    import torch.distributed.rpc as rpc
    kw = dict(num_worker_threads=threads, rpc_timeout=300,
              init_method=f"tcp://127.0.0.1:{port}")
    if transport == "tcp":
        kw.update(_transports=["uv"], _channels=["basic"])
    return rpc.TensorPipeRpcBackendOptions(**kw)


def run_roles(script, roles, limit_s=900):
    """Runs `script` with this process's arguments plus --port=P and
    --role=R for each R of `roles`; returns 0 when all exit 0."""
    name = os.path.basename(script)
    base = [sys.executable, os.path.abspath(script)] + sys.argv[1:] + [
        f"--port={free_port()}"]
    procs = [subprocess.Popen(base + [f"--role={r}"]) for r in roles]
    rc = 0
    deadline = time.monotonic() + limit_s
    try:
        while any(proc.poll() is None for proc in procs):
            if any(proc.poll() not in (None, 0) for proc in procs):
                rc = 1
                break
            if time.monotonic() > deadline:
                print(f"{name}: timed out", file=sys.stderr)
                rc = 1
                break
            time.sleep(0.1)
        if any(proc.returncode != 0 for proc in procs):
            rc = 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rc
