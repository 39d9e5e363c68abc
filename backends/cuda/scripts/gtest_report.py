#!/usr/bin/env python3
"""Per-test verdicts from GoogleTest console logs, for gpu_check.sh.

  gtest_report.py [--allow-skip 'Suite.Name=reason' ...] LABEL=LOG[=LIST] ...

LABEL is 'cpu' or 'gpu'; LIST, if given, is the binary's --gtest_list_tests output, so that tests
a timeout or a crash kept from starting are reported NOT RUN. Reads each log's [ RUN ] / [ OK ] / [ FAILED ] / [ SKIPPED ] lines, so
a log cut short by a timeout or a crash still gives a verdict for every test it started (a test
with RUN and no result is CRASHED/TIMEOUT). A skipped test fails the check unless --allow-skip
names it with a reason: on a GPU machine no test may skip silently (a GPU test that skips there
means the device, a library or NCCL was not found). Prints a Markdown table (test, verdict, ms,
skip reason or first failure line) and a totals line; exit status 1 if any test failed, crashed,
skipped without an allowed reason, or a log holds no test at all.
"""
import argparse
import re
import sys

RESULT = re.compile(r"^\[\s+(OK|FAILED|SKIPPED)\s+\] (\S+) \((\d+) ms\)")
RUN = re.compile(r"^\[ RUN      \] (\S+)")


def parse(path):
    """[(name, verdict, ms, note)] in run order."""
    tests, current, notes = [], None, []
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        return [(path, "NO LOG", 0, str(e))]
    for line in lines:
        m = RUN.match(line)
        if m:
            current, notes = m.group(1), []
            continue
        m = RESULT.match(line)
        if m and m.group(2) == current:
            verdict, name, ms = m.group(1), m.group(2), int(m.group(3))
            note = " / ".join(notes[:2])  # "file:line: Skipped|Failure" and its first line
            tests.append((name, verdict, ms, note[:140]))
            current = None
            continue
        if current is not None and line.strip() and len(notes) < 4:
            # The first lines after RUN carry the skip reason or the failure's location and text.
            if "Skipped" in line or "Failure" in line or "error" in line.lower() or notes:
                notes.append(line.strip())
    if current is not None:
        tests.append((current, "CRASHED/TIMEOUT", 0, " / ".join(notes[:2])[:140]))
    return tests


def listed(path):
    """Full names from --gtest_list_tests output ('Suite.' lines, then indented test names)."""
    names, suite = [], ""
    for line in open(path, errors="replace").read().splitlines():
        if not line.strip() or line.startswith("Running main"):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        else:
            names.append(suite + line.split("#")[0].strip())
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allow-skip", action="append", default=[],
                    help="Suite.Name=reason: a skip of this test with this reason is accepted")
    ap.add_argument("logs", nargs="+", help="LABEL=LOG[=LIST], LABEL cpu or gpu")
    a = ap.parse_args()
    allowed = dict(s.split("=", 1) for s in a.allow_skip)
    bad = 0
    counts = {}
    print("| label | test | verdict | ms | note |")
    print("|---|---|---|---|---|")
    for spec in a.logs:
        label, path, *list_path = spec.split("=")
        tests = parse(path)
        if list_path:
            seen = {t[0] for t in tests}
            tests += [(n, "NOT RUN", 0, "not reached") for n in listed(list_path[0])
                      if n not in seen]
        if not tests:
            tests = [(path, "NO TESTS", 0, "the log holds no test result")]
        for name, verdict, ms, note in tests:
            if verdict == "SKIPPED" and name in allowed:
                verdict, note = "SKIPPED (allowed)", allowed[name]
            elif verdict == "SKIPPED":
                verdict = "SKIPPED (not allowed)"
            if verdict not in ("OK", "SKIPPED (allowed)"):
                bad += 1
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"| {label} | {name} | {verdict} | {ms} | {note.replace('|', '/')} |")
    print("totals: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
