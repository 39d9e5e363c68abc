"""Convergence of a tiny Hugging Face Llama trained on wlb's packing vs the baseline packer.

A real corpus: the source files of an installed Python package (default ``hypothesis``), one
document per file, byte tokens (vocabulary 256); files whose path hashes into the last tenth are
held out. Every run trains the same tiny Llama from the same seeded initialisation with
``PackedBatchSampler(pp=PP, dp=1, context=S, packer=P, seed=seed)`` + ``PackedCollate(format=
"hf")`` for ``--steps`` optimizer steps (PP micro-batches of gradient accumulation each; the loss
of a step is its labelled tokens' mean: ``num_items_in_batch``), then measures the mean per-token
loss on the held-out files (cut into S-token pieces). Packers and seeds vary; the seed sets the
initialisation and the document order, so the two packers of one seed see the same order and
differ only in how it is packed. An empty micro-batch is skipped (it holds no token).

    OMP_NUM_THREADS=1 build/pyenv/bin/python bench/hf_convergence_bench.py \
        --packers original,wlb --seeds 0,1,2 --steps 300

Prints one JSON line per run, then a Markdown table: held-out loss per packer, mean and spread
(sample standard deviation, min, max) over the seeds.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

import wlb
from wlb.torch import PackedBatchSampler, PackedCollate, PackedPieces


def corpus(package: str):
    """(train documents, held-out documents, package version): byte arrays of its .py files."""
    module = importlib.import_module(package)
    root = pathlib.Path(module.__file__).parent
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        data = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.int64)
        if data.size < 2:
            continue
        bucket = hashlib.sha256(str(path.relative_to(root)).encode()).digest()[0] % 10
        (held if bucket == 9 else train).append(data)
    return train, held, getattr(module, "__version__", "?")


def make_model(seed: int, args):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=args.context,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config)


@torch.no_grad()
def held_out_loss(model, held, context: int, args_eval_pieces: int) -> float:
    """Mean per-token loss over the held-out files, cut into pieces of at most S tokens (the
    first ``args_eval_pieces`` of them, in file order: the same set for every run)."""
    model.eval()
    collate = PackedCollate(format="hf")
    pieces = [(i, o, doc[o:o + context]) for i, doc in enumerate(held)
              for o in range(0, doc.size, context)][:args_eval_pieces]
    total, count = 0.0, 0
    for start in range(0, len(pieces), 4):
        batch = collate(pieces[start:start + 4])
        n = int((batch["labels"][:, 1:] != -100).sum())
        out = model(**batch)
        total += float(out.loss) * n
        count += n
    model.train()
    return total / count


def run(packer: str, seed: int, train, held, args) -> dict:
    model = make_model(seed, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    sampler = PackedBatchSampler([d.size for d in train], pp=args.pp, dp=1, rank=0,
                                 context=args.context, packer=packer, seed=seed)
    pieces, collate = PackedPieces(train), PackedCollate(format="hf")
    steps, epoch, losses, empty = 0, 0, [], 0
    begin = time.perf_counter()
    while steps < args.steps:
        sampler.set_epoch(epoch)
        step_batches = []
        for mb in sampler:
            step_batches.append(collate([pieces[p] for p in mb]))
            if len(step_batches) < args.pp:
                continue
            batches = [b for b in step_batches if b["input_ids"].shape[1] > 0]
            empty += len(step_batches) - len(batches)
            step_batches = []
            items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
            if items == 0:
                continue
            loss = 0.0
            for b in batches:
                out = model(**b, num_items_in_batch=items)
                out.loss.backward()
                loss += float(out.loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
            steps += 1
            if steps == args.steps:
                break
        epoch += 1
    return {"packer": packer, "seed": seed, "steps": steps, "epochs_started": epoch,
            "empty_micro_batches_skipped": empty,
            "train_loss_last20": statistics.fmean(losses[-20:]),
            "held_out_loss": held_out_loss(model, held, args.context, args.eval_pieces),
            "seconds": round(time.perf_counter() - begin, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="hypothesis")
    parser.add_argument("--packers", default="original,wlb")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-pieces", type=int, default=96)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    train, held, version = corpus(args.package)
    lengths = np.array([d.size for d in train])
    print(json.dumps({"package": args.package, "version": version, "train_files": len(train),
                      "train_bytes": int(lengths.sum()), "median_length": float(np.median(lengths)),
                      "max_length": int(lengths.max()), "held_out_files": len(held),
                      "held_out_bytes": int(sum(d.size for d in held)), "args": vars(args),
                      "torch": torch.__version__, "wlb": wlb.__version__}), flush=True)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for packer in args.packers.split(","):
            results.append(run(packer, seed, train, held, args))
            print(json.dumps(results[-1]), flush=True)
    print("\n| packer | held-out loss, mean | sample std | min | max | seeds |")
    print("|---|---|---|---|---|---|")
    for packer in args.packers.split(","):
        values = [r["held_out_loss"] for r in results if r["packer"] == packer]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"| {packer} | {statistics.fmean(values):.4f} | {spread:.4f} | {min(values):.4f} | "
              f"{max(values):.4f} | {len(values)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
