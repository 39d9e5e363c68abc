"""Pretraining scale: PackedBatchSampler over a Megatron corpus (MegatronTokens: the .idx checked
chunk by chunk, its lengths memory-mapped) and `wlb-plan --docs X.idx`, at 10^6, 10^7 and 10^8
documents, in one run.

    build/pyenv/bin/python bench/scale_bench.py --documents 1000000 10000000 100000000 \\
        --wlb-plan build/tools/wlb-plan --out docs/results/scale/scale_bench.jsonl

Each corpus is synthetic: int32 lengths drawn from a seeded log-normal (median ~400 tokens, clipped
to [1, 131072]), written as a Megatron-LM .idx (the MMIDIDX layout: header, int32 lengths, int64
pointers, int64 document indices; one document per sequence) by numpy in chunks, beside a sparse
.bin of the size the index describes (no token is read). Every measurement runs in a fresh
subprocess, so peak memory is its own:

- sampler: PackedBatchSampler(source.lengths, pp=4, dp=2, rank=0, context=8192, packer="wlb")
  (the packer of the committed results; the default until wlb-lookahead); the time from
  constructing the source to the first micro-batch (first_mb_s: the .idx check, the lengths'
  validation and fingerprint, the epoch's shuffled order and the first push), then steps/s over
  the next --steps steps (this rank's PP micro-batches per step; every rank plans every step),
  state_dict() time, and an exact resume in a fresh sampler (resume_first_mb_s: construction,
  load_state_dict's checks and seek, first micro-batch; checked equal to the uninterrupted
  one). Memory: peak RSS before the resumed sampler is built (ru_maxrss: it counts the
  memory-mapped lengths' pages and torch's libraries too) and with it (two samplers alive),
  RssAnon / RssFile after importing torch and wlb (baseline) and before the resume.
- wlb-plan: `wlb-plan --docs X.idx --context 8192 --micro-batches 8 --steps K --format json
  --timing` for K = 1 (first_step_s: wall time to read and check the whole index, cut the first
  step, plan and write it; the best of 2) and K = --cli-steps (steps/s from the JSON's
  planning_ms_total: Push/Flush time only), peak RSS of the K-step run; then the whole epoch
  (`--compare=false`, the table: one row a step) for its wall time and peak RSS (the stream's
  memory: the lengths, not the steps).

One JSON line per (documents, tool) on stdout and in --out.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

_CHUNK = 1 << 22


def write_corpus(prefix: str, documents: int, seed: int) -> int:
    """Writes prefix.idx (and a sparse prefix.bin); returns the corpus's tokens."""
    rng = np.random.default_rng(seed)
    header = (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]) +
              documents.to_bytes(8, "little") + (documents + 1).to_bytes(8, "little"))
    lengths_at = len(header)
    pointers_at = lengths_at + 4 * documents
    indices_at = pointers_at + 8 * documents
    size = indices_at + 8 * (documents + 1)
    with open(prefix + ".idx", "wb") as f:
        f.write(header)
        f.truncate(size)
    idx = np.memmap(prefix + ".idx", dtype=np.uint8, mode="r+")
    lengths = idx[lengths_at:pointers_at].view("<i4")
    pointers = idx[pointers_at:indices_at].view("<i8")
    indices = idx[indices_at:].view("<i8")
    tokens = 0
    for start in range(0, documents, _CHUNK):
        count = min(_CHUNK, documents - start)
        part = np.clip(rng.lognormal(6.0, 1.2, size=count), 1, 131072).astype(np.int32)
        lengths[start:start + count] = part
        ends = tokens + np.cumsum(part, dtype=np.int64)
        pointers[start:start + count] = 2 * (ends - part)
        indices[start:start + count] = np.arange(start, start + count, dtype=np.int64)
        tokens = int(ends[-1])
    indices[documents] = documents
    idx.flush()
    del idx
    with open(prefix + ".bin", "wb") as f:
        f.truncate(2 * tokens)  # sparse: the size the index describes, no token written
    return tokens


def memory() -> dict:
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                status[key] = int(value.split()[0]) * 1024
    return status


def run_sampler(prefix: str, steps: int) -> dict:
    """In this (fresh) process: the sampler's first micro-batch, then `steps` steps."""
    import warnings

    from wlb.formats import MegatronTokens
    from wlb.torch import PackedBatchSampler

    pp = 4
    baseline = memory()  # after importing torch and wlb
    start = time.perf_counter()
    source = MegatronTokens(prefix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = PackedBatchSampler(source.lengths, pp=pp, dp=2, rank=0, context=8192,
                                     packer="wlb")
    built = time.perf_counter()
    it = iter(sampler)
    next(it)
    first = time.perf_counter()
    for _ in range(pp - 1):  # the rest of the first step
        next(it)
    begin = time.perf_counter()
    for _ in range(steps * pp):
        next(it)
    end = time.perf_counter()
    state_start = time.perf_counter()
    state = sampler.state_dict()
    state_s = time.perf_counter() - state_start
    expected = next(it)
    mem = memory()
    peak_one = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before the 2nd sampler
    # Exact resume in a fresh sampler: the state's checks and the seek are scans of the order.
    resume_start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = PackedBatchSampler(source.lengths, pp=pp, dp=2, rank=0, context=8192,
                                     packer="wlb")
    resumed.load_state_dict(state)
    got = next(iter(resumed))
    resume_s = time.perf_counter() - resume_start
    if got != expected:
        raise RuntimeError("the resumed sampler gave another micro-batch")
    return {"build_s": built - start, "first_mb_s": first - start,
            "steps_per_s": steps / (end - begin), "state_dict_s": state_s,
            "resume_first_mb_s": resume_s,
            "peak_rss_bytes": peak_one,
            "peak_rss_with_resumed_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "baseline_rss_anon_bytes": baseline.get("RssAnon"),
            "baseline_rss_file_bytes": baseline.get("RssFile"),
            "rss_anon_end_bytes": mem.get("RssAnon"), "rss_file_end_bytes": mem.get("RssFile")}


def run_cli(wlb_plan: str, prefix: str, steps: int, out_json: str) -> dict:
    def command(k: int):
        return [wlb_plan, "--docs", prefix + ".idx", "--context", "8192", "--micro-batches", "8",
                "--steps", str(k), "--format", "json", "--timing", "--out", out_json]

    def wall(k: int) -> float:
        start = time.perf_counter()
        subprocess.run(command(k), check=True)
        return time.perf_counter() - start

    first_s = min(wall(1) for _ in range(2))
    total_s = wall(steps)
    with open(out_json) as f:
        summary = json.load(f)["summary"]
    os.remove(out_json)
    # The whole epoch, as a table of the chosen packer alone (one row a step).
    epoch = [wlb_plan, "--docs", prefix + ".idx", "--context", "8192", "--micro-batches", "8",
             "--compare=false", "--out", out_json]
    start = time.perf_counter()
    epoch_peak = peak_rss_of(epoch)
    epoch_s = time.perf_counter() - start
    with open(out_json) as f:
        epoch_steps = int(f.readline().split(",")[-1].split()[0])
    os.remove(out_json)
    return {"first_step_s": first_s, "total_s": total_s,
            "planning_ms_total": summary["planning_ms_total"],
            "steps_per_s": steps / (summary["planning_ms_total"] / 1000),
            "peak_rss_bytes": peak_rss_of(command(steps)),
            "epoch_steps": epoch_steps, "epoch_s": epoch_s, "epoch_peak_rss_bytes": epoch_peak}


def peak_rss_of(cmd) -> int:
    """ru_maxrss of `cmd` alone, run from a fresh Python child (RUSAGE_CHILDREN of that child)."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
            "stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", code, *cmd], check=True, capture_output=True,
                         text=True)
    return int(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, nargs="+", default=[10**6, 10**7, 10**8])
    parser.add_argument("--steps", type=int, default=500, help="sampler steps timed")
    parser.add_argument("--cli-steps", type=int, default=1000, help="wlb-plan --steps timed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wlb-plan", default="build/tools/wlb-plan")
    parser.add_argument("--dir", default=None, help="where the corpora go (default: a temp dir)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--sampler-child", nargs=2, metavar=("PREFIX", "STEPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sampler_child:
        print(json.dumps(run_sampler(args.sampler_child[0], int(args.sampler_child[1]))))
        return
    out = open(args.out, "w") if args.out else None
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for documents in args.documents:
            prefix = os.path.join(tmp, f"corpus_{documents}")
            start = time.perf_counter()
            tokens = write_corpus(prefix, documents, args.seed)
            common = {"documents": documents, "tokens": tokens,
                      "idx_bytes": os.path.getsize(prefix + ".idx"),
                      "write_s": time.perf_counter() - start, "machine": platform.node(),
                      "cpus": os.cpu_count()}
            child = subprocess.run([sys.executable, __file__, "--sampler-child", prefix,
                                    str(args.steps)], check=True, capture_output=True, text=True)
            rows = [dict(common, tool="PackedBatchSampler(MegatronTokens.lengths)",
                         steps=args.steps, **json.loads(child.stdout.strip().splitlines()[-1]))]
            rows.append(dict(common, tool="wlb-plan --docs X.idx", steps=args.cli_steps,
                             **run_cli(args.wlb_plan, prefix, args.cli_steps,
                                       os.path.join(tmp, "plan.json"))))
            for row in rows:
                line = json.dumps(row)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
                    out.flush()
            for suffix in (".idx", ".bin"):
                os.remove(prefix + suffix)
    if out:
        out.close()


if __name__ == "__main__":
    main()
