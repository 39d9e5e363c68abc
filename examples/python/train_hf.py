"""Train a tiny random Hugging Face decoder with wlb's packing and context parallelism (CPU, gloo).

    python examples/python/train_hf.py                         # Llama, 4 ranks, every strategy
    python examples/python/train_hf.py --models llama,qwen2,mistral --dtypes float64,float32

Data: a synthetic corpus planned by ``wlb.torch.PackedBatchSampler`` (PP micro-batches per step,
one DP rank) and packed by ``PackedCollate(format="hf")`` in a DataLoader. Model: a transformers
``LlamaForCausalLM`` (or Qwen2, or Mistral with a sliding window) from a small config, random
weights, nothing downloaded. SGD, one optimiser step per sampler step (gradient accumulation over
its micro-batches, loss divided by the step's labelled tokens: ``num_items_in_batch``).

One process trains it first with the model's own attention (``--reference-attention``, sdpa) on
whole packed micro-batches (``model(**batch)``). Then ``--ranks`` gloo processes train it
context-parallel for every strategy: each micro-batch is sharded by
``wlb.torch.hf.plan_shards``, each rank runs ``model(**wlb.torch.hf.cp_inputs(...))`` with
``attn_implementation="wlb_cp"`` (K/V exchanged as ``wlb.torch.cp_attention`` does) and the
gradients are summed over the ranks. Every CP run must give the one-process losses and gradients
to the tolerance (float64 weights: 1e-6, transformers computes the loss in float32; float32:
1e-4), or the script exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import wlb
import wlb.torch.hf as wlb_hf
from wlb.torch import PackedBatchSampler, PackedCollate, PackedPieces

VOCAB = 101
TOLERANCE = {"float64": 1e-6, "float32": 1e-4}


def make_model(name: str, dtype: torch.dtype, attention: str):
    """A small decoder with grouped-query attention (4 query heads, 2 K/V heads), seeded."""
    import transformers
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  use_cache=False)
    config = {"llama": lambda: transformers.LlamaConfig(**common),
              "qwen2": lambda: transformers.Qwen2Config(**common),
              "mistral": lambda: transformers.MistralConfig(sliding_window=48, **common)}[name]()
    torch.manual_seed(0)
    model_class = transformers.AutoModelForCausalLM
    return model_class.from_config(config, attn_implementation=attention).to(dtype)


def corpus(args):
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(1, 2 * args.context, size=args.documents)
    return lengths, [rng.integers(0, VOCAB, size=int(n)) for n in lengths]


def micro_batches_by_step(args):
    """The sampler's micro-batches (PackedCollate(format="hf")), grouped per step."""
    lengths, docs = corpus(args)
    sampler = PackedBatchSampler(lengths, pp=args.micro_batches, dp=1, rank=0,
                                 context=args.context, seed=args.seed)
    loader = torch.utils.data.DataLoader(PackedPieces(docs), batch_sampler=sampler,
                                         collate_fn=PackedCollate(format="hf"))
    steps, current = [], []
    for mb in loader:
        current.append(mb)
        if len(current) == args.micro_batches:
            steps.append(current)
            current = []
            if len(steps) == args.steps:
                break
    return steps


def labelled(mb) -> int:
    """Tokens with a target: each piece's tokens but its last."""
    return int(mb["input_ids"].shape[1] - (mb["cu_seq_lens_q"].numel() - 1))


def train(args, model, forward, reduce=None):
    """SGD over the steps; per step (loss, flat gradient). ``forward(mb, items)``: the model's
    loss on a micro-batch; ``reduce(t)``: sums t over the CP ranks in place (None: one
    process)."""
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    history = []
    for step in micro_batches_by_step(args):
        opt.zero_grad()
        items = sum(labelled(mb) for mb in step)
        loss_sum = 0.0
        for mb in step:
            if mb["input_ids"].numel() == 0:
                continue  # an empty micro-batch at the epoch's end: nothing to learn from
            loss = forward(mb, items)
            loss.backward()
            loss_sum += float(loss.detach())
        loss_t = torch.tensor([loss_sum], dtype=torch.float64)
        for t in [loss_t] + [p.grad for p in model.parameters()] if reduce else []:
            reduce(t)  # in place: the sum over the CP ranks
        history.append((float(loss_t), torch.cat([p.grad.flatten() for p in model.parameters()])))
        opt.step()
    return history


def one_process(args, name, dtype):
    model = make_model(name, dtype, args.reference_attention)
    return train(args, model, lambda mb, items: model(**mb, num_items_in_batch=items).loss)


def runs(args):
    return [(d, m, s) for d in args.dtypes for m in args.models for s in args.strategies]


def cp_rank(rank, args, store, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=args.ranks, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    attention = wlb_hf.register()

    results = {}
    for dtype, name, strategy in runs(args):
        model = make_model(name, getattr(torch, dtype), attention)

        def forward(mb, items, model=model, strategy=strategy):
            plan = wlb_hf.plan_shards(mb, args.ranks, strategy, model=model)
            return model(**wlb_hf.cp_inputs(mb, plan, rank, num_items_in_batch=items)).loss

        results[dtype, name, strategy] = train(args, model, forward, dist.all_reduce)
    dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--models", default="llama", help="comma-separated: llama, qwen2, mistral")
    parser.add_argument("--strategies", default=",".join(wlb.shard_strategy_names()))
    parser.add_argument("--dtypes", default="float64", help="comma-separated: float64, float32")
    parser.add_argument("--reference-attention", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=2, help="per step (the sampler's PP)")
    parser.add_argument("--context", type=int, default=256, help="S, tokens per micro-batch")
    parser.add_argument("--documents", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.strategies = [s for s in args.strategies.split(",") if s]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = (sorted(set(args.models) - {"llama", "qwen2", "mistral"}) +
               sorted(set(args.strategies) - set(wlb.shard_strategy_names())) +
               sorted(set(args.dtypes) - set(TOLERANCE)))
    if unknown or not args.models or not args.strategies or not args.dtypes:
        parser.error(f"unknown models or strategies: {unknown}")
    for flag, value in (("--ranks", args.ranks), ("--steps", args.steps),
                        ("--micro-batches", args.micro_batches), ("--documents", args.documents)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.context < 16:
        parser.error(f"--context must be >= 16, got {args.context}")

    reference = {(d, m): one_process(args, m, getattr(torch, d))
                 for d in args.dtypes for m in args.models}
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(cp_rank, args=(args, os.path.join(tmp, "store"), tmp), nprocs=args.ranks)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False)
                 for r in range(args.ranks)]
    failed = False
    for dtype, name in reference:
        print(f"{name} ({dtype}), one process, {args.reference_attention}: losses "
              f"{' '.join(f'{loss:.6f}' for loss, _ in reference[dtype, name])}")
        worst = 0.0
        for strategy in args.strategies:
            diff = 0.0
            cp_runs = (r[dtype, name, strategy] for r in ranks)
            for (loss, grads), *cp in zip(reference[dtype, name], *cp_runs):
                for cp_loss, cp_grads in cp:
                    diff = max(diff, abs(cp_loss - loss), float((cp_grads - grads).abs().max()))
            worst = max(worst, diff)
            print(f"  CP {args.ranks} {strategy:>15}: losses "
                  f"{' '.join(f'{h[0]:.6f}' for h in ranks[0][dtype, name, strategy])}  "
                  f"largest difference {diff:.2e}")
        ok = worst <= TOLERANCE[dtype]
        failed |= not ok
        print(f"  largest difference from one process (losses and gradients): {worst:.2e} "
              f"(tolerance {TOLERANCE[dtype]:g}){'' if ok else ': FAILED'}")
    if failed:
        print("train_hf: FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
