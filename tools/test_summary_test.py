#!/usr/bin/env python3
"""Checks tools/test_summary.py against made-up Bazel logs and test.xml files."""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_summary  # noqa: E402

PASS_XML = """<testsuites><testsuite>
<testcase classname="A" name="one"/>
<testcase classname="A" name="two"/>
</testsuite></testsuites>"""
SKIP_XML = """<testsuites><testsuite>
<testcase classname="Py" name="interop" result="skipped">
<skipped message="x_test.cc:40&#10;PyTorch not importable"/></testcase>
<testcase classname="Py" name="other"/>
</testsuite></testsuites>"""
EMPTY_XML = "<testsuites><testsuite/></testsuites>"


class SummaryTest(unittest.TestCase):
    def run_summary(self, log, xmls):
        with tempfile.TemporaryDirectory() as d:
            for target, text in xmls.items():
                # "//a:t/shard_1_of_2" is one shard's file of //a:t.
                pkg, _, name = target[2:].partition(":")
                name, _, shard = name.partition("/")
                where = os.path.join(d, pkg, name, shard)
                os.makedirs(where, exist_ok=True)
                with open(os.path.join(where, "test.xml"), "w") as f:
                    f.write(text)
            log_path = os.path.join(d, "log")
            with open(log_path, "w") as f:
                f.write(log)
            sys.argv = ["test_summary.py", log_path, d]
            out = io.StringIO()
            with redirect_stdout(out):
                rc = test_summary.main()
        return rc, out.getvalue().strip().splitlines()

    def test_passing_cases_are_counted(self):
        rc, lines = self.run_summary("//a:t  PASSED in 1s\n", {"//a:t": PASS_XML})
        self.assertEqual(rc, 0)
        self.assertEqual(lines[-1], "2 passed, 0 failed, 0 skipped")

    def test_every_shard_is_counted(self):
        rc, lines = self.run_summary(
            "//a:t  PASSED in 1s\n",
            {"//a:t/shard_1_of_2": PASS_XML, "//a:t/shard_2_of_2": SKIP_XML})
        self.assertEqual(rc, 0)
        self.assertEqual(lines[-1], "3 passed, 0 failed, 1 skipped")

    def test_a_missing_shard_is_a_failure(self):
        rc, lines = self.run_summary(
            "//a:t  PASSED in 1s\n",
            {"//a:t/shard_1_of_3": PASS_XML, "//a:t/shard_3_of_3": PASS_XML})
        self.assertEqual(rc, 1)
        # Shard 1's cases count; shard 2's missing file fails the target.
        self.assertEqual(lines[-1], "2 passed, 1 failed, 0 skipped")
        self.assertIn("FAILED: //a:t (passed but wrote no readable test.xml)",
                      "\n".join(lines))

    def test_flaky_is_a_failure(self):
        rc, lines = self.run_summary("//a:t  FLAKY, failed in 1 out of 2\n",
                                     {"//a:t": PASS_XML})
        self.assertEqual(rc, 1)
        self.assertEqual(lines[-1], "0 passed, 1 failed, 0 skipped")
        self.assertIn("FLAKY", "\n".join(lines))

    def test_target_without_cases_is_reported(self):
        rc, lines = self.run_summary("//a:t  PASSED in 1s\n", {"//a:t": EMPTY_XML})
        self.assertEqual(rc, 1)
        self.assertEqual(lines[-1], "0 passed, 1 failed, 0 skipped")
        self.assertIn("FAILED: //a:t (PASSED with no test cases", "\n".join(lines))

    def test_skips_are_listed_with_reason_above_the_last_line(self):
        log = "//a:t  PASSED in 1s\n//b:gpu  SKIPPED\n"
        rc, lines = self.run_summary(log, {"//a:t": SKIP_XML})
        self.assertEqual(rc, 0)
        self.assertEqual(lines[-1], "1 passed, 0 failed, 2 skipped")
        self.assertIn("SKIPPED: //a:t Py.interop (PyTorch not importable)", lines)
        self.assertTrue(any(l.startswith("SKIPPED: //b:gpu (incompatible")
                            for l in lines))

    def test_failed_build_of_a_non_test_target_counts(self):
        log = ("ERROR: /w/x/BUILD:3:10: Compiling x/lib.cc failed: (Exit 1)\n"
               "//a:t  PASSED in 1s\n"
               "FAILED: Build did NOT complete successfully\n")
        rc, lines = self.run_summary(log, {"//a:t": PASS_XML})
        self.assertEqual(rc, 1)
        self.assertEqual(lines[-1], "2 passed, 1 failed, 0 skipped")
        self.assertIn("Compiling x/lib.cc failed", "\n".join(lines))

    def test_crash_without_failing_case_counts_once(self):
        rc, lines = self.run_summary("//a:t  FAILED in 1s\n", {"//a:t": PASS_XML})
        self.assertEqual(rc, 1)
        self.assertEqual(lines[-1], "2 passed, 1 failed, 0 skipped")


if __name__ == "__main__":
    unittest.main()
