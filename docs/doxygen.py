#!/usr/bin/env python3
"""Runs Doxygen over Ferry's public headers: the API reference, or its check.

  docs/doxygen.py html OUTDIR    writes the reference to OUTDIR/html
  docs/doxygen.py check          exits 1 listing each warning (file:line)
  docs/doxygen.py count          prints the number of undocumented
                                 declarations and of other warnings

The headers are those docs/public_headers.py lists. Each is passed through
docs/doxygen_filter.py (Ferry's `//` comments become Doxygen's `///`) into a
scratch tree laid out as users include them, ferry/<folder>/<file>.h, and
Doxygen runs there with docs/Doxyfile. Warnings name the repository's files.

`check` fails on every warning except the "is not documented" ones listed in
docs/doxygen_undocumented.txt (one `file: declaration` a line, no line
numbers, so edits elsewhere in a header do not move them): a declaration
added without a comment fails, and so does a listed one that has since been
documented (delete its line; `check --update` rewrites the list).
"""
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(os.path.abspath(__file__)).parent
sys.path.insert(0, str(HERE))
import doxygen_filter  # noqa: E402
import public_headers  # noqa: E402

ROOT = HERE.parent
BASELINE = HERE / "doxygen_undocumented.txt"
WARNING = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+): warning: (?P<text>.*)$")
UNDOCUMENTED = re.compile(r" is not documented\.$")


def run_doxygen(out_dir, html):
    """Runs Doxygen; returns its warnings as (file, line, text), file relative
    to the repository, sorted."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="ferry-doxygen-"))
    try:
        inputs = []
        try:
            headers = public_headers.public_headers(ROOT)
        except FileNotFoundError as e:
            sys.exit("a public header is missing: %s; in the test, add its "
                     "library to //tests/docs:library_headers" % e)
        for rel in headers:
            dest = scratch / "ferry" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            text = (ROOT / rel).read_text(errors="replace")
            lines = doxygen_filter.convert(text.split("\n"), "ferry/" + rel)
            dest.write_text("\n".join(lines))
            inputs.append(str(dest))
        config = (ROOT / "docs" / "Doxyfile").read_text()
        config += "\nINPUT = %s\n" % " ".join(inputs)
        config += "STRIP_FROM_PATH = %s\n" % scratch
        config += "STRIP_FROM_INC_PATH = %s\n" % scratch
        config += "OUTPUT_DIRECTORY = %s\n" % out_dir
        config += "GENERATE_HTML = %s\n" % ("YES" if html else "NO")
        if not html:
            config += "GENERATE_XML = YES\nXML_OUTPUT = xml\n"
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["doxygen", "-"], input=config, text=True,
                              capture_output=True, cwd=str(scratch))
        if proc.returncode != 0:
            sys.exit("doxygen failed (exit %d):\n%s" %
                     (proc.returncode, proc.stderr))
        warnings = []
        prefix = str(scratch / "ferry") + "/"
        for line in proc.stderr.splitlines():
            m = WARNING.match(line)
            if m:
                f = m.group("file").replace(prefix, "")
                warnings.append((f, int(m.group("line")),
                                 m.group("text").replace(prefix, "")))
            elif warnings and line.strip():
                # A warning's continuation lines.
                f, n, text = warnings[-1]
                warnings[-1] = (f, n, text + " " +
                                line.strip().replace(prefix, ""))
        return sorted(warnings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def key(warning):
    f, _, text = warning
    return "%s: %s" % (f, UNDOCUMENTED.sub("", text))


def read_baseline():
    if not BASELINE.is_file():
        return collections.Counter()
    return collections.Counter(
        l for l in BASELINE.read_text().splitlines()
        if l.strip() and not l.startswith("#"))


def check(warnings, update):
    undocumented = [w for w in warnings if UNDOCUMENTED.search(w[2])]
    others = [w for w in warnings if not UNDOCUMENTED.search(w[2])]
    found = collections.Counter(key(w) for w in undocumented)
    if update:
        header = ("# Public declarations Doxygen finds undocumented, written "
                  "by `docs/doxygen.py check --update`.\n# Debt to pay: "
                  "document one and delete its line. docs/reference.md.\n")
        BASELINE.write_text(header + "".join(
            "%s\n" % k for k in sorted(found.elements())))
    baseline = read_baseline()
    new = [w for w in undocumented
           if found[key(w)] > baseline.get(key(w), 0)]
    stale = sorted((baseline - found).elements())
    for f, n, text in others:
        print("%s:%d: warning: %s" % (f, n, text))
    for f, n, text in new:
        print("%s:%d: warning: %s (document it)" % (f, n, text))
    for k in stale:
        print("%s: documented now: delete its line from "
              "docs/doxygen_undocumented.txt" % k)
    print("%d warnings other than undocumented; %d undocumented public "
          "declarations (%d listed in docs/doxygen_undocumented.txt), "
          "%d new, %d listed but documented" %
          (len(others), len(undocumented), sum(baseline.values()), len(new),
           len(stale)))
    return 1 if others or new or stale else 0


def main():
    args = sys.argv[1:]
    if not args or args[0] not in ("html", "check", "count"):
        sys.exit(__doc__)
    if shutil.which("doxygen") is None:
        sys.exit("doxygen is not installed (Debian: apt-get install doxygen)")
    if args[0] == "html":
        if len(args) != 2:
            sys.exit(__doc__)
        warnings = run_doxygen(os.path.abspath(args[1]), html=True)
        print("%s/html/index.html (%d Doxygen warnings: docs/doxygen.py "
              "check lists them)" % (args[1], len(warnings)))
        return 0
    out = tempfile.mkdtemp(prefix="ferry-doxygen-out-")
    try:
        warnings = run_doxygen(out, html=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if args[0] == "count":
        n = sum(1 for w in warnings if UNDOCUMENTED.search(w[2]))
        print("%d undocumented public declarations, %d other warnings" %
              (n, len(warnings) - n))
        return 0
    return check(warnings, update="--update" in args)


if __name__ == "__main__":
    sys.exit(main())
