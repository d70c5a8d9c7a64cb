"""PyTorch's MLP training step beside bench/cuda/mlp_step_bench.cc.

    python3 bench/cuda/torch_mlp_step.py [--dims=4096,4096,4096,10]
        [--batch=256] [--steps=30] [--dtype=fp32|bf16|fp16]

The same model (Linear-ReLU-...-Linear), cross-entropy, SGD with momentum
0.9, in `dtype` (model.to(dtype) and a 16-bit input: pure 16-bit training,
no autocast, as mlp_step_bench --dtype does), 5 warm-up steps, then the mean time of `steps` steps between
two torch.cuda.synchronize() calls. Prints one JSON line; exits 0 with a
note when no GPU is visible.
"""
import argparse
import json
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dims", default="4096,4096,4096,10")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--dtype", default="fp32",
                   choices=["fp32", "float32", "bf16", "bfloat16", "fp16",
                            "float16"])
    a = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("torch_mlp_step: no CUDA device visible to torch")
        return
    dims = [int(d) for d in a.dims.split(",")]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    dtype = {"fp32": torch.float32, "float32": torch.float32,
             "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16}[a.dtype]
    model = torch.nn.Sequential(*layers).cuda().to(dtype)
    x = torch.randn(a.batch, dims[0], device="cuda", dtype=dtype)
    y = torch.arange(a.batch, device="cuda") % dims[-1]
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        sgd.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        sgd.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps
    print(json.dumps({"impl": "pytorch-" + torch.__version__, "dims": a.dims,
                      "batch": a.batch, "dtype": str(dtype).split(".")[-1],
                      "ms_per_step": ms}))


if __name__ == "__main__":
    main()
