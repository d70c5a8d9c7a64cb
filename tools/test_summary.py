#!/usr/bin/env python3
"""Counts test cases from a `bazel test` log and its test.xml files.

Usage: test_summary.py BAZEL_LOG TESTLOGS_DIR

Every test target Bazel reported is counted by its GoogleTest cases (from its
test.xml). A target that failed without a failing case in its XML (crash,
timeout, build failure) counts as one failure; a target Bazel skipped as
incompatible counts as one skip. Prints a table of failures and ends with
"N passed, N failed, N skipped". Exits 1 if anything failed or nothing ran.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS_RE = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|FLAKY|TIMEOUT|"
    r"NO STATUS|SKIPPED|INCOMPLETE|REMOTE FAILURE|BUILD FAILURE)\b")


def count_xml(path):
    """Returns (passed, failed, skipped, failed_names) for one test.xml."""
    passed = failed = skipped = 0
    names = []
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        name = "%s.%s" % (case.get("classname", "?"), case.get("name", "?"))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            names.append(name)
        elif (case.get("result") == "skipped" or case.get("status") == "notrun"
              or case.find("skipped") is not None):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, names


def main():
    log_path, testlogs = sys.argv[1], sys.argv[2]
    statuses = {}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = STATUS_RE.match(line.strip())
            if m:
                statuses[m.group(1)] = m.group(2)
    passed = failed = skipped = 0
    bad = []
    for target, status in sorted(statuses.items()):
        if status == "SKIPPED":
            skipped += 1
            continue
        pkg, _, name = target[2:].partition(":")
        xml = os.path.join(testlogs, pkg, name, "test.xml")
        counts = count_xml(xml) if status not in ("FAILED TO BUILD", "NO STATUS") else None
        target_failed = status not in ("PASSED", "FLAKY")
        if counts is None:
            if target_failed:
                failed += 1
                bad.append("%s (%s)" % (target, status))
            else:
                passed += 1
            continue
        p, fl, s, names = counts
        passed, skipped = passed + p, skipped + s
        failed += fl
        bad.extend("%s %s" % (target, n) for n in names)
        if target_failed and fl == 0:
            failed += 1
            bad.append("%s (%s)" % (target, status))
    print()
    print("Test targets: %d" % len(statuses))
    for b in bad:
        print("FAILED: " + b)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed or not statuses else 0


if __name__ == "__main__":
    sys.exit(main())
