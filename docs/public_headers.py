#!/usr/bin/env python3
"""Prints Ferry's public headers, one path a line, relative to the repository.

Public means reachable from the five umbrella headers at the repository's root
(ferry.h c10d.h ddp.h store.h testing.h) through `#include "ferry/..."` lines;
a header's public path is ferry/<folder>/<file>.h, its file <folder>/<file>.h
(Bazel's include_prefix). The umbrellas themselves are listed too.

Usage: docs/public_headers.py [ROOT]   (ROOT: the repository, by default the
folder above this file's own)
"""
import pathlib
import re
import sys

UMBRELLAS = ["ferry.h", "c10d.h", "ddp.h", "store.h", "testing.h"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"ferry/([^"]+)"', re.M)


def public_headers(root):
    """The headers reached from the umbrellas, sorted; raises FileNotFoundError
    naming a header that is included but absent under `root`."""
    seen = set()
    todo = list(UMBRELLAS)
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        path = root / rel
        if not path.is_file():
            raise FileNotFoundError("%s (included as ferry/%s)" % (path, rel))
        seen.add(rel)
        todo.extend(INCLUDE.findall(path.read_text(errors="replace")))
    return sorted(seen)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parent.parent)
    for rel in public_headers(root):
        print(rel)


if __name__ == "__main__":
    main()
