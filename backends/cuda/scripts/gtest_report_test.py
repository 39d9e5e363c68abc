#!/usr/bin/env python3
"""Tests of gtest_report.py: every verdict from the log and the exit status together."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_report  # noqa: E402

PASSING = """[==========] Running 2 tests from 1 test suite.
[ RUN      ] A.One
[       OK ] A.One (3 ms)
[ RUN      ] A.Two
[       OK ] A.Two (4 ms)
[  PASSED  ] 2 tests.
"""

PARAM_FAIL = """[ RUN      ] Engines/LayerGpu.Matches/0
x.cc:12: Failure
Expected: err <= 0.01, actual 0.5
[  FAILED  ] Engines/LayerGpu.Matches/0, where GetParam() = 4-byte object <00-00 00-00> (12 ms)
[ RUN      ] Engines/LayerGpu.Matches/1
[       OK ] Engines/LayerGpu.Matches/1 (10 ms)
"""

PARAM_LIST = """Engines/LayerGpu.
  Matches/0  # GetParam() = 4-byte object <00-00 00-00>
  Matches/1  # GetParam() = 4-byte object <01-00 00-00>
"""

SKIPPED = """[ RUN      ] A.One
a.cc:5: Skipped
no usable CUDA device
[  SKIPPED ] A.One (0 ms)
"""


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text, rc=None):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        if rc is not None:
            with open(path + ".rc", "w") as f:
                f.write(f"{rc}\n")
        return path

    def verdicts(self, spec, allowed=None):
        return [(r[1], r[2]) for r in gtest_report.report(spec, allowed or {})]

    def test_passing_log_with_rc_zero_passes(self):
        log = self.write("t.log", PASSING, rc=0)
        self.assertEqual(self.verdicts(f"gpu={log}"), [("A.One", "OK"), ("A.Two", "OK")])

    def test_crash_after_last_ok_fails(self):
        log = self.write("t.log", PASSING, rc=139)
        self.assertIn(("t.log", "EXIT rc 139"), self.verdicts(f"gpu={log}"))

    def test_missing_exit_status_fails(self):
        log = self.write("t.log", PASSING)
        self.assertIn(("t.log", "NO EXIT STATUS"), self.verdicts(f"gpu={log}"))

    def test_failed_parameterized_test_is_failed_not_not_run(self):
        log = self.write("t.log", PARAM_FAIL, rc=1)
        lst = self.write("t.list", PARAM_LIST)
        v = self.verdicts(f"gpu={log}={lst}")
        self.assertEqual(v, [("Engines/LayerGpu.Matches/0", "FAILED"),
                             ("Engines/LayerGpu.Matches/1", "OK")])

    def test_listed_test_never_started_is_not_run(self):
        log = self.write("t.log", PARAM_FAIL.split("[ RUN      ] Engines/LayerGpu.Matches/1")[0],
                         rc=124)
        lst = self.write("t.list", PARAM_LIST)
        self.assertIn(("Engines/LayerGpu.Matches/1", "NOT RUN"),
                      self.verdicts(f"gpu={log}={lst}"))

    def test_cut_log_is_crashed(self):
        log = self.write("t.log", "[ RUN      ] A.One\nsome output\n", rc=124)
        self.assertEqual(self.verdicts(f"gpu={log}")[0], ("A.One", "CRASHED/TIMEOUT"))

    def test_skip_needs_an_allowance(self):
        log = self.write("t.log", SKIPPED, rc=0)
        self.assertEqual(self.verdicts(f"gpu={log}"), [("A.One", "SKIPPED (not allowed)")])
        self.assertEqual(self.verdicts(f"gpu={log}", {"A.One": "one GPU"}),
                         [("A.One", "SKIPPED (allowed)")])

    def test_empty_log_fails(self):
        log = self.write("t.log", "", rc=0)
        self.assertEqual(self.verdicts(f"gpu={log}")[0][1], "NO TESTS")

    def test_sanitizer_needs_a_zero_summary(self):
        clean = self.write("m.log", PASSING + "========= ERROR SUMMARY: 0 errors\n", rc=0)
        self.assertEqual(self.verdicts(f"sanitizer={clean}")[-1], ("m.log", "SANITIZER OK"))
        dirty = self.write("d.log", PASSING + "========= ERROR SUMMARY: 3 errors\n", rc=0)
        self.assertEqual(self.verdicts(f"sanitizer={dirty}")[-1], ("d.log", "SANITIZER FAILED"))
        races = self.write("r.log", PASSING + "========= RACECHECK SUMMARY: 2 hazards displayed "
                           "(2 errors, 0 warnings)\n", rc=0)
        self.assertEqual(self.verdicts(f"sanitizer={races}")[-1], ("r.log", "SANITIZER FAILED"))
        none = self.write("n.log", PASSING, rc=0)
        self.assertEqual(self.verdicts(f"sanitizer={none}")[-1], ("n.log", "SANITIZER FAILED"))

    def test_sanitizer_with_every_test_skipped_fails(self):
        log = self.write("s.log", SKIPPED + "========= ERROR SUMMARY: 0 errors\n", rc=0)
        self.assertIn(("A.One", "SKIPPED (not allowed)"), self.verdicts(f"sanitizer={log}"))

    def test_sanitizer_refusal_is_quoted(self):
        log = self.write("s.log", "========= Error: Device not supported\n", rc=1)
        rows = gtest_report.report(f"sanitizer={log}", {})
        self.assertEqual(rows[-1][2], "SANITIZER FAILED")
        self.assertIn("Device not supported", rows[-1][4])

    def test_command_line_exit_status(self):
        good = self.write("g.log", PASSING, rc=0)
        bad = self.write("b.log", PASSING, rc=6)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gtest_report.py")
        ok = subprocess.run([sys.executable, script, f"gpu={good}"], capture_output=True,
                            text=True)
        self.assertEqual(ok.returncode, 0, ok.stdout)
        self.assertTrue(ok.stdout.strip().splitlines()[-1].startswith("PASS"))
        fail = subprocess.run([sys.executable, script, f"gpu={good}", f"gpu={bad}"],
                              capture_output=True, text=True)
        self.assertEqual(fail.returncode, 1, fail.stdout)
        self.assertTrue(fail.stdout.strip().splitlines()[-1].startswith("FAIL"))


if __name__ == "__main__":
    unittest.main()
