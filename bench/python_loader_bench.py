#!/usr/bin/env python3
"""Throughput of the wlb loader against a plain DataLoader over the same synthetic corpus.

One DP rank's loader (rank 0 of PP x DP) over an in-memory tokenized corpus (int32 tokens, lengths
from the embedded WLB-LLM-like distribution scaled to the context): the wlb loader is
PackedBatchSampler (packing + DP assignment by the 1F1B model, in the main process) + PackedPieces
+ PackedCollate in `workers` processes; the plain loader is the same PackedPieces + PackedCollate
with a precomputed batch sampler of consecutive pieces, up to S tokens per micro-batch (what a
loader without planning does). Both produce the same tensors per micro-batch. Also reported: the
sampler alone (planning only: where the main process's time goes) and fetch + collate alone.

    build/pyenv/bin/python bench/python_loader_bench.py [--steps 64] [--context 32768]
"""

import argparse
import time

import numpy as np
import torch

import wlb
from wlb.torch import PackedBatchSampler, PackedCollate, PackedPieces


class Corpus:
    """Map-style tokenized corpus: one int32 token array and document offsets."""

    def __init__(self, lengths, seed):
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.tokens = np.random.default_rng(seed).integers(0, 32000, int(self.offsets[-1]),
                                                           dtype=np.int32)

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


def plain_batches(lengths, context, dp, rank, seed):
    """Consecutive pieces (the sampler's epoch order), micro-batches of up to S tokens, every
    dp-th one for this rank."""
    order = np.random.default_rng([seed, 0]).permutation(len(lengths))
    p = wlb.make_documents(lengths[order], context)
    ids, offs, lens = order[p.ids].tolist(), p.offsets.tolist(), p.lengths.tolist()
    batches, current, tokens = [], [], 0
    for piece in zip(ids, offs, lens):
        if tokens + piece[2] > context and current:
            batches.append(current)
            current, tokens = [], 0
        current.append(piece)
        tokens += piece[2]
    if current:
        batches.append(current)
    return batches[rank::dp]


def rate(loader_factory, repeats):
    """Best steady micro-batches per second over `repeats` passes: timed from the first batch
    (worker start-up, the same for both loaders, is left out) to the last."""
    best = 0.0
    for _ in range(repeats):
        it = iter(loader_factory())
        next(it)
        start = time.perf_counter()
        count = sum(1 for _ in it)
        best = max(best, count / (time.perf_counter() - start))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=64, help="steps of N x S tokens in the corpus")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    n = args.pp * args.dp
    base = wlb.sample_default_lengths(args.steps * n * 131072, args.seed)
    lengths = np.maximum(1, base * args.context // 131072).astype(np.int64)
    corpus = Corpus(lengths, args.seed)
    pieces = PackedPieces(corpus)
    # packer="wlb": the packer its committed results were measured with (the default until
    # wlb-lookahead became it)
    sampler = lambda: PackedBatchSampler(lengths, pp=args.pp, dp=args.dp, rank=0,
                                         context=args.context, seed=args.seed, packer="wlb")
    plain = plain_batches(lengths, args.context, args.dp, 0, args.seed)
    print(f"corpus: {len(lengths)} documents, {int(lengths.sum())} tokens; S = {args.context}, "
          f"PP = {args.pp}, DP = {args.dp} (rank 0); {torch.get_num_threads()} torch threads")

    start = time.perf_counter()
    planned = sum(1 for _ in sampler())
    plan_s = time.perf_counter() - start
    collate = PackedCollate()
    start = time.perf_counter()
    for batch in sampler():
        collate([pieces[p] for p in batch])
    fetch_s = time.perf_counter() - start - plan_s
    print(f"sampler alone (packing + DP assignment, main process): {planned} micro-batches in "
          f"{plan_s:.3f} s = {planned / plan_s:.0f} micro-batches/s; fetch + collate alone "
          f"(one process): {max(fetch_s, 0.0):.3f} s")

    print("| workers | wlb micro-batches/s | wlb steps/s | plain micro-batches/s | wlb / plain |")
    print("|---------|---------------------|-------------|-----------------------|-------------|")
    for workers in [int(w) for w in args.workers.split(",")]:
        kw = dict(collate_fn=PackedCollate(), num_workers=workers,
                  timeout=300 if workers else 0)
        wlb_rate = rate(lambda: torch.utils.data.DataLoader(pieces, batch_sampler=sampler(),
                                                               **kw), args.repeats)
        plain_rate = rate(lambda: torch.utils.data.DataLoader(pieces, batch_sampler=plain,
                                                                 **kw), args.repeats)
        print(f"| {workers:7d} | {wlb_rate:19.0f} | {wlb_rate / args.pp:11.1f} | "
              f"{plain_rate:21.0f} | {wlb_rate / plain_rate:11.2f} |")


if __name__ == "__main__":
    main()
