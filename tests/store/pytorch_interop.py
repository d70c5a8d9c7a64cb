"""PyTorch 1.13 side of the TCPStore interop test (run by pytorch_interop_test).

  pytorch_interop.py client PORT   PyTorch client against a Ferry server
  pytorch_interop.py server        PyTorch server for a Ferry (legacy) client;
                                   prints "PORT <n>" once listening

Each mode exchanges keys with the Ferry side, checks what it reads, prints
"OK <what>" lines and exits 0, or raises (non-zero exit) on a mismatch.
"""
import datetime
import sys

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=30)


def expect(got, want, what):
    if got != want:
        raise SystemExit(f"MISMATCH {what}: got {got!r}, want {want!r}")
    print(f"OK {what}", flush=True)


def client(port):
    # world_size=2: the constructor adds 1 to "init/" (the join the Ferry
    # server handle waits for).
    s = dist.TCPStore("127.0.0.1", port, 2, False, TIMEOUT)
    s.set("py_key", "from_py")
    s.wait(["ferry_key"])
    expect(s.get("ferry_key"), b"from_ferry", "get ferry_key")
    expect(s.add("counter", 10), 11, "add after Ferry's add")
    expect(s.compare_set("cas", "old", "new"), b"new", "compare_set")
    expect(s.delete_key("gone"), True, "delete_key")
    s.set("py_done", "1")


def server():
    s = dist.TCPStore("127.0.0.1", 0, 2, True, TIMEOUT, wait_for_workers=False)
    print(f"PORT {s.port}", flush=True)
    s.set("py_key", "from_py")
    s.wait(["ferry_key"])
    expect(s.get("ferry_key"), b"from_ferry", "get ferry_key")
    expect(s.add("counter", 10), 11, "add after Ferry's add")
    expect(s.get("appended"), b"ab", "Ferry's emulated append")
    expect(s.compare_set("cas", "old", "new"), b"new", "compare_set")
    expect(s.delete_key("gone"), True, "delete_key")
    expect(s.num_keys() >= 5, True, "num_keys")
    s.set("py_done", "1")
    # Keep serving until the Ferry client says it has finished reading.
    s.wait(["ferry_done"])
    print("OK done", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(int(sys.argv[2]))
    else:
        server()
