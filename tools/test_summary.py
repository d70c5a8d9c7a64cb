#!/usr/bin/env python3
"""Counts test cases from a `bazel test` log and its test.xml files.

Usage: test_summary.py BAZEL_LOG TESTLOGS_DIR

Every test target Bazel reported is counted by its GoogleTest cases (from its
test.xml). One failure each, on top of failing cases, for: a target that
failed without a failing case in its XML (crash, timeout, build failure); a
FLAKY target (it failed at least once; its passing retry is not counted); a
target whose XML holds no test case at all; and a build that did not
complete (e.g. a non-test target failed to build), named by its ERROR lines.
A target Bazel skipped as incompatible counts as one skip. Lists failures
and skips (by name, with the reason), then ends with the line
"N passed, N failed, N skipped". Exits 1 if anything failed or nothing ran.
"""
import os
import re
import sys
import glob
import xml.etree.ElementTree as ET

STATUS_RE = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|FLAKY|TIMEOUT|"
    r"NO STATUS|SKIPPED|INCOMPLETE|REMOTE FAILURE|BUILD FAILURE)\b")
BUILD_INCOMPLETE = "Build did NOT complete successfully"
ERROR_RE = re.compile(r"^ERROR: (.*)$")


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.failures = []  # "what (why)"
        self.skips = []

    def fail(self, what):
        self.failed += 1
        self.failures.append(what)

    def skip(self, what):
        self.skipped += 1
        self.skips.append(what)


def skip_reason(case):
    """The message GoogleTest wrote for a skipped case, or ''."""
    el = case.find("skipped")
    text = ""
    if el is not None:
        text = el.get("message") or (el.text or "")
    # GoogleTest prefixes the message with "file:line\n".
    lines = [l for l in text.strip().splitlines() if l.strip()]
    if lines and re.match(r"^\S+:\d+$", lines[0]):
        if len(lines) == 1:
            return "no reason given, at %s" % lines[0]
        lines = lines[1:]
    return " ".join(lines)


def count_xml(path, target, tally):
    """Adds one test.xml's cases to `tally`; returns the number of cases and
    failing cases, or None if the XML is missing or unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = failing = 0
    for case in root.iter("testcase"):
        cases += 1
        name = "%s %s.%s" % (target, case.get("classname", "?"),
                             case.get("name", "?"))
        if case.find("failure") is not None or case.find("error") is not None:
            failing += 1
            tally.fail(name)
        elif (case.get("result") == "skipped" or case.get("status") == "notrun"
              or case.find("skipped") is not None):
            reason = skip_reason(case)
            tally.skip("%s (%s)" % (name, reason or "no reason given"))
        else:
            tally.passed += 1
    return cases, failing


def xml_paths(testlogs, target):
    """The target's test.xml files: one per shard (shard_K_of_N/test.xml,
    all N of them, present or not) when it is sharded, else its one."""
    pkg, _, name = target[2:].partition(":")
    base = os.path.join(testlogs, pkg, name)
    shards = glob.glob(os.path.join(base, "shard_*_of_*"))
    if not shards:
        return [os.path.join(base, "test.xml")]
    total = int(shards[0].rsplit("_of_", 1)[1])
    return [os.path.join(base, "shard_%d_of_%d" % (k, total), "test.xml")
            for k in range(1, total + 1)]


def count_xmls(paths, target, tally):
    """count_xml summed over `paths`; None if any of them is unreadable."""
    cases = failing = 0
    for path in paths:
        counts = count_xml(path, target, tally)
        if counts is None:
            return None
        cases += counts[0]
        failing += counts[1]
    return cases, failing


def count_target(target, status, testlogs, tally):
    if status == "SKIPPED":
        tally.skip("%s (incompatible with this machine: target_compatible_with)"
                   % target)
        return
    if status == "FLAKY":
        tally.fail("%s (FLAKY: failed, then passed on a retry)" % target)
        return
    counts = None
    if status not in ("FAILED TO BUILD", "NO STATUS"):
        counts = count_xmls(xml_paths(testlogs, target), target, tally)
    if counts is None:
        if status == "PASSED":
            tally.fail("%s (passed but wrote no readable test.xml)" % target)
        else:
            tally.fail("%s (%s)" % (target, status))
        return
    cases, failing = counts
    if cases == 0:
        tally.fail("%s (%s with no test cases in its test.xml)" %
                   (target, status))
    elif status != "PASSED" and failing == 0:
        tally.fail("%s (%s)" % (target, status))


def main():
    log_path, testlogs = sys.argv[1], sys.argv[2]
    statuses = {}
    errors = []
    incomplete = False
    with open(log_path, errors="replace") as f:
        for line in f:
            line = line.strip()
            m = STATUS_RE.match(line)
            if m:
                statuses[m.group(1)] = m.group(2)
            e = ERROR_RE.match(line)
            if e:
                errors.append(e.group(1))
            if BUILD_INCOMPLETE in line:
                incomplete = True
    tally = Tally()
    for target, status in sorted(statuses.items()):
        count_target(target, status, testlogs, tally)
    if incomplete:
        why = "; ".join(errors[:5]) or "see the log above"
        tally.fail("build did not complete (%s)" % why)
    print()
    print("Test targets: %d" % len(statuses))
    for what in tally.failures:
        print("FAILED: " + what)
    for what in tally.skips:
        print("SKIPPED: " + what)
    print("%d passed, %d failed, %d skipped" %
          (tally.passed, tally.failed, tally.skipped))
    return 1 if tally.failed or not statuses else 0


if __name__ == "__main__":
    sys.exit(main())
