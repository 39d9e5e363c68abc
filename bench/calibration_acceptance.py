#!/usr/bin/env python3
"""Acceptance of online calibration on CPU: a small decoder trained on packed micro-batches.

Six planners share one run, alternated step by step so machine noise falls on all alike:
original, wlb and wlb-lookahead, each (a) with the FLOP cost of the decoder's own shape
(``wlb.CostModel.from_shape``) and (b) with ``wlb.torch.OnlineCalibration`` (the FLOP cost until
its first fit, then the fits of the times measured in this run). Every planner reads the same
document stream (WLB-LLM-like lengths from ../shared/data, times --length-scale, the same seed),
N = 4 micro-batches a step of S tokens (by default S = 4K and lengths halved: the packing problem
of S = 8K at a quarter of the attention time, so a run fits in about ten minutes on a shared
CPU). Each micro-batch runs forward + backward of the decoder, float32, attention through
``wlb.torch.attention``'s ``math`` backend, one thread; an SGD step ends each step.

Every planner's micro-batches are timed the same way (``OnlineCalibration.measure``); the (a)
planners' calibrations fit too (their fits are reported) but plan nothing. Reported per planner:
measured imbalance per step (max / mean of the step's measured micro-batch fwd+bwd ms), over all
steps and over the steps from the first calibrated plan on; the same from the thread's CPU time
(``time.thread_time``: one torch thread, so it counts the work and not the time the shared machine
gave to others; the calibration itself fits wall time); the imbalance the pooled fit of all
measurements predicts for the same plans (less noisy than the measurement); the held-out error of
the last refit; the FLOP cost's error on the same measurements (at its best time scale); and the
calibration's cost per step (recording + end_step with its refits) and per refit. The original
packer ignores the cost, so original (a) and (b) plan the same micro-batches: the difference of
their measured imbalance is the run's noise floor.

    build/pyenv/bin/python bench/calibration_acceptance.py --out run.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn

import wlb
from wlb.torch import OnlineCalibration, PackedBatchSampler
from wlb.torch.attention import varlen_causal_attention

# ../shared/data beside the repository (as CMake's WLB_SHARED_DATA_DIR), or that variable.
DATA = os.path.join(os.environ.get("WLB_SHARED_DATA_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")),
    "doc_lengths_wlbllm_like.json")


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x, cu, max_len):
        t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, h // self.heads).unbind(1)
        out, _ = varlen_causal_attention(q, k, v, cu, cu, max_len, max_len, backend="math")
        x = x + self.proj(out.reshape(t, h))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, vocab, hidden, heads, ffn, layers, context):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(context, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids, positions, cu, max_len):
        x = self.embed(ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x, cu, max_len)
        return self.head(x)


def tensors(pieces, vocab):
    """Token ids (seeded by document and offset), positions, cu_seqlens, labels of a micro-batch."""
    lengths = [p[2] for p in pieces]
    ids = torch.cat([torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(
        d * 1_000_003 + o)) for d, o, n in pieces])
    positions = torch.cat([torch.arange(n) for n in lengths])
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    labels = torch.roll(ids, -1)
    labels[cu[1:].long() - 1] = -100
    return ids, positions, cu, max(lengths), labels


def flop_error(costs, ms):
    """Mean relative error of costs predicting ms at the best scale (argmin sum (s c/m - 1)^2)."""
    r = np.asarray(costs) / np.asarray(ms)
    s = r.sum() / (r * r).sum()
    return float(np.mean(np.abs(s * r - 1)))


def overhead(repeats=5):
    """The calibration's own cost, apart from training: measure() around an empty block, and
    end_step() with and without a refit, for windows of 64 to 1,024 micro-batches (PP = 4)."""
    out = {}
    rng = np.random.default_rng(0)
    calibration = OnlineCalibration()
    t0 = time.perf_counter()
    for _ in range(10000):
        with calibration.measure([4096, 2048, 1024]):
            pass
    out["measure_us"] = (time.perf_counter() - t0) / 10000 * 1e6
    for window in (16, 64, 256):
        calibration = OnlineCalibration(refit_every=window, window=window)
        plain, refit = [], []
        for step in range(window * (repeats + 1)):
            for _ in range(4):
                lengths = rng.integers(1, 8192, size=rng.integers(1, 9))
                calibration.record(lengths, 1e-5 * float(np.sum(lengths.astype(float) ** 2)) +
                                   0.01 * float(lengths.sum()) + 3.0 + rng.uniform(0, 0.1))
            before = calibration.refits
            t0 = time.perf_counter()
            calibration.end_step()
            (refit if calibration.refits != before else plain).append(time.perf_counter() - t0)
        out[f"window_{window}_steps"] = {
            "micro_batches_fitted": len(calibration.state_dict()["window"]),
            "end_step_us": 1e6 * float(np.median(plain)),
            "refit_ms": 1e3 * float(np.median(refit[1:])),
            "per_step_us_amortised": 1e6 * (float(np.sum(plain)) + float(np.sum(refit))) /
            (len(plain) + len(refit))}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per planner")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--refit-every", type=int, default=4)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--min-samples", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--length-scale", type=float, default=0.5,
                        help="document lengths times this (0.5 at S = 4K packs as 1.0 at 8K)")
    parser.add_argument("--out", help="write the raw results (JSON) here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lengths = np.maximum(1, np.round(np.asarray(json.load(open(DATA)), dtype=np.float64) *
                                     args.length_scale)).astype(np.int64)
    micro_batches = 4
    model = Decoder(args.vocab, args.hidden, args.heads, args.ffn, args.layers,
                    args.context + args.context // 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    flop = wlb.CostModel.from_shape(args.hidden, args.ffn, args.heads, args.heads, args.layers,
                                    name="bench-decoder")

    configs = []
    for packer in ("original", "wlb", "wlb-lookahead"):
        for calibrated in (False, True):
            calibration = OnlineCalibration(refit_every=args.refit_every, window=args.window,
                                            min_samples=args.min_samples)
            sampler = PackedBatchSampler(lengths, pp=micro_batches, dp=1, rank=0,
                                         context=args.context, packer=packer, seed=args.seed,
                                         cost=flop, assign="round_robin",
                                         calibration=calibration if calibrated else None)
            configs.append({"name": f"{packer} ({'calibrated' if calibrated else 'FLOP'})",
                            "sampler": sampler, "iter": iter(sampler),
                            "calibration": calibration, "calibrated": calibrated,
                            "steps": [], "plan_s": [], "calibration_s": [], "refit_s": []})

    started = time.perf_counter()
    for step in range(args.steps):
        for c in configs:
            plan_start = time.perf_counter()
            step_pieces = [next(c["iter"]) for _ in range(micro_batches)]
            c["plan_s"].append(time.perf_counter() - plan_start)
            calibration = c["calibration"]
            record_s, cpu_ms = 0.0, []
            for pieces in step_pieces:
                if not pieces:  # an empty micro-batch (wlb's first step queues outliers): 0 ms
                    cpu_ms.append(0.0)
                    continue
                ids, positions, cu, max_len, labels = tensors(pieces, args.vocab)
                t0 = time.perf_counter()
                with calibration.measure([p[2] for p in pieces]):
                    t1 = time.perf_counter()
                    c1 = time.thread_time()
                    logits = model(ids, positions, cu, max_len)
                    loss = nn.functional.cross_entropy(logits, labels, ignore_index=-100)
                    loss.backward()
                    cpu_ms.append(1e3 * (time.thread_time() - c1))
                    t2 = time.perf_counter()
                record_s += (t1 - t0) + (time.perf_counter() - t2)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            refits = calibration.refits
            t0 = time.perf_counter()
            calibration.end_step()
            end_s = time.perf_counter() - t0
            if calibration.refits != refits:
                c["refit_s"].append(end_s)
            c["calibration_s"].append(record_s + end_s)
            state = calibration.state_dict()
            ms = iter(s[1] for s in state["previous"])  # this step's ms, as recorded
            measured = [next(ms) if pieces else 0.0 for pieces in step_pieces]
            c["steps"].append({"lengths": [[p[2] for p in mb] for mb in step_pieces],
                               "ms": measured, "cpu_ms": cpu_ms,
                               "cost": "FLOP" if not c["calibrated"] or
                               c["sampler"]._live["before"]["push"]["cost"] is None else
                               "fit from step %d" % c["sampler"]._live["before"]["push"]["cost"][
                                   "from_step"]})
        print(f"step {step + 1}/{args.steps} done at {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)

    # The pooled fit of every measurement (all planners) predicts each plan's imbalance.
    measured_mbs = [(np.asarray(l), m, i) for c in configs for i, s in enumerate(c["steps"])
                    for l, m in zip(s["lengths"], s["ms"]) if m > 0]
    all_lengths = [l for l, _, _ in measured_mbs]
    all_ms = [m for _, m, _ in measured_mbs]
    all_steps = [i for _, _, i in measured_mbs]
    pooled = wlb.fit_micro_batch_cost(all_lengths, all_ms, step=all_steps)
    first_fit = min([i for c in configs if c["calibrated"] for i, s in enumerate(c["steps"])
                     if s["cost"] != "FLOP"] or [args.steps])
    results = {"args": vars(args), "micro_batches": micro_batches,
               "wall_s": time.perf_counter() - started,
               "machine": {"platform": platform.platform(), "processor": platform.processor(),
                           "cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
                           "torch": torch.__version__, "threads": torch.get_num_threads()},
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip(),
               "flop_cost": repr(flop), "first_calibrated_step": first_fit,
               "pooled_fit": {"description": pooled.model.description,
                              "per_call_ms": pooled.per_call_ms,
                              "held_out_mean_relative": pooled.held_out.mean_relative,
                              "in_sample_mean_relative": pooled.in_sample.mean_relative,
                              "points": pooled.held_out.points},
               "flop_error_on_all": flop_error(
                   [float(np.sum(flop(l))) for l in all_lengths], all_ms),
               "planners": []}
    for c in configs:
        measured = [max(s["ms"]) / np.mean(s["ms"]) for s in c["steps"]]
        cpu = [max(s["cpu_ms"]) / np.mean(s["cpu_ms"]) for s in c["steps"]]
        predicted = []
        for s in c["steps"]:
            p = [float(np.sum(pooled.model(np.asarray(l)))) + pooled.per_call_ms if l else 0.0
                 for l in s["lengths"]]
            predicted.append(max(p) / np.mean(p))
        fit = c["calibration"].last_fit
        results["planners"].append({
            "name": c["name"],
            "measured_imbalance_all": float(np.mean(measured)),
            "measured_imbalance_calibrated_phase": float(np.mean(measured[first_fit:])),
            "pooled_fit_imbalance_calibrated_phase": float(np.mean(predicted[first_fit:])),
            "cpu_time_imbalance_calibrated_phase": float(np.mean(cpu[first_fit:])),
            "step_ms_mean": float(np.mean([np.sum(s["ms"]) for s in c["steps"]])),
            "last_fit_held_out_mean_relative": fit.held_out.mean_relative if fit else None,
            "last_fit_points": fit.held_out.points if fit else None,
            "refits": c["calibration"].refits, "refits_skipped": c["calibration"].refits_skipped,
            "calibration_ms_per_step": 1e3 * float(np.mean(c["calibration_s"])),
            "refit_ms_mean": 1e3 * float(np.mean(c["refit_s"])) if c["refit_s"] else None,
            "plan_ms_per_step": 1e3 * float(np.mean(c["plan_s"])),
            "steps": c["steps"], "measured_imbalance": measured,
        })
    results["overhead"] = overhead()
    text = json.dumps(results, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(f"{'planner':<28}{'measured all':>13}{'measured cal.':>14}{'CPU-time cal.':>14}"
          f"{'fit-predicted':>14}"
          f"{'held-out':>10}{'calib ms/step':>14}{'refit ms':>10}")
    for p in results["planners"]:
        held = p["last_fit_held_out_mean_relative"]
        refit = p["refit_ms_mean"]
        print(f"{p['name']:<28}{p['measured_imbalance_all']:>13.4f}"
              f"{p['measured_imbalance_calibrated_phase']:>14.4f}"
              f"{p['cpu_time_imbalance_calibrated_phase']:>14.4f}"
              f"{p['pooled_fit_imbalance_calibrated_phase']:>14.4f}"
              f"{'-' if held is None else f'{100 * held:.1f}%':>10}"
              f"{p['calibration_ms_per_step']:>14.2f}"
              f"{'-' if refit is None else f'{refit:.1f}':>10}")
    print(f"pooled fit: {pooled.model.description}; per call {pooled.per_call_ms:.2f} ms; held-out "
          f"{100 * pooled.held_out.mean_relative:.1f}% over {pooled.held_out.points} micro-batches;"
          f" FLOP cost at its best scale: {100 * results['flop_error_on_all']:.1f}%")
    o = results["overhead"]
    print(f"calibration alone: measure() {o['measure_us']:.1f} us a micro-batch; " + "; ".join(
        f"{v['micro_batches_fitted']} micro-batches fitted: end_step {v['end_step_us']:.1f} us, "
        f"refit {v['refit_ms']:.2f} ms" for k, v in o.items() if k.startswith("window")))
    print(f"first calibrated plan: step {first_fit}; wall {results['wall_s']:.0f} s; "
          f"load average at end {results['machine']['load_avg_at_end']}")


if __name__ == "__main__":
    main()
