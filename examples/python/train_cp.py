"""Train a tiny Llama-like model with wlb's context-parallel attention on CPU gloo ranks.

    python examples/python/train_cp.py                 # 4 ranks, every strategy, 3 steps
    python examples/python/train_cp.py --ranks 2 --steps 2 --strategies per-doc,adaptive

The data: a synthetic corpus (lengths from wlb's default distribution, scaled to S) packed by
``wlb.torch.PackedDataset``; each step's micro-batches are split over the CP ranks by
``wlb.plan_shards`` (``cp_slice``) and the attention of every layer runs through
``wlb.torch.cp_attention``. The model: 2 decoder layers (RMSNorm, RoPE from the plan's position
ids, grouped-query attention, SwiGLU MLP), float64, SGD. Each rank's loss is its tokens' share of
the micro-batch loss; the parameter gradients are summed over the CP group.

The same model is trained in one process (attention over each whole packed micro-batch) first;
every CP run must give the same losses and gradients to 1e-6 (the script exits 1 otherwise).
Printed per strategy: each rank's tokens, causal pairs and forward attention time (all layers,
all steps; the ranks share this machine's cores, so times are indicative) and the max / mean
balance of both.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import wlb
from wlb.torch import PackedDataset, cp_attention, cp_slice, varlen_causal_attention

STRATEGIES = wlb.shard_strategy_names()  # the CP strategy registry
VOCAB, DIM, Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS, HIDDEN = 97, 32, 4, 2, 8, 2, 64


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = torch.nn.RMSNorm(DIM, dtype=torch.float64)
        self.q = torch.nn.Linear(DIM, Q_HEADS * HEAD_DIM, bias=False, dtype=torch.float64)
        self.kv = torch.nn.Linear(DIM, 2 * KV_HEADS * HEAD_DIM, bias=False, dtype=torch.float64)
        self.o = torch.nn.Linear(Q_HEADS * HEAD_DIM, DIM, bias=False, dtype=torch.float64)
        self.mlp_norm = torch.nn.RMSNorm(DIM, dtype=torch.float64)
        self.up = torch.nn.Linear(DIM, 2 * HIDDEN, bias=False, dtype=torch.float64)
        self.down = torch.nn.Linear(HIDDEN, DIM, bias=False, dtype=torch.float64)

    def forward(self, x, cos, sin, attention):
        h = self.attn_norm(x)
        q = rope(self.q(h).view(-1, Q_HEADS, HEAD_DIM), cos, sin)
        k, v = self.kv(h).view(-1, 2 * KV_HEADS, HEAD_DIM).split(KV_HEADS, dim=1)
        x = x + self.o(attention(q, rope(k, cos, sin), v.contiguous()).reshape(x.shape[0], -1))
        gate, up = self.up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyLlama(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM, dtype=torch.float64)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = torch.nn.RMSNorm(DIM, dtype=torch.float64)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False, dtype=torch.float64)

    def forward(self, tokens, positions, attention):
        cos, sin = rope_tables(positions)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, attention)
        return self.head(self.norm(x))


def rope_tables(positions):
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    angles = positions.to(torch.float64)[:, None] * inv[None, :]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def rope(x, cos, sin):
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def next_token_labels(mb):
    """The next token inside the same document piece; -100 (ignored) at each piece's end."""
    labels = torch.full_like(mb["input_ids"], -100)
    labels[:-1] = mb["input_ids"][1:]
    labels[mb["cu_seqlens"][1:].long() - 1] = -100
    return labels


def corpus(context, documents, seed=0):
    rng = np.random.default_rng(seed)
    scale = 131072 // context
    lengths = np.maximum(wlb.sample_default_lengths(documents * 4000, seed=seed) // scale, 1)
    return [rng.integers(0, VOCAB, size=int(n)) for n in lengths[:documents]]


def steps(args):
    dataset = PackedDataset(corpus(args.context, args.documents),
                            packer=wlb.Packer("wlb", context=args.context,
                                              micro_batches=args.micro_batches))
    out = []
    for item in dataset:
        out.append(item["micro_batches"])
        if len(out) == args.steps:
            break
    return out


def train(args, attention_for, rank_rows=None, reduce=None):
    """SGD over the steps; returns per step (loss, flat gradient). `attention_for(mb)` gives the
    attention callable of a micro-batch, `rank_rows(mb, t)` this rank's rows of a packed tensor,
    `reduce(t)` the sum over the CP group (None: one process)."""
    torch.manual_seed(0)
    model = TinyLlama()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    history = []
    for micro_batches in steps(args):
        opt.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64)
        tokens_in_step = sum(int((next_token_labels(mb) != -100).sum()) for mb in micro_batches)
        for mb in micro_batches:
            labels = next_token_labels(mb)
            tokens, positions = mb["input_ids"], mb["position_ids"]
            attention = attention_for(mb)
            if rank_rows is not None:
                tokens, positions, labels = (rank_rows(mb, t) for t in (tokens, positions, labels))
            logits = model(tokens, positions, attention)
            loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            loss = loss / tokens_in_step
            loss.backward()  # every rank runs backward: its reduce-scatter pairs with the others'
            loss_sum += loss.detach()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if reduce is not None:
            loss_sum, grads = reduce(loss_sum), reduce(grads)
            offset = 0
            for p in model.parameters():
                p.grad.copy_(grads[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        opt.step()
        history.append((float(loss_sum), grads.clone()))
    return history


def single_process(args):
    def attention_for(mb):
        cu = mb["cu_seqlens"]
        m = int(mb["max_seqlen"])
        return lambda q, k, v: varlen_causal_attention(q, k, v, cu, cu, m, m)[0]
    return train(args, attention_for)


def cp_rank(rank, world, store, args, result_path):
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=world)
        torch.set_num_threads(1)
        results = {}
        for strategy in args.strategies:
            plans, timings, pairs, tokens = {}, {}, 0, 0

            def plan_of(mb):
                key = id(mb)
                if key not in plans:
                    plans[key] = wlb.plan_shards(mb["lengths"].numpy(), world, strategy)
                return plans[key]

            def attention_for(mb):
                nonlocal pairs, tokens
                plan = plan_of(mb)
                pairs += plan[rank].causal_pairs * LAYERS
                tokens += plan[rank].tokens
                return lambda q, k, v: cp_attention(q, k, v, plan, timings=timings)[0]

            def reduce(t):
                t = t.clone()
                dist.all_reduce(t)
                return t

            history = train(args, attention_for, lambda mb, t: cp_slice(t, plan_of(mb), rank),
                            reduce)
            results[strategy] = {"history": history, "pairs": pairs, "tokens": tokens,
                                 "attention_s": timings.get("attention_s", 0.0),
                                 "gather_s": timings.get("gather_s", 0.0)}
        dist.destroy_process_group()
        torch.save({"ok": True, "results": results}, result_path)
    except BaseException:
        torch.save({"ok": False, "error": traceback.format_exc()}, result_path)


def run_cp(args):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"rank{r}.pt") for r in range(args.ranks)]
        procs = [ctx.Process(target=cp_rank, args=(r, args.ranks, os.path.join(tmp, "store"),
                                                   args, paths[r]))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + args.timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
            p.join()
        if alive:
            raise SystemExit(f"train_cp: CP ranks still running after {args.timeout} s; killed")
        out = []
        for r, path in enumerate(paths):
            if not os.path.exists(path):
                raise SystemExit(f"train_cp: rank {r} exited ({procs[r].exitcode}) with no result")
            saved = torch.load(path, weights_only=False)
            if not saved["ok"]:
                raise SystemExit(f"train_cp: rank {r} failed:\n{saved['error']}")
            out.append(saved["results"])
        return out


def balance(values):
    values = np.asarray(values, dtype=np.float64)
    return float(values.max() / values.mean()) if values.mean() > 0 else 1.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--context", type=int, default=1024, help="S, tokens per micro-batch")
    parser.add_argument("--micro-batches", type=int, default=2, help="N per step")
    parser.add_argument("--documents", type=int, default=400)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--tolerance", type=float, default=1e-6)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    args.strategies = [s for s in args.strategies.split(",") if s]
    for name, value, low in (("--ranks", args.ranks, 1), ("--steps", args.steps, 1),
                             ("--context", args.context, 16), ("--micro-batches",
                                                                args.micro_batches, 1)):
        if value < low:
            parser.error(f"{name} must be >= {low}, got {value}")
    unknown = sorted(set(args.strategies) - set(STRATEGIES))
    if unknown or not args.strategies:
        parser.error(f"--strategies: unknown {unknown}; choose from {STRATEGIES}")

    reference = single_process(args)
    print(f"one process: losses {' '.join(f'{loss:.6f}' for loss, _ in reference)}")
    ranks = run_cp(args)
    worst = 0.0
    for strategy in args.strategies:
        for step, (loss, grads) in enumerate(reference):
            for r in range(args.ranks):
                got_loss, got_grads = ranks[r][strategy]["history"][step]
                worst = max(worst, abs(got_loss - loss), float((got_grads - grads).abs().max()))
        pairs = [ranks[r][strategy]["pairs"] for r in range(args.ranks)]
        times = [ranks[r][strategy]["attention_s"] * 1e3 for r in range(args.ranks)]
        print(f"\n{strategy}: CP {args.ranks}, {args.steps} steps, losses "
              f"{' '.join(f'{h[0]:.6f}' for h in ranks[0][strategy]['history'])}")
        print("| rank | tokens | causal pairs | attention ms (fwd) | gather ms |")
        print("|---|---|---|---|---|")
        for r in range(args.ranks):
            res = ranks[r][strategy]
            print(f"| {r} | {res['tokens']} | {res['pairs']} | {times[r]:.1f} | "
                  f"{res['gather_s'] * 1e3:.1f} |")
        print(f"balance (max / mean): causal pairs {balance(pairs):.3f}, attention time "
              f"{balance(times):.3f}")
    print(f"\nlargest difference from one process (losses and gradients): {worst:.2e}")
    if not worst <= args.tolerance:
        print(f"train_cp: FAILED, above the tolerance {args.tolerance:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
