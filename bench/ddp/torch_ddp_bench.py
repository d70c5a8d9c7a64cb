"""PyTorch 1.13 side of bench/ddp: same model, timing and JSON conventions
as ddp_bench.cc (see there). DDP ranks are processes (torch.multiprocessing)
meeting over a TCPStore on a free port; backend Gloo, default buckets.
--device=cuda: the model and batch on cuda:(rank mod GPUs), backend NCCL,
ranks sharing a GPU with their own NCCL_HOSTID (as Ferry's side), each timed
loop ending with torch.cuda.synchronize(); "impl" names this torch's
version."""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel


def build(spec):
    widths = [int(w) for w in spec.split("-")]
    layers = []
    for i in range(len(widths) - 1):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
    return torch.nn.Sequential(*layers), widths


def run(rank, a, world, port):
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model, widths = build(a.mlp)
    params = sum(p.numel() for p in model.parameters())
    cuda = a.device == "cuda"
    dev = torch.device("cpu")
    if cuda:
        gpus = torch.cuda.device_count()
        dev = torch.device("cuda", rank % gpus)
        torch.cuda.set_device(dev)
        if rank >= gpus:  # Shares a GPU: NCCL needs a host id of its own.
            os.environ["NCCL_HOSTID"] = f"torch-local-rank-{rank}"
        model = model.to(dev)
    wire = [0]
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        model = DistributedDataParallel(
            model, gradient_as_bucket_view=True,
            device_ids=[dev.index] if cuda else None)
        inner = (default_hooks.fp16_compress_hook if a.fp16
                 else default_hooks.allreduce_hook)

        def counting(state, bucket):
            wire[0] += bucket.buffer().numel() * (2 if a.fp16 else 4)
            return inner(state, bucket)
        model.register_comm_hook(None, counting)
    torch.manual_seed(1 + rank)
    x = torch.randn(a.batch, widths[0]).to(dev)
    y = ((torch.arange(a.batch) + rank) % widths[-1]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    for _ in range(max(2, a.iters // 5)):
        step()
    sync()
    wire[0] = 0
    best = float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.iters):
            step()
        sync()
        best = min(best, (time.perf_counter() - t0) / a.iters)
    if rank == 0:
        print(json.dumps({
            "bench": "ddp",
            "impl": "pytorch-1.13" if not cuda else "pytorch-" + torch.__version__,
            "mode": "ddp" if world > 1 else "single", "world": world,
            "mlp": a.mlp, "params": params, "batch": a.batch,
            "device": a.device,
            "fp16": a.fp16, "optimizer_in_backward": False,
            "threads": a.threads, "time_us": round(best * 1e6, 1),
            "allreduce_bytes": wire[0] // (a.iters * a.repeats)}), flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="single")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mlp", default="1024-1024-1024-10")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_ddp_bench: no CUDA device visible to torch")
        return
    if a.mode == "single":
        run(0, a, 1, 0)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(a, a.world, port), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
