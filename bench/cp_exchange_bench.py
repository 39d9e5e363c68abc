"""K/V bytes that wlb.torch.cp_attention's exchange passes to the collectives, counted while it
runs over gloo, beside what plan.cp_prediction prices and what an all-gather moves, on
WLB-LLM-like 128K micro-batches, for every CP strategy and C = 2, 4, 8.

    build/pyenv/bin/python bench/cp_exchange_bench.py \
        --docs ../shared/data/doc_lengths_wlbllm_like.json [--micro-batches 12] \
        [--cp-link-gbps 450]

The document stream is packed by the wlb packer (S = 128K, N = 4 micro-batches per step), and the
first --micro-batches non-empty micro-batches are planned with every strategy of
wlb.shard_strategy_names() at C = 2, 4, 8 (causal; --cp-link-gbps steers doc-degree). C gloo
ranks (one spawned group per C) run the executor's exchange of every plan, forward
(cp_attention's row fetch) and backward (its gradient return), with
wlb.torch.collective_bytes.CollectiveBytes counting the bytes passed to torch.distributed. The
ranks move rows of 64 bytes (1 K/V head x 8 x float32, K and V); the table gives them as the
planner's 16 KiB rows (LLaMA-2-7B, bf16: 2 x 32 heads x 128 x 2 bytes) per layer, i.e. rows
counted x 16 KiB: the exchange rule (wlb::ChooseExchange) picks the same exchange for every row
size, the latency being the same for both candidates. Cells (MB, means over micro-batches):

- counted: the slowest rank's max(sent, received) in forward, as counted; = prediction: whether
  it equals cp_prediction's max_rank_bytes in every micro-batch (and backward moves the same
  bytes the other way: checked, the run fails otherwise);
- received/rank: bytes received per rank in forward (counted sum over ranks / C), beside
  cp_prediction's exchanged_bytes / C;
- all-gather: (C - 1) x rank_capacity rows per rank, what the all-gather would move;
- exchange: how many micro-batches took the row-exact exchange / the all-gather.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import wlb

S, N = 131072, 4
ROW = 2 * 1 * 8 * 4  # bytes of one token's K and V rows in the run (1 head x 8, float32)
PLANNER_ROW = 16384  # the planner's default rows (KernelModel::Default(): 32 x 128, bf16)


def micro_batches(lengths, count):
    """The first `count` non-empty micro-batches of the wlb packer on the stream (steps cut at
    N x S tokens of arrivals)."""
    packer = wlb.Packer("wlb", context=S, micro_batches=N)
    found, step, tokens = [], [], 0
    for length in lengths:
        step.append(length)
        tokens += length
        if tokens >= N * S:
            for s in packer.push(np.asarray(step, dtype=np.int64)):
                found += [mb.lengths.tolist() for mb in s.micro_batches if mb.lengths.size]
            step, tokens = [], 0
            if len(found) >= count:
                return found[:count]
    for s in packer.flush():
        found += [mb.lengths.tolist() for mb in s.micro_batches if mb.lengths.size]
    return found[:count]


def rank_main(rank, world, store, payload, out_dir):
    from wlb.torch.collective_bytes import CollectiveBytes
    from wlb.torch.cp_attention import _fetch_rows, _rank_plan, _return_grads

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    rows = []
    with CollectiveBytes() as counter:
        for lengths in payload["micro_batches"]:
            for strategy in payload["strategies"]:
                plan = wlb.plan_shards(np.asarray(lengths), world, strategy,
                                       cp_link_gbps=payload["link"])
                rp = _rank_plan(plan, rank, "cpu", ROW)
                kv = torch.ones(plan[rank].tokens, 2, 8, dtype=torch.float32)
                counter.take()
                fetched = _fetch_rows(kv, rp, None)
                forward = counter.take()
                _return_grads(torch.ones_like(fetched), rp, None)
                backward = counter.take()
                rows.append({"strategy": strategy, "kind": rp.exchange,
                             "forward": forward[:2], "backward": backward[:2]})
    dist.destroy_process_group()
    torch.save(rows, os.path.join(out_dir, f"rank{rank}.pt"))


def run(world, payload):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(world, os.path.join(tmp, "store"), payload, tmp), nprocs=world,
                 join=True)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", required=True, help="JSON list of document lengths")
    parser.add_argument("--micro-batches", type=int, default=12)
    parser.add_argument("--cp-link-gbps", type=float, default=450.0)
    args = parser.parse_args()
    if args.micro_batches < 1:
        parser.error(f"--micro-batches must be >= 1, got {args.micro_batches}")
    with open(args.docs) as f:
        lengths = json.load(f)
    mbs = micro_batches(lengths, args.micro_batches)
    strategies = wlb.shard_strategy_names()
    print(f"K/V exchange of wlb.torch.cp_attention, counted over gloo: {len(mbs)} wlb "
          f"micro-batches (S = 128K, N = {N}) from {os.path.basename(args.docs)}, causal, link "
          f"{args.cp_link_gbps:g} GB/s; MB per layer in 16 KiB K/V rows, means over micro-batches"
          f"\n")
    print("| C | strategy | counted (slowest rank) | = prediction | received/rank (counted / "
          "predicted) | all-gather/rank | counted / all-gather | exchange row-exact / "
          "all-gather |")
    print("|---|---|---|---|---|---|---|---|")
    mismatches = 0
    for world in (2, 4, 8):
        payload = {"micro_batches": mbs, "strategies": strategies, "link": args.cp_link_gbps}
        results = run(world, payload)
        for s_index, strategy in enumerate(strategies):
            counted = predicted = received = predicted_received = gathered = 0.0
            kinds = {"row-exact": 0, "all-gather": 0}
            equal = True
            for m, lengths in enumerate(mbs):
                plan = wlb.plan_shards(np.asarray(lengths), world, strategy,
                                       cp_link_gbps=args.cp_link_gbps)
                pred = plan.cp_prediction
                parts = [results[r][m * len(strategies) + s_index] for r in range(world)]
                assert all(p["strategy"] == strategy for p in parts)
                kinds[parts[0]["kind"]] += 1
                # Backward moves the forward's bytes the other way, on every rank.
                for p in parts:
                    if tuple(p["backward"]) != tuple(reversed(p["forward"])):
                        print(f"mismatch: C {world} {strategy} backward {p['backward']} forward "
                              f"{p['forward']}", file=sys.stderr)
                        mismatches += 1
                worst = max(max(p["forward"]) for p in parts) / ROW * PLANNER_ROW
                got = sum(p["forward"][1] for p in parts) / ROW * PLANNER_ROW
                equal &= (worst == pred["max_rank_bytes"] and got == pred["exchanged_bytes"]
                          and pred["exchange"] == [parts[0]["kind"]])
                counted += worst
                predicted += pred["max_rank_bytes"]
                received += got / world
                predicted_received += pred["exchanged_bytes"] / world
                gathered += (world - 1) * plan.rank_capacity * PLANNER_ROW
            mismatches += not equal
            k = len(mbs) * 1e6
            print(f"| {world} | {strategy} | {counted / k:.0f} | "
                  f"{'yes' if equal else 'NO'} ({predicted / k:.0f}) | "
                  f"{received / k:.0f} / {predicted_received / k:.0f} | {gathered / k:.0f} | "
                  f"{counted / gathered:.2f} | {kinds['row-exact']} / {kinds['all-gather']} |")
    if mismatches:
        sys.exit(f"{mismatches} counted exchanges differ from the prediction")


if __name__ == "__main__":
    main()
