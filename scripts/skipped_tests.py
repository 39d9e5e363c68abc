#!/usr/bin/env python3
"""Prints every GoogleTest test that skipped in the last ctest run of a build folder, with its
reason (GTEST_SKIP's message), so skips show in scripts/test.sh's normal output.

    scripts/skipped_tests.py build
"""
import pathlib
import re
import sys


def skipped(log_text):
    """(test, reason) pairs from ctest's LastTest.log, in order, without repeats."""
    found = {}
    reason = ""
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if re.search(r": Skipped$", line):
            reason = lines[i + 1].strip() if i + 1 < len(lines) else ""
            continue
        match = re.match(r"\[  SKIPPED \] (\S+\.\S+)( \(\d+ ms\))?$", line)
        if match and match.group(1) not in found:
            found[match.group(1)] = reason or "(no reason given)"
            reason = ""
    return list(found.items())


def main():
    build = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build")
    log = build / "Testing" / "Temporary" / "LastTest.log"
    if not log.exists():
        print(f"skipped tests: no ctest log at {log}")
        return 0
    pairs = skipped(log.read_text(errors="replace"))
    print(f"skipped tests in {build}: {len(pairs)}")
    for name, why in pairs:
        print(f"  SKIPPED {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
