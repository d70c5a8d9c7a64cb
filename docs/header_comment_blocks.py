#!/usr/bin/env python3
"""Lists Ferry's headers by the length of the comment block at their top.

The block is the run of `//` lines from the first line of the file (blank
lines inside it count). Usage: docs/header_comment_blocks.py [N]  (top N, 10)
"""
import pathlib
import sys


def top_block(path):
    n = 0
    for line in path.read_text(errors="replace").splitlines():
        s = line.strip()
        if s.startswith("//") or (s == "" and n > 0):
            n += 1
        else:
            break
    return n


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    rows = []
    for p in root.rglob("*.h"):
        rel = p.relative_to(root)
        if rel.parts[0].startswith("bazel-") or rel.parts[0] == "third_party":
            continue
        rows.append((top_block(p), str(rel)))
    rows.sort(reverse=True)
    for n, rel in rows[: int(sys.argv[1]) if len(sys.argv) > 1 else 10]:
        print(f"{n:4d}  {rel}")


if __name__ == "__main__":
    main()
