#!/usr/bin/env python3
"""Tests of kernel_resources.py's ptxas log parsing, table and no-spill check (no compiler run)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_resources  # noqa: E402

# ptxas -v as nvcc 13.0 prints it (names shortened by hand to valid mangled ones).
LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z7SpillerILi128EEvv' for 'sm_90'
ptxas info    : Function properties for _Z7SpillerILi128EEvv
    144 bytes stack frame, 144 bytes spill stores, 148 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 144 bytes cumulative stack size
ptxas info    : Compile time = 214.169 ms
ptxas info    : Compiling entry function '_Z7SpillerILi64EEvv' for 'sm_90'
ptxas info    : Function properties for _Z7SpillerILi64EEvv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 244 registers, used 1 barriers
ptxas info    : Compile time = 110.287 ms
ptxas info    : Function properties for __internal_accurate_pow
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z4PowsPf' for 'sm_90'
ptxas info    : Function properties for _Z4PowsPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers, 8 bytes cumulative stack size
"""


class KernelResourcesTest(unittest.TestCase):
    def test_parse_reads_every_kernel_in_order_and_skips_device_functions(self):
        self.assertEqual(kernel_resources.parse(LOG),
                         [("_Z7SpillerILi128EEvv", 255, 144, 144, 148),
                          ("_Z7SpillerILi64EEvv", 244, 0, 0, 0),
                          ("_Z4PowsPf", 30, 0, 0, 0)])

    def test_incomplete_record_is_an_error(self):
        cut = LOG.split("ptxas info    : Used 244")[0]
        with self.assertRaisesRegex(ValueError, "no register count for _Z7SpillerILi64EEvv"):
            kernel_resources.parse(cut)
        no_frame = LOG.replace("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n",
                               "")
        with self.assertRaisesRegex(ValueError, "no stack frame line for _Z7SpillerILi64EEvv"):
            kernel_resources.parse(no_frame)

    def test_table_has_one_row_per_kernel(self):
        rows = kernel_resources.table(kernel_resources.parse(LOG)).splitlines()
        self.assertEqual(len(rows), 5)
        self.assertTrue(rows[2].endswith("| 255 | 144 | 144 | 148 |"), rows[2])

    def run_check(self, pattern):
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(LOG)
        try:
            return kernel_resources.main(["--log", f.name, "--no-spill", pattern])
        finally:
            os.unlink(f.name)

    def test_no_spill_check(self):
        self.assertEqual(self.run_check("ILi64E"), 0)  # the mangled name matches too
        self.assertEqual(self.run_check("ILi128E"), 1)  # spills
        self.assertEqual(self.run_check("Spiller"), 1)  # one of two spills
        self.assertEqual(self.run_check("NoSuchKernel"), 1)  # nothing matched: not a pass


if __name__ == "__main__":
    unittest.main()
