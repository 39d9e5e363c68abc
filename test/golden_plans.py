#!/usr/bin/env python3
"""Golden plans: wlb-plan's output for every packer, CP strategy and option set, byte for byte.

Each case runs `wlb-plan ARGS` (JSON with --timing=false) in a scratch folder holding the input files under
fixed relative names (output that names a file is the same in every clone) and hashes its standard
output (SHA-256) and exit status; test/golden/plan_digests.txt holds the expected digests. A
refactor must leave every digest as it is. A change that is meant to change plans updates the
file (`--update`) in the same commit and says why. The packers and CP strategies come from wlb's
registries (`wlb-plan --list packers|sharding`), so a new one gets its cases here at once and fails
the check until its digests are recorded.

  test/golden_plans.py --wlb-plan build/tools/wlb-plan            # check (ctest runs this)
  test/golden_plans.py --wlb-plan build/tools/wlb-plan --update   # rewrite the digests
  test/golden_plans.py --wlb-plan build/tools/wlb-plan --show NAME  # print one case's output
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGESTS = os.path.join(REPO, "test", "golden", "plan_digests.txt")
KERNEL_PROFILE = "kernel_profile.csv"  # docs/results/gpu/h100_kernel_profile_flash.csv
COST_PROFILE = "cost_profile.csv"


def write_inputs(directory):
    """The input files the cases name, in the scratch folder they run in."""
    profile = os.path.join(REPO, "docs", "results", "gpu", "h100_kernel_profile_flash.csv")
    with open(profile) as src, \
            open(os.path.join(directory, KERNEL_PROFILE), "w") as dst:
        dst.write(src.read())
    # A length -> ms cost profile (the shape a measured one has) for --cost PROFILE.
    with open(os.path.join(directory, COST_PROFILE), "w") as f:
        f.write("length,ms\n")
        for length in (1024, 4096, 16384, 32768, 65536, 131072):
            f.write(f"{length},{0.05 + 2.1e-4 * length + 1.7e-9 * length * length:.6f}\n")


def cases(packers, strategies):
    """(name, wlb-plan arguments) for every case: each of `packers` and `strategies` (the
    registries' names) under the same options, then option sets of particular ones."""
    out = []
    json = ["--format", "json"]
    for p in packers:
        out.append((f"{p}-default-n4", ["--packer", p, "--steps", "12", "--seed", "3"] + json))
        out.append((f"{p}-heavy-n16", ["--packer", p, "--distribution", "heavy-tail", "--steps",
                                       "12", "--seed", "5", "--micro_batches", "16"] + json))
        out.append((f"{p}-n1-32k", ["--packer", p, "--steps", "6", "--micro_batches", "1",
                                    "--context", "32768"] + json))
        out.append((f"{p}-table", ["--packer", p, "--steps", "6", "--seed", "2"]))
    options = {
        "wlb-queues1": ["--packer", "wlb", "--queues", "1"],
        "wlb-queues3": ["--packer", "wlb-refine", "--queues", "3"],
        "wlb-thresholds": ["--packer", "wlb", "--thresholds", "32768,98304"],
        "wlb-max-tokens": ["--packer", "wlb-refine", "--max_tokens", "163840"],
        "greedy-window1": ["--packer", "fixed-greedy", "--window", "1"],
        "greedy-window8": ["--packer", "fixed-greedy", "--window", "8"],
        "lookahead-k2": ["--packer", "wlb-lookahead", "--lookahead", "2"],
        "lookahead-budget": ["--packer", "wlb-lookahead", "--delay_budget", "0.25"],
        "lookahead-price-alone": ["--packer", "wlb-lookahead", "--bound_delay=false",
                                  "--distribution", "heavy-tail"],
        "tune-refine": ["--packer", "wlb-refine", "--tune", "--steps", "8"],
        "tune-lookahead": ["--packer", "wlb-lookahead", "--tune", "--delay_budget", "0.5",
                           "--steps", "8"],
        "cost-13b": ["--packer", "wlb", "--cost", "llama2-13b"],
        "cost-70b": ["--packer", "wlb-refine", "--cost", "llama2-70b"],
        "cost-550m": ["--packer", "wlb", "--cost", "wlb-550m", "--context", "65536"],
        "cost-profile-fit": ["--packer", "wlb", "--cost", COST_PROFILE, "--profile_cost",
                             "fit"],
        "cost-profile-table": ["--packer", "wlb-refine", "--cost", COST_PROFILE,
                               "--profile_cost", "table"],
        "cost-swa4k": ["--packer", "wlb-refine", "--cost", "llama2-7b-swa4k"],
        "cost-chunk8k": ["--packer", "wlb", "--cost", "llama2-7b-chunk8k"],
        "estimate": ["--packer", "wlb", "--estimate", "8,2,4,1"],
        "estimate-dp": ["--packer", "wlb", "--micro_batches", "8", "--estimate", "8,2,4,2",
                        "--dp_assign"],
        "estimate-profile": ["--packer", "wlb-refine", "--estimate", "8,4,4,1",
                             "--kernel_profile", KERNEL_PROFILE, "--gemm_tflops", "400"],
    }
    for name, args in options.items():
        steps = [] if "--steps" in args else ["--steps", "10"]
        out.append((name, args + steps + ["--seed", "4"] + json))
    for c in (2, 4, 8):
        for s in strategies:
            out.append((f"cp{c}-{s}", ["--packer", "wlb", "--steps", "4", "--seed", "6", "--cp",
                                       str(c), "--sharding", s] + json))
    out.append(("cp4-doc-degree-slow-link", ["--packer", "wlb", "--steps", "4", "--cp", "4",
                                             "--sharding", "doc-degree", "--cp_link_gbps", "25"]
                 + json))
    out.append(("cp4-doc-degree-swa4k", ["--packer", "wlb", "--steps", "4", "--cp", "4",
                                         "--sharding", "doc-degree", "--cost", "llama2-7b-swa4k"]
                 + json))
    out.append(("cp4-adaptive-profile", ["--packer", "wlb", "--steps", "4", "--cp", "4",
                                         "--sharding", "adaptive", "--kernel_profile",
                                         KERNEL_PROFILE] + json))
    return out


def registry(wlb_plan, name):
    """The names of one of wlb's registries (`wlb-plan --list NAME`), or exits with the error."""
    r = subprocess.run([wlb_plan, "--list", name], capture_output=True, timeout=60)
    names = r.stdout.decode().split()
    if r.returncode != 0 or not names:
        sys.exit(f"golden_plans: wlb-plan --list {name} exited {r.returncode} with "
                 f"{len(names)} names: {r.stderr.decode(errors='replace').strip()}")
    return names


def run_case(wlb_plan, args, cwd):
    timing = ["--timing=false"] if "json" in args else []  # tables print no timings
    r = subprocess.run([wlb_plan] + args + timing, cwd=cwd, capture_output=True,
                       timeout=300)
    stdout = r.stdout
    if not timing:  # a table's last summary column is the measured ms/step: left out
        stdout = b"\n".join(line.rsplit(b"|", 2)[0] if line.startswith(b"|") else line
                             for line in stdout.split(b"\n"))
    return r.returncode, stdout, r.stderr


def digest(rc, stdout):
    return f"{hashlib.sha256(stdout).hexdigest()} rc={rc}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wlb-plan", required=True)
    p.add_argument("--digests", default=DIGESTS)
    p.add_argument("--update", action="store_true")
    p.add_argument("--show", default="")
    a = p.parse_args()
    wlb_plan = os.path.abspath(a.wlb_plan)
    with tempfile.TemporaryDirectory() as tmp:
        write_inputs(tmp)
        all_cases = cases(registry(wlb_plan, "packers"), registry(wlb_plan, "sharding"))
        if a.show:
            args = dict(all_cases).get(a.show)
            if args is None:
                sys.exit(f"golden_plans: no case {a.show!r}")
            rc, stdout, stderr = run_case(wlb_plan, args, tmp)
            sys.stdout.buffer.write(stdout)
            sys.stderr.buffer.write(stderr)
            return rc
        got = {}
        for name, args in all_cases:
            rc, stdout, stderr = run_case(wlb_plan, args, tmp)
            if rc != 0:
                print(f"{name}: wlb-plan exited {rc}: {stderr.decode(errors='replace')[-500:]}")
            got[name] = digest(rc, stdout)
    failed = [name for name, d in got.items() if not d.endswith(" rc=0")]
    if a.update and failed:
        print(f"golden_plans: not updated: {', '.join(failed)} failed")
        return 1
    if a.update:
        with open(a.digests, "w") as f:
            f.write("# test/golden_plans.py: SHA-256 of wlb-plan's output per case (--update)\n")
            for name, d in got.items():
                f.write(f"{name} {d}\n")
        print(f"golden_plans: wrote {len(got)} digests to {a.digests}")
        return 0
    expected = {}
    with open(a.digests) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, rest = line.rstrip("\n").split(" ", 1)
                expected[name] = rest
    bad = 0
    for name in sorted(set(got) | set(expected)):
        if got.get(name) != expected.get(name):
            bad += 1
            args = dict(all_cases).get(name)
            print(f"{name}: expected {expected.get(name, '(no digest)')}, got "
                  f"{got.get(name, '(no such case)')}; wlb-plan {' '.join(args or [])}")
    print(f"golden_plans: {len(got) - bad} of {len(got)} cases as recorded"
          + (f", {bad} differ (see above; rerun with --show NAME)" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
