#!/usr/bin/env python3
"""Doxygen input filter: reads Ferry's `//` comments as documentation.

Ferry's headers document with plain `//` comments (no `///`). This filter
prints a header with, line for line (so Doxygen's file:line stay right):
- the comment block at the top of the file turned into the file's
  documentation (`///` lines, the last one ending in `\\file`);
- a block of `//` lines directly above a declaration or a `#define` (the
  next line is code, not blank, not another `#...`, not `}` nor an access
  label) turned into `///` lines, the declaration's documentation, except
  section banners (`// --- Shapes ---`);
- a trailing `// ...` after a declaration ending in `;` or `,` (a member, an
  enumerator) or after a one-line inline function (`f() { ... }`) turned
  into `///<` (unless it is a tool's marker: NOLINT, IWYU pragma,
  clang-format); the aligned `//` lines that continue it stay
  plain comments;
- in those blocks, a run of example lines (indented by three spaces or more
  after `//`) marked as a code block (`\\code` ... `\\endcode`, at the ends
  of lines);
- everything else as it was.

Used by docs/doxygen.py; alone: doxygen_filter.py FILE NAME (NAME: ferry/...)
"""
import re
import sys

COMMENT = re.compile(r"^(\s*)//(?![/!])(.*)$")
DECLARATION_END = re.compile(r"(?:[;,]|\).*\{.*\})$")


def split_trailing(line):
    """(code, gap, text) when `line` is code followed by a `// text` comment
    (the first `//` outside string and character literals), else None."""
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif line.startswith("//", i):
            code = line[:i].rstrip()
            if line[i:].startswith(("///", "//!")):
                return None
            return code, line[len(code):i], line[i + 2:]
        i += 1
    return None


def trailing(line):
    """split_trailing's parts when the code is a declaration ending in `;`
    or `,`, or a one-line inline function, and does not start with `}`."""
    parts = split_trailing(line)
    if parts is None:
        return None
    code = parts[0]
    if not code.strip() or code.lstrip().startswith(("}", "#")):
        return None
    return parts if DECLARATION_END.search(code) else None
# Section banners ("// --- Shapes ---"), not documentation.
BANNER = re.compile(r"^\s*-{3}.*$")
# Tool markers, not documentation.
LINT = re.compile(r"^\s*(NOLINT|IWYU pragma|clang-format)")
EXAMPLE = re.compile(r"^\s*///   ")
NOT_DOCUMENTED = re.compile(
    r"^\s*($|#(?!\s*define\b)|}|(public|private|protected)\s*:|//)")


def mark_code(out, start, end):
    """Runs of example lines (`//` and three or more spaces) in the block
    out[start:end] become \\code blocks, opened at the end of the line before
    and closed at the end of the run's last line."""
    k = start
    while k < end:
        if not EXAMPLE.match(out[k]):
            k += 1
            continue
        first = k
        while k < end and EXAMPLE.match(out[k]):
            k += 1
        if first > start:
            out[first - 1] += " \\code"
        else:
            out[first] = out[first].replace("///", "/// \\code", 1)
        out[k - 1] += " \\endcode"


def convert(lines, name):
    """`lines` of the header included as `name` (ferry/...), filtered."""
    out = list(lines)
    i = 0
    trailing_col = None  # column of the `//` after the last declaration
    while i < len(lines):
        m = COMMENT.match(lines[i])
        if not m:
            t = trailing(lines[i])
            if t and not LINT.match(t[2]):
                out[i] = "%s%s///<%s" % t
                trailing_col = len(t[0]) + len(t[1])
            else:
                trailing_col = None
            i += 1
            continue
        if trailing_col is not None and len(m.group(1)) == trailing_col:
            i += 1  # continues the trailing comment above: left as it is
            continue
        trailing_col = None
        start = i
        while i < len(lines) and COMMENT.match(lines[i]):
            i += 1
        following = lines[i] if i < len(lines) else ""
        top = start == 0
        if not top and NOT_DOCUMENTED.match(following):
            continue
        for k in range(start, i):
            c = COMMENT.match(lines[k])
            if not BANNER.match(c.group(2)):
                out[k] = "%s///%s" % (c.group(1), c.group(2))
        mark_code(out, start, i)
        if top:  # on its last line, so that no line is added
            out[i - 1] += " \\file " + name
    return out


def main():
    with open(sys.argv[1], errors="replace") as f:
        lines = f.read().split("\n")
    sys.stdout.write("\n".join(convert(lines, sys.argv[2])))


if __name__ == "__main__":
    main()
