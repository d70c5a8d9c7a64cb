#!/usr/bin/env python3
"""Lists Ferry's headers by the length of the comment block at their top.

The block is the run of `//` lines from the first line of the file (blank
lines inside it count).

Usage: docs/header_comment_blocks.py [N]        the top N (10) of the source
                                                tree's headers
       docs/header_comment_blocks.py --max M [ROOT]
                                                exits 1 listing each header
                                                under ROOT (default: the
                                                source tree) whose block is
                                                over M lines
The --max form is //tests/docs:header_comments_test (M = 30): a header's top
comment is its contract; the reasoning goes to docs/design/.
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


def headers(root):
    """Ferry's headers under `root`: not third_party/, Bazel's output trees,
    its include-prefix copies (_virtual_includes) or generated .pb.h files."""
    for p in root.rglob("*.h"):
        rel = p.relative_to(root)
        if (rel.parts[0].startswith("bazel-") or rel.parts[0] in
                ("third_party", "external") or "_virtual_includes" in
                rel.parts or p.name.endswith(".pb.h")):
            continue
        yield rel, p


def main():
    args = sys.argv[1:]
    if args and args[0] == "--max":
        limit = int(args[1])
        root = pathlib.Path(args[2]) if len(args) > 2 else \
            pathlib.Path(__file__).resolve().parent.parent
        rows = sorted((top_block(p), str(rel)) for rel, p in headers(root))
        if not rows:
            sys.exit("no headers under %s" % root)
        over = [(n, rel) for n, rel in rows if n > limit]
        for n, rel in over:
            print("%s:1: top comment block of %d lines (at most %d: keep the "
                  "contract, move the why to docs/design/)" % (rel, n, limit))
        print("%d headers; the largest top comment block: %d lines (%s)" %
              (len(rows), rows[-1][0], rows[-1][1]))
        return 1 if over else 0
    root = pathlib.Path(__file__).resolve().parent.parent
    rows = sorted(((top_block(p), str(rel)) for rel, p in headers(root)),
                  reverse=True)
    for n, rel in rows[: int(args[0]) if args else 10]:
        print(f"{n:4d}  {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
