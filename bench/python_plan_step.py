"""Planning one step through Python vs the C++ call, side by side in one run.

    build/pyenv/bin/python bench/python_plan_step.py [--build-dir build] [--packer wlb]

The C++ number is Google Benchmark's BM_PlanStep/<packer>/64 (bench/plan_step_benchmark.cc: one
Push() of a step of the default distribution at N = 64, S = 128K, seed 1, cycling over 16 steps
with the packer's state kept). The Python number is timeit of wlb.Packer.push() over the same 16
steps in the same order: the arrivals as a wlb.Documents object (as the C++ benchmark hands over
a vector of pieces), and as an array of lengths (split into pieces by push()). Both are medians
of 5 repetitions of the mean time per call.
"""

import argparse
import json
import statistics
import subprocess
import timeit

import wlb

S, N, STEPS = 131072, 64, 16


def cpp_microseconds(build_dir: str, packer: str, repetitions: int) -> float:
    name = packer.replace("-", "_")
    out = subprocess.run(
        [f"{build_dir}/bench/plan_step_benchmark", f"--benchmark_filter=^BM_PlanStep/{name}/64$",
         f"--benchmark_repetitions={repetitions}", "--benchmark_min_time=0.5",
         "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    runs = [b for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"]
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}
    return statistics.median(b["real_time"] * scale[b["time_unit"]] for b in runs)


def python_microseconds(packer_name: str, arrivals, repetitions: int) -> float:
    packer = wlb.Packer(packer_name, context=S, micro_batches=N)
    state = {"next": 0}

    def push_next():
        packer.push(arrivals[state["next"]])
        state["next"] = (state["next"] + 1) % len(arrivals)

    timer = timeit.Timer(push_next)
    number, _ = timer.autorange()
    number = max(number, int(number * 0.5 / max(timer.timeit(number), 1e-9)))  # ~0.5 s
    return statistics.median(timer.timeit(number) / number * 1e6 for _ in range(repetitions))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--packer", default="wlb")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()

    lengths = wlb.sample_default_lengths(STEPS * N * S, seed=1)
    pieces = wlb.split_into_steps(wlb.make_documents(lengths, S), N * S)[:STEPS]
    # The same steps as arrays of lengths (every piece is <= S, so push() keeps them whole).
    by_lengths = [step.lengths for step in pieces]
    cpp = cpp_microseconds(args.build_dir, args.packer, args.repetitions)
    py_docs = python_microseconds(args.packer, pieces, args.repetitions)
    py_lengths = python_microseconds(args.packer, by_lengths, args.repetitions)
    docs = statistics.mean(len(p) for p in pieces)
    print(f"packer {args.packer}, N = {N}, S = {S}, {docs:.0f} pieces per step "
          f"(median of {args.repetitions} repetitions)")
    print("| call | µs per step | vs C++ |")
    print("|---|---|---|")
    print(f"| C++ Packer::Push (Google Benchmark) | {cpp:.1f} | 1.00 |")
    print(f"| Python Packer.push(Documents) (timeit) | {py_docs:.1f} | {py_docs / cpp:.2f} |")
    print(f"| Python Packer.push(lengths) (timeit) | {py_lengths:.1f} | {py_lengths / cpp:.2f} |")


if __name__ == "__main__":
    main()
