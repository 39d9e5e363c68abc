"""Planning one step through Python vs the C++ call, side by side in one run.

    build/pyenv/bin/python bench/python_plan_step.py [--build-dir build] [--packer wlb]

The C++ number is Google Benchmark's BM_PlanStep/<packer>/64 (bench/plan_step_benchmark.cc: one
Push() of a step of the default distribution at N = 64, S = 128K, seed 1, cycling over 16 steps
with the packer's state kept). The Python number is timeit of wlb.Packer.push() over the same 16
steps in the same order: the arrivals as a wlb.Documents object (as the C++ benchmark hands over
a vector of pieces), and as an array of lengths (split into pieces by push()). The machine is
noisy, so the two alternate: each of --rounds rounds runs the C++ benchmark once and then each
Python variant once (each measuring the mean time per call over about 0.5 s); the table gives the
median over rounds, and the ratio is the median of the per-round ratios.
"""

import argparse
import json
import statistics
import subprocess
import timeit

import wlb

S, N, STEPS = 131072, 64, 16


def cpp_microseconds(build_dir: str, packer: str) -> float:
    name = packer.replace("-", "_")
    out = subprocess.run(
        [f"{build_dir}/bench/plan_step_benchmark", f"--benchmark_filter=^BM_PlanStep/{name}/64$",
         "--benchmark_min_time=0.5", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    (run,) = [b for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"]
    return run["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[run["time_unit"]]


def python_microseconds(packer_name: str, arrivals) -> float:
    packer = wlb.Packer(packer_name, context=S, micro_batches=N)
    state = {"next": 0}

    def push_next():
        packer.push(arrivals[state["next"]])
        state["next"] = (state["next"] + 1) % len(arrivals)

    timer = timeit.Timer(push_next)
    number, seconds = timer.autorange()  # warms up the packer's state as well
    number = max(number, int(number * 0.5 / seconds))
    return timer.timeit(number) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--packer", default="wlb")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    lengths = wlb.sample_default_lengths(STEPS * N * S, seed=1)
    pieces = wlb.split_into_steps(wlb.make_documents(lengths, S), N * S)[:STEPS]
    # The same steps as arrays of lengths (every piece is <= S, so push() keeps them whole).
    by_lengths = [step.lengths for step in pieces]
    rounds = []
    for _ in range(args.rounds):
        cpp = cpp_microseconds(args.build_dir, args.packer)
        rounds.append((cpp, python_microseconds(args.packer, pieces),
                       python_microseconds(args.packer, by_lengths)))
    med = statistics.median
    cpp = med(r[0] for r in rounds)
    docs = statistics.mean(len(p) for p in pieces)
    print(f"packer {args.packer}, N = {N}, S = {S}, {docs:.0f} pieces per step "
          f"(median of {args.rounds} alternating rounds)")
    print("| call | µs per step | vs C++ (median of per-round ratios) |")
    print("|---|---|---|")
    print(f"| C++ Packer::Push (Google Benchmark) | {cpp:.1f} | 1.00 |")
    for i, call in ((1, "Packer.push(Documents)"), (2, "Packer.push(lengths)")):
        print(f"| Python {call} (timeit) | {med(r[i] for r in rounds):.1f} | "
              f"{med(r[i] / r[0] for r in rounds):.2f} |")


if __name__ == "__main__":
    main()
