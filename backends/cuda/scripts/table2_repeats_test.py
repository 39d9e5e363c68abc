#!/usr/bin/env python3
"""Tests of table2_repeats.py: Table 2 read as layer_bench prints it, mean/spread, bad input."""
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table2_repeats.py")

SUMMARY = """# layer_bench: device; command: x

Table 2, measured (steps 2..3, 4 micro-batches each):

| packer | FLOP model | measured fwd | measured fwd+bwd |
|---|---|---|---|
| wlb | 1.030 | 1.050 | {wlb} |
| wlb-lookahead@h100-flash-llama2-7b-tp8 | 1.040 | 1.040 | {cal} |

Fitted to single-document forward times: | not | a | row |
"""


class Table2RepeatsTest(unittest.TestCase):
    def run_script(self, runs, *extra):
        with tempfile.TemporaryDirectory() as d:
            dirs = []
            for i, text in enumerate(runs):
                run = pathlib.Path(d) / f"r{i + 1}"
                run.mkdir()
                (run / "summary.md").write_text(text)
                dirs.append(str(run))
            return subprocess.run([sys.executable, SCRIPT, *dirs, *extra],
                                  capture_output=True, text=True)

    def test_mean_spread_and_pair(self):
        r = self.run_script([SUMMARY.format(wlb="1.060", cal="1.040"),
                             SUMMARY.format(wlb="1.080", cal="1.090"),
                             SUMMARY.format(wlb="1.070", cal="1.050")],
                            "--pair", "wlb=wlb-lookahead@h100-flash-llama2-7b-tp8")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| wlb | 1.030 ± 0.000 (1.030 / 1.030 / 1.030) |", r.stdout)
        self.assertIn("1.070 ± 0.020 (1.060 / 1.080 / 1.070)", r.stdout)
        self.assertIn("mean -0.0100, per run -0.0200 / +0.0100 / -0.0200", r.stdout)
        self.assertIn("below wlb in 2 of 3 runs", r.stdout)

    def test_missing_table_and_mismatched_packers_and_bad_pair(self):
        r = self.run_script(["no table here\n"])
        self.assertEqual(r.returncode, 1)
        self.assertIn("no Table 2", r.stderr)
        other = SUMMARY.format(wlb="1.0", cal="1.0").replace("| wlb |", "| original |")
        r = self.run_script([SUMMARY.format(wlb="1.0", cal="1.0"), other])
        self.assertEqual(r.returncode, 1)
        self.assertIn("has packers", r.stderr)
        r = self.run_script([SUMMARY.format(wlb="1.0", cal="1.0")], "--pair", "wlb=nope")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--pair 'wlb=nope'", r.stderr)
        self.assertEqual(r.stdout, "")
        r = self.run_script([SUMMARY.format(wlb="x", cal="1.0")])
        self.assertEqual(r.returncode, 1)
        self.assertIn("table2_repeats.py:", r.stderr)


if __name__ == "__main__":
    unittest.main()
