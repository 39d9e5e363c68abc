"""wlb.torch.cp_attention's overlapped path against its sequential path over gloo, side by side in
one run: exchange, compute, wait and total time of forward and of backward on 4 CPU ranks.

    build/pyenv/bin/python bench/cp_overlap_bench.py [--rounds 7] [--docs 8] [--length 1024]
        [--strategy doc-degree] [--mask causal]

The micro-batch is --docs documents of --length tokens planned with --strategy at C = 4 under
--mask ("causal", "window:W", "chunk:C") with a pair-count kernel model and a fast link (so that
doc-degree shards documents over rank groups and its exchange is row-exact and large; per-seq
under a causal mask takes the all-gather); q has 8 heads, K and V 8 heads of 64, float32, on the
"math" backend (the overlapped path's). Per round, each rank runs, with a barrier before each
timed part:

- exchange alone: the executor's exchange, forward (rows fetched) and backward (gradients
  returned), blocking;
- compute alone: the attention forward and backward over the fetched keys (no exchange);
- sequential: cp_attention(overlap=False) forward, then backward (exchange, then attention;
  backward: attention, then the gradients' exchange);
- overlapped: cp_attention(overlap=True) forward, then backward (attention over the rank's own
  keys while the exchange is in flight, the fetched keys' part after it, merged by log-sum-exp;
  backward: the fetched keys' gradients first, sent back while the own keys' part runs),

with the laps cp_attention records: forward local attention / wait for the exchange / fetched
keys' attention; backward fetched keys' part / own keys' part / wait for the gradients; the
sequential backward's blocking exchange. Cells: the slowest rank's time per round, medians over
--rounds rounds (ms). The waits are the exchange time the overlap left exposed; sequential minus
overlapped also holds the difference between one attention call over all keys and two over the
split keys (and the machine's noise), so it is not the overlap alone.
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import wlb

WORLD = 4


def plan_for(args):
    model = wlb.KernelModel.analytic(tile_q=1, tile_k=1, q_half=0.0, segment_overhead_ms=0.0)
    return wlb.plan_shards(np.full(args.docs, args.length), WORLD, args.strategy,
                           layer_mix=args.mask, kernel_model=model, cp_link_gbps=1e5)


def timed(fn):
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rank_main(rank, world, store, args, out_dir):
    from wlb.torch import cp_attention, cp_slice
    from wlb.torch.attention import varlen_causal_attention
    from wlb.torch.cp_attention import _fetch_rows, _rank_plan, _return_grads

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    plan = plan_for(args)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(plan.tokens, 8, 64, generator=g) for _ in range(3))
    q, k, v = (cp_slice(t, plan, rank) for t in (q, k, v))
    rp = _rank_plan(plan, rank, "cpu", 2 * 8 * 64 * 4)
    kv = torch.cat([k, v], dim=1)
    fetched = _fetch_rows(kv, rp, None)
    keys = fetched.index_select(0, rp.key_rows)

    def exchange_forward():
        return _fetch_rows(kv, rp, None)

    def exchange_backward():
        _return_grads(grad_rows, rp, None)

    def compute_forward():
        ql, kk, vv = (t.clone().requires_grad_() for t in (q, keys[:, :8], keys[:, 8:]))
        window = {"window": rp.window} if rp.window else {}
        out, _ = varlen_causal_attention(ql, kk, vv, rp.cu_q, rp.cu_k, rp.max_q, rp.max_k,
                                         backend="math", **window)
        return out

    def attention_forward(overlap, laps):
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        out, _ = cp_attention(ql, kl, vl, plan, overlap=overlap, timings=laps)
        return out

    grad_rows = torch.ones_like(fetched)
    rows = []
    for _ in range(args.rounds):
        row = {}
        for name, forward in (("exchange", exchange_forward), ("compute", compute_forward)):
            box = []
            row[f"{name}_fwd"] = timed(lambda: box.append(forward()))
            backward = exchange_backward if name == "exchange" else box[0].sum().backward
            row[f"{name}_bwd"] = timed(backward)
        for name, overlap in (("sequential", False), ("overlapped", True)):
            laps, box = {}, []
            row[f"{name}_fwd"] = timed(lambda: box.append(attention_forward(overlap, laps)))
            row[f"{name}_bwd"] = timed(box[0].sum().backward)
            row.update({f"{name}:{key}": value for key, value in laps.items()})
        rows.append(row)
    dist.destroy_process_group()
    torch.save({"rows": rows, "exchange": rp.exchange,
                "received": rp.fetched_rows - (rp.capacity if rp.exchange == "all-gather" else 0),
                "sent": (rp.cp_size - 1) * rp.capacity if rp.exchange == "all-gather"
                else len(rp.send_index),
                "local_keys": len(rp.local_key_rows), "remote_keys": len(rp.remote_key_rows),
                "remote_queries": len(rp.remote_q_rows)},
               os.path.join(out_dir, f"rank{rank}.pt"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--strategy", default="doc-degree", choices=wlb.shard_strategy_names())
    parser.add_argument("--mask", default="causal")
    args = parser.parse_args()
    for name in ("rounds", "docs", "length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        plan = plan_for(args)
    except ValueError as e:
        parser.error(str(e))
    exchange = plan.exchange(2 * 8 * 64 * 4)
    if exchange["kind"] == "row-exact" and not exchange["recv_rows"].any():
        raise SystemExit("the plan moves no rows: nothing to overlap")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(WORLD, os.path.join(tmp, "store"), args, tmp), nprocs=WORLD,
                 join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]
    print(f"cp_attention over gloo, C = {WORLD}: {args.docs} documents of {args.length} tokens, "
          f"{args.strategy} ({plan.strategy}), mask {plan.mask}, exchange "
          f"{ranks[0]['exchange']}; q 8 heads, K/V 8 x 64 float32 (4 KiB per row), math "
          f"backend; {args.rounds} rounds, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| rank | rows fetched | rows sent | own keys | fetched keys | queries seeing fetched "
          "keys |")
    print("|---|---|---|---|---|---|")
    for r, res in enumerate(ranks):
        print(f"| {r} | {res['received']} | {res['sent']} | {res['local_keys']} | "
              f"{res['remote_keys']} | {res['remote_queries']} |")
    keys = sorted({key for res in ranks for row in res["rows"] for key in row})
    slowest = {key: [max(res["rows"][i].get(key, 0.0) for res in ranks) * 1e3
                     for i in range(args.rounds)] for key in keys}
    med = {key: statistics.median(values) for key, values in slowest.items()}
    m = lambda key: f"{med.get(key, 0.0):.1f}"
    print("\nSlowest rank, median ms:\n")
    print("| pass | exchange alone | compute alone | sequential | overlapped | sequential's "
          "exchange (blocking) | overlapped's wait (exposed exchange) | sequential - overlapped |")
    print("|---|---|---|---|---|---|---|---|")
    for phase, seq_exchange, wait in (("fwd", "sequential:gather_s", "overlapped:exchange_wait_s"),
                                      ("bwd", "sequential:backward_exchange_s",
                                       "overlapped:backward_wait_s")):
        print(f"| {'forward' if phase == 'fwd' else 'backward'} | {m('exchange_' + phase)} | "
              f"{m('compute_' + phase)} | {m('sequential_' + phase)} | {m('overlapped_' + phase)} "
              f"| {m(seq_exchange)} | {m(wait)} | "
              f"{med['sequential_' + phase] - med['overlapped_' + phase]:.1f} |")
    total = lambda name: statistics.median(
        [a + b for a, b in zip(slowest[name + "_fwd"], slowest[name + "_bwd"])])
    print(f"| total | {total('exchange'):.1f} | {total('compute'):.1f} | {total('sequential'):.1f} "
          f"| {total('overlapped'):.1f} | | | "
          f"{total('sequential') - total('overlapped'):.1f} |")
    print(f"\nOverlapped laps (slowest rank, median ms): forward: own keys' attention (exchange in "
          f"flight) {m('overlapped:local_attention_s')}, wait {m('overlapped:exchange_wait_s')}, "
          f"fetched keys' attention {m('overlapped:remote_attention_s')}; backward: fetched keys' "
          f"part {m('overlapped:backward_remote_s')}, own keys' part (gradients in flight) "
          f"{m('overlapped:backward_local_s')}, wait {m('overlapped:backward_wait_s')}")
    print("\nPer round (ms):", {key: [round(x, 1) for x in values]
                                for key, values in slowest.items()})


if __name__ == "__main__":
    main()
