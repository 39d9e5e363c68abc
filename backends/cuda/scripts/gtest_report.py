#!/usr/bin/env python3
"""Per-test verdicts from GoogleTest console logs and exit codes, for gpu_check.sh.

  gtest_report.py [--allow-skip 'Suite.Name=reason' ...] SPEC ...

SPEC is LABEL=LOG[=LIST], LABEL one of

  cpu, gpu    a test binary's console log;
  sanitizer   a compute-sanitizer run of a test binary (its log holds the tests' output and the
              sanitizer's summary line).

Every verdict comes from the log and the exit status together. The exit status is read from
LOG.rc (gpu_check.sh's run() writes it); a missing LOG.rc is a failure ("no exit status"), so is
a non-zero status when every test in the log passed (a crash after the last [ OK ]: "EXIT rc N").
LIST, if given, is the binary's --gtest_list_tests output (with the same --gtest_filter), so tests
that a timeout or a crash kept from starting are reported NOT RUN and a filter that matched
nothing is caught. [ RUN ] / [ OK ] / [ FAILED ] / [ SKIPPED ] lines are matched by name,
parameterised ones too ("Prefix/Suite.Name/0, where GetParam() = ..."); a test with RUN and no
result is CRASHED/TIMEOUT. A skipped test fails unless --allow-skip names it with a reason: on a
GPU machine no test may skip silently. For sanitizer logs the tool's summary must be present and
report zero errors ("ERROR SUMMARY: 0 errors" for memcheck, "RACECHECK SUMMARY: 0 hazards" for
racecheck); a refusal of the device (e.g. "Device not supported") is quoted.

Prints a Markdown table (label, test, verdict, ms, note) and a totals line; exit status 1 if
anything is not OK.
"""
import argparse
import os
import re
import sys

RESULT = re.compile(r"^\[\s+(OK|FAILED|SKIPPED)\s+\] (\S+?)(?:, where \S+ = .*)? \((\d+) ms\)")
RUN = re.compile(r"^\[ RUN      \] (\S+)")
SANITIZER_SUMMARY = re.compile(r"(ERROR SUMMARY|RACECHECK SUMMARY): (\d+) (errors?|hazards?)")
SANITIZER_REFUSAL = re.compile(r"Device not supported|Target application terminated|"
                               r"Error: .*|Internal Sanitizer Error.*", re.IGNORECASE)


def parse(lines):
    """[(name, verdict, ms, note)] in run order."""
    tests, current, notes = [], None, []
    for line in lines:
        # compute-sanitizer prefixes its own lines with "========= "; the tests' lines are plain.
        m = RUN.match(line)
        if m:
            if current is not None:  # a RUN without a result, then another RUN: cannot happen
                tests.append((current, "CRASHED/TIMEOUT", 0, " / ".join(notes[:2])[:140]))
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
        if not line.strip() or line.startswith("Running main") or line.startswith("Note:"):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        else:
            names.append(suite + line.split("#")[0].strip())
    return names


def read_rc(log_path):
    """The exit status gpu_check.sh recorded next to the log, or None."""
    try:
        return int(open(log_path + ".rc").read().strip())
    except (OSError, ValueError):
        return None


def sanitizer_verdict(lines):
    """(ok, note) from a compute-sanitizer log: its summary line must say zero."""
    summaries = [m for m in (SANITIZER_SUMMARY.search(l) for l in lines) if m]
    if not summaries:
        refusal = next((l.strip() for l in lines if SANITIZER_REFUSAL.search(l)), "")
        return False, "no sanitizer summary" + (f": {refusal}" if refusal else "")
    bad = [m.group(0) for m in summaries if int(m.group(2)) != 0]
    if bad:
        return False, bad[0]
    return True, summaries[-1].group(0)


def report(spec, allowed):
    """Rows (label, name, verdict, ms, note) for one LABEL=LOG[=LIST]."""
    label, path, *list_path = spec.split("=")
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        return [(label, path, "NO LOG", 0, str(e))]
    tests = parse(lines)
    if list_path:
        seen = {t[0] for t in tests}
        tests += [(n, "NOT RUN", 0, "not reached") for n in listed(list_path[0]) if n not in seen]
    rows = []
    if not tests:
        rows.append((label, path, "NO TESTS", 0, "the log holds no test result"))
    for name, verdict, ms, note in tests:
        if verdict == "SKIPPED" and name in allowed:
            verdict, note = "SKIPPED (allowed)", allowed[name]
        elif verdict == "SKIPPED":
            verdict = "SKIPPED (not allowed)"
        rows.append((label, name, verdict, ms, note))
    rc = read_rc(path)
    name = os.path.basename(path)
    if rc is None:
        rows.append((label, name, "NO EXIT STATUS", 0, f"{path}.rc missing or unreadable"))
    elif rc != 0 and all(r[2] in ("OK", "SKIPPED (allowed)") for r in rows):
        what = "timed out" if rc in (124, 137) else "non-zero exit after its tests"
        rows.append((label, name, f"EXIT rc {rc}", 0, what))
    if label == "sanitizer":
        ok, note = sanitizer_verdict(lines)
        rows.append((label, name, "SANITIZER OK" if ok else "SANITIZER FAILED", 0, note))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allow-skip", action="append", default=[],
                    help="Suite.Name=reason: a skip of this test with this reason is accepted")
    ap.add_argument("logs", nargs="+", help="LABEL=LOG[=LIST], LABEL cpu, gpu or sanitizer")
    a = ap.parse_args()
    allowed = dict(s.split("=", 1) for s in a.allow_skip)
    good = ("OK", "SKIPPED (allowed)", "SANITIZER OK")
    bad = 0
    counts = {}
    print("| label | test | verdict | ms | note |")
    print("|---|---|---|---|---|")
    for spec in a.logs:
        for label, name, verdict, ms, note in report(spec, allowed):
            if verdict not in good:
                bad += 1
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"| {label} | {name} | {verdict} | {ms} | {note.replace('|', '/')} |")
    print(("PASS" if bad == 0 else "FAIL") + ": " +
          ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
