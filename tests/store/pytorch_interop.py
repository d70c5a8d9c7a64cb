"""PyTorch 1.13 side of the TCPStore interop test (run by pytorch_interop_test).

  pytorch_interop.py client PORT   PyTorch client against a Ferry server
  pytorch_interop.py server        PyTorch server for a Ferry (legacy) client;
                                   prints "PORT <n>" once listening
  pytorch_interop.py timed_waits PORT
                                   timed wait() in a loop against a Ferry
                                   server, then the abandoned keys appear:
                                   the client must stay in step

Each mode exchanges keys with the Ferry side, checks what it reads, prints
"OK <what>" lines and exits 0, or raises (non-zero exit) on a mismatch.
"""
import datetime
import sys
import time

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


def timed_waits(port):
    s = dist.TCPStore("127.0.0.1", port, 2, False, TIMEOUT)
    # How elastic rendezvous polls: short timed waits, each abandoned on the
    # same connection while the server still holds it.
    for i in range(5):
        start = time.monotonic()
        try:
            s.wait([f"late{i}"], datetime.timedelta(milliseconds=50))
        except RuntimeError:
            pass
        else:
            raise SystemExit(f"MISMATCH wait for absent late{i} returned")
        if time.monotonic() - start > 20:
            raise SystemExit("MISMATCH a 50 ms wait took over 20 s")
    print("OK timed waits", flush=True)
    expect(s.add("polls", 1), 1, "add after abandoned waits")
    s.set("py_polled", "1")
    # The Ferry side now sets every abandoned key, then "marker". A stale
    # reply for any abandoned wait would shift the responses read below.
    s.wait(["marker"])
    expect(s.get("marker"), b"m", "get after the abandoned keys appeared")
    expect(s.get("late4"), b"v", "get late4")
    expect(s.add("polls", 1), 2, "add in step")
    # init/, polls, py_polled, late0..late4, marker
    expect(s.num_keys(), 9, "num_keys in step")
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
    elif sys.argv[1] == "timed_waits":
        timed_waits(int(sys.argv[2]))
    else:
        server()
