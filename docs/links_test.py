#!/usr/bin/env python3
"""Every relative link in README.md, docs/**/*.md and bench/README.md names a
file or folder of the repository.

The markdown files come from the test's runfiles; a link's target is looked up
in the source tree they are linked from (runfiles are symlinks into it), so a
target needs no `data` entry. Anchors (#...) are not checked.
"""
import os
import pathlib
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def links(text):
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        # Inline code spans are not links.
        line = re.sub(r"`[^`]*`", "", line)
        for target in LINK.findall(line):
            yield number, target


def main():
    runfiles = pathlib.Path(os.environ.get("TEST_SRCDIR", ".")) / os.environ.get(
        "TEST_WORKSPACE", "ferry")
    readme = runfiles / "README.md"
    if not readme.exists():
        print(f"FAIL: {readme} not in runfiles")
        return 1
    root = pathlib.Path(os.path.realpath(readme)).parent
    files = [readme, runfiles / "bench" / "README.md"]
    files += sorted((runfiles / "docs").rglob("*.md"))
    bad = 0
    checked = 0
    for md in files:
        rel = md.relative_to(runfiles)
        for number, target in links(md.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http:, https:, mailto: ...; anchors in the same file
            path = target.split("#", 1)[0]
            if path.startswith("/"):
                resolved = root / path.lstrip("/")
            else:
                resolved = (root / rel.parent / path)
            checked += 1
            resolved = pathlib.Path(os.path.normpath(resolved))
            if root not in resolved.parents and resolved != root:
                print(f"{rel}:{number}: {target} leaves the repository")
                bad += 1
            elif not resolved.exists():
                print(f"{rel}:{number}: {target} does not exist")
                bad += 1
    print(f"{checked} relative links in {len(files)} files, {bad} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
