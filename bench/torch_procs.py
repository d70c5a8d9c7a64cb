"""Process plumbing shared by the PyTorch sides of the benchmarks.

A benchmark script runs itself once per role (rank); run_roles starts those
processes, meeting through tcp://127.0.0.1:<port> at a TCPStore that run_roles
hosts itself on port 0 (the ranks join it as clients, as under torchelastic's
agent store: no port is picked free and bound later, so none can be taken by
another process in between), and fails the run (stopping the others) when any
of them fails or the time limit passes.
"""

import datetime
import os
import subprocess
import sys
import time


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
    --role=R for each R of `roles`, P the port of a TCPStore hosted here
    for this run; returns 0 when all exit 0."""
    import torch.distributed as dist
    name = os.path.basename(script)
    store = dist.TCPStore("127.0.0.1", 0, None, True,
                          datetime.timedelta(seconds=limit_s),
                          wait_for_workers=False)
    base = [sys.executable, os.path.abspath(script)] + sys.argv[1:] + [
        f"--port={store.port}"]
    env = dict(os.environ, TORCHELASTIC_USE_AGENT_STORE="True",
               TORCHELASTIC_RESTART_COUNT="0")
    procs = [subprocess.Popen(base + [f"--role={r}"], env=env) for r in roles]
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
