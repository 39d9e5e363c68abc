#!/usr/bin/env python3
"""PyTorch's own context-parallel load balancers against wlb's default CP plan (issue 57).

Each balancer of torch.distributed.tensor.experimental._context_parallel._load_balancer, run from
the installed PyTorch, rearranges a micro-batch of documents: head-tail (what torch's context
parallel enables by default), per-document head-tail, and PTRR (processing-time round-robin, for
flex_attention) over the 128-token blocks of the document-causal mask. CP then gives rank r the
r-th of C equal runs of the rearranged sequence (the balancers' sharding contract), and
wlb.predict_cp_of_placement prices that placement as wlb.plan_shards prices its own plans: each
rank's attention from the kernel model (by default the committed H100 flash table) plus the K/V
rows it moves by the exchange wlb::ChooseExchange picks over the link. The table gives each
balancer's slowest rank over the default strategy's (adaptive) per micro-batch.

The balancers need every document a multiple of 2C tokens (per-document head-tail) and the
micro-batch a multiple of 2C and of C blocks: every length is rounded up to a multiple of 16 and
each micro-batch filled to exactly 131072 tokens (the last document cut), so every balancer runs
at C = 2, 4 and 8 on the same micro-batches adaptive plans.

PTRR reads the block mask's count of non-empty key blocks per query block: the mask is built
with BlockMask.from_kv_blocks from counts computed here from the document bounds (the test checks
them against flex_attention's create_block_mask, which would materialize the T x T mask here).

usage: python3 bench/torch_balancers.py [--docs LENGTHS_FILE] [--micro-batches N] [--seed S]
(lengths: wlb.read_lengths' formats; default: the embedded default distribution)
"""
import argparse
import sys

import numpy as np

TOKENS = 131072  # per micro-batch
MULTIPLE = 16  # 2C at C = 8
BLOCK = 128  # flex_attention's default block


def load_balancer_module():
    from torch.distributed.tensor.experimental._context_parallel import _load_balancer
    return _load_balancer


def micro_batches(lengths, count, tokens=TOKENS, multiple=MULTIPLE):
    """`count` micro-batches of exactly `tokens` tokens (document lengths, each a positive
    multiple of `multiple`) filled in order from `lengths`, each rounded up to `multiple`; the
    last document of each is cut to fit. Fewer when the lengths run out."""
    out, current, total = [], [], 0
    for length in lengths:
        length = max(multiple, -(-int(length) // multiple) * multiple)
        take = min(length, tokens - total)
        current.append(take)
        total += take
        if total == tokens:
            out.append(np.array(current, dtype=np.int64))
            if len(out) == count:
                break
            current, total = [], 0
    return out


def owner_of_rearrangement(indices, world):
    """owner[t] for a balancer's rearrange indices (position i of the rearranged sequence holds
    token indices[i]; rank r holds positions [r T / C, (r + 1) T / C))."""
    indices = np.asarray(indices).reshape(-1)
    owner = np.empty(indices.size, dtype=np.int64)
    owner[indices] = np.arange(indices.size) // (indices.size // world)
    return owner


def key_blocks_per_query_block(lengths, block=BLOCK):
    """Non-empty key blocks of every query block under the document-causal mask: query block j
    sees the key blocks from the one holding its first document's start to itself."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    first = np.arange(0, starts[-1], block)
    doc = np.searchsorted(starts, first, side="right") - 1
    return np.arange(first.size) - starts[doc] // block + 1


def head_tail(lengths, world):
    lb = load_balancer_module()
    indices = lb._HeadTailLoadBalancer(int(np.sum(lengths)), world, "cpu")._generate_indices()
    return owner_of_rearrangement(indices.numpy(), world)


def per_document_head_tail(lengths, world):
    lb = load_balancer_module()
    balancer = lb._PerDocumentHeadTailLoadBalancer([[int(x) for x in lengths]], world, "cpu")
    return owner_of_rearrangement(balancer._generate_indices().numpy(), world)


def document_causal_block_mask(lengths, block=BLOCK):
    """flex_attention's BlockMask of the document-causal mask over `block`-token blocks, built
    from its block counts (every non-empty block listed as partial: PTRR reads their number)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask
    counts = key_blocks_per_query_block(lengths, block)
    n = counts.size
    rows = np.arange(n)
    first = rows - counts + 1
    indices = first[:, None] + np.arange(n)[None, :]
    indices = np.where(indices <= rows[:, None], indices, 0)
    return BlockMask.from_kv_blocks(
        torch.from_numpy(counts.astype(np.int32)).view(1, 1, n),
        torch.from_numpy(indices.astype(np.int32)).view(1, 1, n, n), BLOCK_SIZE=block)


def ptrr(lengths, world, block=BLOCK):
    lb = load_balancer_module()
    balancer = lb._PTRRLoadBalancer(document_causal_block_mask(lengths, block), world)
    return owner_of_rearrangement(balancer._generate_indices().numpy(), world)


BALANCERS = {
    "torch head-tail": head_tail,
    "torch per-document head-tail": per_document_head_tail,
    "torch PTRR (128-token blocks)": ptrr,
}


def placements(lengths, world):
    """{balancer: owner} of one micro-batch at C = world; they do not depend on the link."""
    return {name: fn(lengths, world) for name, fn in BALANCERS.items()}


def compare(lengths, world, link_gbps, owners=None):
    """(adaptive's slowest rank ms, its most tokens on a rank over T / C, {balancer: its
    slowest rank ms}) for one micro-batch; `owners`: its placements, when already run."""
    import wlb
    plan = wlb.plan_shards(lengths, world, cp_link_gbps=link_gbps)
    mean = int(np.sum(lengths)) / world
    owners = placements(lengths, world) if owners is None else owners
    peers = {name: wlb.predict_cp_of_placement(lengths, world, owner,
                                               cp_link_gbps=link_gbps)["max_ms"]
             for name, owner in owners.items()}
    return (plan.cp_prediction["max_ms"], max(r.tokens for r in plan.ranks) / mean, peers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", help="a lengths file (default: the embedded distribution)")
    parser.add_argument("--micro-batches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    import wlb
    import torch
    if args.docs:
        lengths = wlb.read_lengths(args.docs)
        name = args.docs
    else:
        lengths = wlb.sample_default_lengths(args.micro_batches * TOKENS * 2, args.seed)
        name = f"default distribution, seed {args.seed}"
    mbs = micro_batches(lengths, args.micro_batches)
    print(f"# {len(mbs)} micro-batches of {TOKENS} tokens from {name}, lengths rounded up to "
          f"{MULTIPLE}; torch {torch.__version__}; priced by wlb.predict_cp_of_placement with "
          f"the default kernel model")
    print("| C | link GB/s | balancer | slowest rank / adaptive's: min | mean | max | "
          "adaptive's most tokens / (T / C) |")
    print("|---|---|---|---|---|---|---|")
    for world in (2, 4, 8):
        owners = [placements(mb, world) for mb in mbs]
        for link in (450.0, 25.0):
            rows = [compare(mb, world, link, o) for mb, o in zip(mbs, owners)]
            tokens = max(r[1] for r in rows)
            for peer in BALANCERS:
                ratio = np.array([r[2][peer] / r[0] for r in rows])
                print(f"| {world} | {link:g} | {peer} | {ratio.min():.4f} | {ratio.mean():.4f} | "
                      f"{ratio.max():.4f} | {tokens:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
