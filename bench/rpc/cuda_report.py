"""Side-by-side table of the CUDA RPC benchmark's JSON lines.

    python3 bench/rpc/cuda_report.py FILE...

Reads every line starting with '{' whose "bench" is "cuda_rpc" (from
cuda_rpc_bench and torch_cuda_rpc_bench.py), prints one row per size with
the GB/s of each path and floor, then the ratios, one JSON line each:
  ipc_vs_pytorch     Ferry's IPC path / PyTorch's TensorPipe (send, echo)
  ipc_vs_d2d         Ferry's IPC send / the device-to-device copy, >= 64 MiB
  staged_vs_pinned   Ferry's staged send / the pinned-copy floor: one
                     device-to-host and one host-to-device copy in series,
                     1 / (1/d2h + 1/h2d) GB/s (what staging must do at least)
  streamed_vs_pinned the same for the staged path streamed over gRPC (the
                     path between hosts; pipelined both ways)
and the distributed autograd step's times (GPU tensors per path, CPU
tensors, one process on the GPU) with their ratios to the single-process
step.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from report_util import load, ratio as div  # noqa: E402


def size_label(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def fmt(v, spec=".2f", width=9):
    return "-".rjust(width) if v is None else format(v, spec).rjust(width)


LINES = []  # The JSON lines, printed after the tables.


def emit(name, n, value, **kw):
    if value is None:
        return
    LINES.append(json.dumps(dict(bench="cuda_rpc_ratio", name=name, bytes=n,
                                 ratio=round(value, 4), **kw)))


def main():
    fig = load(sys.argv[1:], "cuda_rpc",
               key=lambda r: (r["impl"], r["path"], r["name"], r["bytes"]))
    if not fig:
        print("cuda_report: no cuda_rpc lines", file=sys.stderr)
        return 1
    impl = "fake" if any(k[0] == "fake" for k in fig) else "ferry"

    def gbps(i, path, name, n):
        r = fig.get((i, path, name, n))
        return None if r is None else r["gbps"]

    sizes = sorted({k[3] for k in fig if k[2] in ("tensor_send", "d2d_copy")})
    cols = [("ipc send", (impl, "ipc", "tensor_send")),
            ("ipc echo", (impl, "ipc", "tensor_echo")),
            ("stg send", (impl, "staged", "tensor_send")),
            ("stg echo", (impl, "staged", "tensor_echo")),
            ("str send", (impl, "streamed", "tensor_send")),
            ("str echo", (impl, "streamed", "tensor_echo")),
            ("pt send", ("pytorch", "tensorpipe", "tensor_send")),
            ("pt echo", ("pytorch", "tensorpipe", "tensor_echo")),
            ("d2d", ("cuda", "floor", "d2d_copy")),
            ("h2d", ("cuda", "floor", "h2d_pinned")),
            ("d2h", ("cuda", "floor", "d2h_pinned"))]
    print(f"GB/s (send: N / round trip; echo: 2N / round trip; {impl})")
    print("size     " + "".join(c[0].rjust(9) for c in cols))
    for n in sizes:
        print(f"{size_label(n):<9}" +
              "".join(fmt(gbps(*c[1], n)) for c in cols))
    print()
    print("ratios        ipc/pt send  ipc/pt echo  ipc/d2d  staged/pinned"
          "  streamed/pinned")
    for n in sizes:
        ipc_s = gbps(impl, "ipc", "tensor_send", n)
        ipc_e = gbps(impl, "ipc", "tensor_echo", n)
        r_pt_s = div(ipc_s, gbps("pytorch", "tensorpipe", "tensor_send", n))
        r_pt_e = div(ipc_e, gbps("pytorch", "tensorpipe", "tensor_echo", n))
        r_d2d = (div(ipc_s, gbps("cuda", "floor", "d2d_copy", n))
                 if n >= 64 << 20 else None)
        h2d = gbps("cuda", "floor", "h2d_pinned", n)
        d2h = gbps("cuda", "floor", "d2h_pinned", n)
        pinned = (1 / (1 / h2d + 1 / d2h)) if h2d and d2h else None
        r_st = div(gbps(impl, "staged", "tensor_send", n), pinned)
        r_str = div(gbps(impl, "streamed", "tensor_send", n), pinned)
        print(f"{size_label(n):<13}{fmt(r_pt_s, '.3f', 12)}"
              f"{fmt(r_pt_e, '.3f', 13)}{fmt(r_d2d, '.3f', 9)}"
              f"{fmt(r_st, '.3f', 15)}{fmt(r_str, '.3f', 17)}")
        emit("ipc_vs_pytorch_send", n, r_pt_s)
        emit("ipc_vs_pytorch_echo", n, r_pt_e)
        emit("ipc_vs_d2d", n, r_d2d)
        emit("staged_vs_pinned", n, r_st)
        emit("streamed_vs_pinned", n, r_str)
    steps = {k[1]: r["us_p50"] for k, r in fig.items()
             if k[0] == impl and k[2] in ("dist_autograd_step",
                                          "single_gpu_step")}
    if steps:
        print()
        single = steps.get("local")
        print("autograd step      median us   / single-process GPU step")
        for path, label in (("ipc", "dist, GPU (ipc)"),
                            ("staged", "dist, GPU (staged)"),
                            ("streamed", "dist, GPU (streamed)"),
                            ("cpu", "dist, CPU"), ("local", "one process, GPU")):
            us = steps.get(path)
            print(f"{label:<19}{fmt(us, '.1f', 10)}"
                  f"{fmt(div(us, single), '.2f', 12)}")
            if path != "local":
                emit("dist_step_vs_single_gpu", None, div(us, single),
                     path=path)
    print()
    print("\n".join(LINES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
