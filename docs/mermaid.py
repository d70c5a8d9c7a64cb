#!/usr/bin/env python3
"""The design notes' Mermaid diagrams: rendered to SVG, or checked.

  docs/mermaid.py render OUTDIR   writes each ```mermaid block of
                                  docs/design/*.md, with mmdc, to
                                  OUTDIR/diagrams/<note>-<n>.svg (n counts
                                  from 1 in the note)
  docs/mermaid.py check           checks each block's structure, without a
                                  browser (//docs:mermaid_test)

Rendering uses mermaid-cli (npm: @mermaid-js/mermaid-cli, whose `mmdc` drives
a headless Chromium). mmdc is looked for at $FERRY_MMDC, then
~/.cache/ferry-mermaid/node_modules/.bin/mmdc (where `tools/docs --diagrams`
says to install it), then on PATH; Chromium at $FERRY_CHROMIUM, then
/usr/bin/chromium (Debian: chromium).

The check reads the subset of Mermaid's sequence diagrams the notes use:
`sequenceDiagram` first, then `participant`/`actor` declarations, messages
(`X->>Y: text` and the other arrows), `Note left of|right of|over X[,Y]:
text`, and `loop`/`alt`/`else`/`opt`/`par`/`and`/`critical`/`break`/`rect`
blocks closed by `end`. It fails naming note:line for a line it cannot read,
a participant not declared (Mermaid would add it; here it is taken for a
typo), a message or note without text or with a ';' in it (Mermaid ends a
line at ';'), or an unbalanced block. It does not replace rendering: Mermaid's
own parser runs in mmdc.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(os.path.abspath(__file__)).parent.parent
DESIGN = ROOT / "docs" / "design"
CACHE = pathlib.Path.home() / ".cache" / "ferry-mermaid"
MERMAID_CLI = "@mermaid-js/mermaid-cli@11.17.0"

FENCE = re.compile(r"^\s*```\s*(\S*)")


def blocks(path):
    """The ```mermaid blocks of a markdown file: (first line number, lines)."""
    out = []
    current = None
    start = 0
    in_fence = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m and not in_fence:
            in_fence = True
            if m.group(1) == "mermaid":
                current, start = [], number + 1
            continue
        if m and in_fence:
            in_fence = False
            if current is not None:
                out.append((start, current))
                current = None
            continue
        if current is not None:
            current.append(line)
    if current is not None:
        out.append((start, current))  # an unclosed fence runs to the end
    return out


def design_blocks(design=DESIGN):
    """[(note path, index from 1, first line, lines)] over docs/design/*.md."""
    found = []
    for path in sorted(design.glob("*.md")):
        for index, (start, lines) in enumerate(blocks(path), 1):
            found.append((path, index, start, lines))
    return found


# --- check -----------------------------------------------------------------

NAME = r"[A-Za-z_][\w]*"
DECLARE = re.compile(r"^(participant|actor)\s+(%s)(?:\s+as\s+(.+))?$" % NAME)
ARROW = r"(?:->>|-->>|->|-->|-x|--x|-\)|--\))"
MESSAGE = re.compile(r"^(%s)\s*%s\s*[+-]?(%s)\s*:(.*)$" % (NAME, ARROW, NAME))
NOTE = re.compile(r"^[Nn]ote\s+(left of|right of|over)\s+(%s)"
                  r"(?:\s*,\s*(%s))?\s*:(.*)$" % (NAME, NAME))
OPEN = re.compile(r"^(loop|alt|opt|par|critical|break|rect)\b")
MIDDLE = re.compile(r"^(else|and|option)\b")
OTHER = re.compile(r"^(autonumber|activate\s+%s|deactivate\s+%s|%%%%.*)$"
                   % (NAME, NAME))
MIDDLE_OF = {"else": {"alt"}, "and": {"par"}, "option": {"critical"}}


def check_block(lines, where):
    """Problems in one block, each 'where(line): text'; where(i) names the
    i-th line (0-based) of the block."""
    problems = []
    body = [(i, line.strip()) for i, line in enumerate(lines)
            if line.strip()]
    if not body or body[0][1] != "sequenceDiagram":
        i = body[0][0] if body else 0
        return ["%s: the block does not start with sequenceDiagram" % where(i)]
    declared = set()
    stack = []
    for i, line in body[1:]:
        m = DECLARE.match(line)
        if m:
            declared.add(m.group(2))
            continue
        m = MESSAGE.match(line)
        if m:
            names, text = [m.group(1), m.group(2)], m.group(3)
            what = "message"
        else:
            m = NOTE.match(line)
            if m:
                names = [n for n in (m.group(2), m.group(3)) if n]
                text, what = m.group(4), "note"
            else:
                names = None
        if names is not None:
            for name in names:
                if name not in declared:
                    problems.append("%s: %s names %s, not declared as a "
                                    "participant" % (where(i), what, name))
            if not text.strip():
                problems.append("%s: %s without text" % (where(i), what))
            if ";" in text:
                # Mermaid ends a statement at ';': the rest is read as the
                # next line, and fails to parse.
                problems.append("%s: ';' in a %s's text (Mermaid ends the "
                                "line there)" % (where(i), what))
            continue
        m = OPEN.match(line)
        if m:
            stack.append((m.group(1), i))
            continue
        m = MIDDLE.match(line)
        if m:
            if not stack or stack[-1][0] not in MIDDLE_OF[m.group(1)]:
                problems.append("%s: %s outside %s" % (
                    where(i), m.group(1), "/".join(MIDDLE_OF[m.group(1)])))
            continue
        if line == "end":
            if not stack:
                problems.append("%s: end without a block to close" % where(i))
            else:
                stack.pop()
            continue
        if OTHER.match(line):
            continue
        problems.append("%s: not a line of a sequence diagram: %s" %
                        (where(i), line))
    for kind, i in stack:
        problems.append("%s: %s without end" % (where(i), kind))
    return problems


def check(design=DESIGN):
    problems = []
    for path, index, start, lines in design_blocks(design):
        rel = os.path.relpath(path, ROOT)
        problems += check_block(
            lines, lambda i, rel=rel, start=start: "%s:%d" % (rel, start + i))
    return problems


# --- render ----------------------------------------------------------------

def find_mmdc():
    for candidate in (os.environ.get("FERRY_MMDC"),
                      str(CACHE / "node_modules" / ".bin" / "mmdc"),
                      shutil.which("mmdc")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_chromium():
    for candidate in (os.environ.get("FERRY_CHROMIUM"), "/usr/bin/chromium",
                      shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


INSTALL = """\
the design notes' diagrams need mermaid-cli (npm) and Chromium (Debian):
  apt-get install -y chromium
  mkdir -p ~/.cache/ferry-mermaid && cd ~/.cache/ferry-mermaid && \\
    PUPPETEER_SKIP_DOWNLOAD=1 npm install --no-audit --no-fund %s
(or set FERRY_MMDC and FERRY_CHROMIUM to an mmdc and a Chromium elsewhere)""" \
    % MERMAID_CLI


def render(out_dir):
    mmdc, chromium = find_mmdc(), find_chromium()
    missing = [what for what, found in (("mmdc", mmdc), ("chromium", chromium))
               if not found]
    if missing:
        sys.exit("docs/mermaid.py: %s not found; %s" %
                 (" and ".join(missing), INSTALL))
    out = pathlib.Path(out_dir) / "diagrams"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="ferry-mermaid-"))
    try:
        # Chromium runs as whoever runs this; as root it needs --no-sandbox.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        config = scratch / "puppeteer.json"
        config.write_text(json.dumps({"executablePath": chromium,
                                      "args": args}))
        written = []
        for path, index, _, lines in design_blocks():
            source = scratch / ("%s-%d.mmd" % (path.stem, index))
            source.write_text("\n".join(lines) + "\n")
            svg = out / ("%s-%d.svg" % (path.stem, index))
            proc = subprocess.run(
                [mmdc, "--quiet", "-p", str(config), "-i", str(source),
                 "-o", str(svg)], capture_output=True, text=True)
            if proc.returncode != 0 or not svg.exists():
                sys.exit("mmdc failed on %s's diagram %d (exit %d):\n%s%s" % (
                    os.path.relpath(path, ROOT), index, proc.returncode,
                    proc.stdout, proc.stderr))
            written.append(svg)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for svg in written:
        print(os.path.relpath(svg, os.getcwd()))
    print("%d diagrams from docs/design/*.md" % len(written))


def main(argv):
    if len(argv) == 3 and argv[1] == "render":
        render(argv[2])
        return 0
    if len(argv) == 2 and argv[1] == "check":
        problems = check()
        for p in problems:
            print(p)
        if problems:
            return 1
        print("%d Mermaid blocks in docs/design/*.md read as sequence "
              "diagrams" % len(design_blocks()))
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
