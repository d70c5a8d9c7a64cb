"""PyTorch side of the CUDA RPC benchmark (bench/rpc/cuda_rpc_bench.cc):
TensorPipe RPC with a device map, two processes sharing cuda:0.

    python3 bench/rpc/torch_cuda_rpc_bench.py [--sizes=4096,...] [--budget_s=0.3]

Runs on the GPU machine's own PyTorch 2.x (tools/gpu_check step rpc_bench).
Starts two processes of itself ("w0" rank 0, "w1" rank 1) meeting through a
TCPStore hosted by run_roles (bench/torch_procs.py). w0 maps its cuda:0 to
w1's cuda:0 (TensorPipeRpcBackendOptions.set_device_map; replies follow the
reverse map), so TensorPipe picks its CUDA channels (CUDA IPC between
processes of one host). Figures, named as cuda_rpc_bench's (JSON lines with
impl "pytorch", path "tensorpipe"): tensor_send (a float32 CUDA tensor of N
bytes to w1, which answers its element count: GB/s = N / round trip) and
tensor_echo (sent and returned onto cuda:0: GB/s = 2N / round trip), each a
median over calls timed until --budget_s passed (at least 3, at most 200),
each call ending with w0's stream synchronized. Exits 2 without CUDA.
PyTorch's distributed autograd does not take CUDA tensors over RPC, so there
is no counterpart of dist_autograd_step.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed.rpc as rpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from torch_procs import run_roles  # noqa: E402


def echo(t):
    return t


def sink(t):
    return t.numel()


def median_seconds(op, budget_s):
    op()  # Warm-up.
    times = []
    start = time.perf_counter()
    while len(times) < 200 and (len(times) < 3 or
                                time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def figure(name, n, seconds, moved):
    gbps = moved / seconds / 1e9
    print(f"pytorch  tensorpipe {name:<18} {n:>11} {seconds * 1e6:12.1f} us "
          f"{gbps:9.2f} GB/s")
    print(json.dumps(dict(bench="cuda_rpc", impl="pytorch",
                          version=torch.__version__, path="tensorpipe",
                          name=name, bytes=n, us_p50=round(seconds * 1e6, 2),
                          gbps=round(gbps, 4))), flush=True)


def run(a):
    rank = 0 if a.role == "w0" else 1
    torch.cuda.set_device(0)
    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=16, rpc_timeout=120,
        init_method=f"tcp://127.0.0.1:{a.port}", devices=[0])
    if rank == 0:
        opts.set_device_map("w1", {0: 0})
    rpc.init_rpc(a.role, rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        dev = torch.device("cuda", 0)
        stream = torch.cuda.current_stream(dev)
        for name in ("tensor_send", "tensor_echo"):
            for n in a.sizes:
                x = torch.arange(n // 4, dtype=torch.float32, device=dev)
                if name == "tensor_echo":
                    def op():
                        y = rpc.rpc_sync("w1", echo, args=(x,))
                        stream.synchronize()
                        assert y.device == dev and y.numel() == n // 4
                else:
                    def op():
                        got = rpc.rpc_sync("w1", sink, args=(x,))
                        stream.synchronize()
                        assert got == n // 4
                s = median_seconds(op, a.budget_s)
                figure(name, n, s, 2 * n if name == "tensor_echo" else n)
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes",
                    default="4096,65536,1048576,16777216,67108864,268435456")
    ap.add_argument("--budget_s", type=float, default=0.3)
    ap.add_argument("--role", default="")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    a.sizes = [int(s) for s in a.sizes.split(",") if s]
    if any(n < 4 or n % 4 for n in a.sizes) or a.budget_s <= 0:
        print("torch_cuda_rpc_bench: sizes must be positive multiples of 4 "
              "and --budget_s > 0", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_cuda_rpc_bench: CUDA is not available to torch "
              f"{torch.__version__}", file=sys.stderr)
        return 2
    if a.role:
        run(a)
        return 0
    print(f"{'impl':<8} {'path':<10} {'figure':<18} {'bytes':>11} "
          f"{'median':>15} {'rate':>14}", flush=True)
    return run_roles(__file__, ["w0", "w1"], limit_s=300)


if __name__ == "__main__":
    sys.exit(main())
