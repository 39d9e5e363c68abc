"""Which packer PackedBatchSampler should default to: micro-batch imbalance and token delay of
each candidate on the streams the sampler's tests and benches use, one epoch per seed.

The steps are the sampler's own (checked: for each stream's first seed every step's
micro-batches equal what ``PackedBatchSampler(pp=N, dp=1, packer=P, seed=seed)`` yields, up to
their order within the step): the documents in the sampler's seeded order, cut at S, a step the
next N x S tokens, pushed to ``wlb.Packer(P)`` with
the sampler's default cost (``llama2-7b``), flushed at the epoch's end. Per run: the mean and
worst step imbalance (max / mean micro-batch cost) over the steady steps (the flush's drain steps
left out, as wlb-plan's summary does), the worst steady step's slowest micro-batch against the
epoch's mean micro-batch cost (the worst step in time), the mean token delay in steps (per token,
every step), and the empty micro-batches before the epoch's last step.

    build/pyenv/bin/python bench/sampler_default_bench.py --packers wlb,wlb-lookahead

Streams: ``hf-corpus`` (the source files of the installed ``hypothesis`` package, byte tokens:
bench/hf_convergence_bench.py's training corpus, S = 512, N = 4), ``heavy-tail`` (300
log-uniform lengths in [100, 264K], S = 2K / 4K / 8K by seed, N = 4: the stream of
python/tests/test_hf_trainer.py's empty micro-batch test) and ``default`` (wlb's default
distribution, S = 32K, N = 8, 200 steps' tokens: the README's sampler setting).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import pathlib
import statistics

import numpy as np

import wlb


def hf_corpus(seed: int):
    """The convergence bench's training documents (its held-out tenth left out)."""
    del seed  # one corpus; the seed orders it
    root = pathlib.Path(importlib.import_module("hypothesis").__file__).parent
    lengths = []
    for path in sorted(root.rglob("*.py")):
        size = path.stat().st_size
        bucket = hashlib.sha256(str(path.relative_to(root)).encode()).digest()[0] % 10
        if size >= 2 and bucket != 9:
            lengths.append(size)
    return np.asarray(lengths, dtype=np.int64), 512, 4


def heavy_tail(seed: int):
    rng = np.random.default_rng(seed)
    context = int(rng.choice([2048, 4096, 8192]))
    lengths = np.exp(rng.uniform(np.log(100), np.log(264000), size=300)).astype(np.int64)
    return lengths, context, 4


def default(seed: int):
    context, n = 32768, 8
    return wlb.sample_default_lengths(200 * n * context, seed=seed), context, n


STREAMS = {"hf-corpus": hf_corpus, "heavy-tail": heavy_tail, "default": default}


def epoch_steps(lengths: np.ndarray, context: int, n: int, seed: int):
    """The sampler's epoch as one wlb.Documents per step: its seeded order, cut at S, and its
    step rule (a step takes the pieces whose first token lies within N x S tokens of the step's
    first piece's first token; wlb.split_into_steps counts from the stream's start instead), ids
    the documents' indices in `lengths`."""
    order = np.arange(len(lengths), dtype=np.int64)
    np.random.default_rng([seed, 0]).shuffle(order)
    cut = wlb.make_documents(lengths[order], context)
    columns = {c: np.asarray(getattr(cut, c), dtype=np.int64)
               for c in ("ids", "lengths", "pieces", "offsets")}
    columns["ids"] = order[columns["ids"]]
    starts = np.cumsum(columns["lengths"]) - columns["lengths"]
    steps, i = [], 0
    while i < len(starts):
        j = int(np.searchsorted(starts, starts[i] + n * context, side="left"))
        steps.append(wlb.Documents(**{c: v[i:j] for c, v in columns.items()}))
        i = j
    return steps


def measure(packer_name: str, lengths, context: int, n: int, seed: int):
    packer = wlb.Packer(packer_name, context=context, micro_batches=n, cost="llama2-7b")
    plans = []
    for arrivals in epoch_steps(lengths, context, n, seed):
        plans += packer.push(arrivals)
    plans += packer.flush()
    steady = [p.imbalance for p in plans if not p.drain]
    # The worst step in time: its slowest micro-batch against the epoch's mean micro-batch.
    mean_cost = statistics.fmean(c for p in plans for c in p.costs)
    slowest = max(max(p.costs) for p in plans if not p.drain) / mean_cost
    delay = tokens = 0
    for p in plans:
        for mb in p.micro_batches:
            delay += int(((p.step - mb.arrival_steps) * mb.lengths).sum())
            tokens += int(mb.lengths.sum())
    empty = sum(1 for p in plans[:-1] for mb in p.micro_batches if mb.tokens == 0)
    return plans, {"steps": len(plans), "steady": len(steady),
                   "mean_imbalance": statistics.fmean(steady), "worst_imbalance": max(steady),
                   "worst_slowest_vs_epoch_mean": slowest, "mean_delay": delay / tokens,
                   "empty_before_last": empty}


def sampler_micro_batches(packer_name: str, lengths, context: int, n: int, seed: int):
    from wlb.torch import PackedBatchSampler
    sampler = PackedBatchSampler(lengths, pp=n, dp=1, rank=0, context=context,
                                 packer=packer_name, seed=seed)
    return [[(int(d), int(o), int(k)) for d, o, k in mb] for mb in sampler]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packers", default="wlb,wlb-lookahead")
    parser.add_argument("--streams", default=",".join(STREAMS))
    parser.add_argument("--seeds", default="0,1,2,3,4,5")
    args = parser.parse_args()
    packers = args.packers.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for stream in args.streams.split(","):
        for i, seed in enumerate(seeds):
            lengths, context, n = STREAMS[stream](seed)
            for name in packers:
                plans, row = measure(name, lengths, context, n, seed)
                if i == 0:  # the replayed steps are the sampler's (it orders a step's
                    # micro-batches for the pipeline schedule)
                    ours = [sorted(tuple(zip(mb.ids.tolist(), mb.offsets.tolist(),
                                             mb.lengths.tolist())) for mb in p.micro_batches)
                            for p in plans]
                    theirs = sampler_micro_batches(name, lengths, context, n, seed)
                    theirs = [sorted(tuple(mb) for mb in theirs[k:k + n])
                              for k in range(0, len(theirs), n)]
                    assert ours == theirs, (stream, seed, name)
                row.update(stream=stream, seed=seed, packer=name, context=context, n=n)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| stream | packer | seeds | mean imbalance | worst step (max over seeds) | "
          "worst step, mean over seeds | slowest micro-batch / epoch mean, max over seeds | "
          "mean delay (steps) | empty micro-batches before the last step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for stream in args.streams.split(","):
        for name in packers:
            mine = [r for r in rows if r["stream"] == stream and r["packer"] == name]
            print(f"| {stream} | {name} | {len(mine)} | "
                  f"{statistics.fmean(r['mean_imbalance'] for r in mine):.4f} | "
                  f"{max(r['worst_imbalance'] for r in mine):.4f} | "
                  f"{statistics.fmean(r['worst_imbalance'] for r in mine):.4f} | "
                  f"{max(r['worst_slowest_vs_epoch_mean'] for r in mine):.4f} | "
                  f"{statistics.fmean(r['mean_delay'] for r in mine):.3f} | "
                  f"{sum(r['empty_before_last'] for r in mine)} |")


if __name__ == "__main__":
    main()
