"""wlb.torch.cp_attention's overlapped path against its sequential path over gloo, side by side in
one run: exchange, compute and total time of forward and backward on 4 CPU ranks.

    build/pyenv/bin/python bench/cp_overlap_bench.py [--rounds 7] [--docs 8] [--length 1024]

The micro-batch is --docs documents of --length tokens planned with doc-degree at C = 4 under a
pair-count kernel model and a fast link (so that documents are sharded over rank groups and the
exchange is row-exact and large); q has 8 heads, K and V 8 heads of 64, float32, on the "math"
backend (the overlapped path's). Per round, each rank runs, with a barrier before each:

- exchange alone: the executor's row-exact exchange, forward (rows fetched) and backward
  (gradients returned), blocking;
- compute alone: the attention forward and backward over the fetched keys (no exchange);
- sequential: cp_attention(overlap=False) forward and backward (exchange, then attention);
- overlapped: cp_attention(overlap=True) forward and backward (attention over the rank's own keys
  while the exchange is in flight, the received keys' part after it, merged by log-sum-exp;
  backward sends the received keys' gradients while the own keys' part runs),

and the overlapped forward's laps (local attention, wait for the exchange, remote attention).
Cells: the slowest rank's time per round, medians over --rounds rounds (ms). The forward's wait is
the exchange time the overlap left exposed; sequential minus overlapped also holds the difference
between one attention call over all keys and two over the split keys (and the machine's noise),
so it is not the overlap alone.
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
    return wlb.plan_shards(np.full(args.docs, args.length), WORLD, "doc-degree",
                           kernel_model=model, cp_link_gbps=1e5)


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

    def exchange():
        rows = _fetch_rows(kv, rp, None)
        _return_grads(torch.ones_like(rows), rp, None)

    def compute():
        ql, kk, vv = (t.clone().requires_grad_() for t in (q, keys[:, :8], keys[:, 8:]))
        out, _ = varlen_causal_attention(ql, kk, vv, rp.cu_q, rp.cu_k, rp.max_q, rp.max_k,
                                         backend="math")
        out.sum().backward()

    def attention(overlap, laps):
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        out, _ = cp_attention(ql, kl, vl, plan, overlap=overlap, timings=laps)
        out.sum().backward()

    rows = []
    for _ in range(args.rounds):
        laps = {}
        rows.append({"exchange": timed(exchange), "compute": timed(compute),
                     "sequential": timed(lambda: attention(False, {})),
                     "overlapped": timed(lambda: attention(True, laps)), **laps})
    dist.destroy_process_group()
    torch.save({"rows": rows, "exchange": rp.exchange,
                "received": sum(rp.recv_splits), "sent": len(rp.send_index),
                "local_keys": len(rp.local_key_rows), "remote_keys": len(rp.remote_key_rows)},
               os.path.join(out_dir, f"rank{rank}.pt"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024)
    args = parser.parse_args()
    for name in ("rounds", "docs", "length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    plan = plan_for(args)
    if plan.exchange(2 * 8 * 64 * 4)["kind"] != "row-exact":
        raise SystemExit("the plan's exchange is not row-exact: nothing to overlap")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(WORLD, os.path.join(tmp, "store"), args, tmp), nprocs=WORLD,
                 join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]
    print(f"cp_attention over gloo, C = {WORLD}: {args.docs} documents of {args.length} tokens, "
          f"doc-degree ({plan.strategy}), exchange {ranks[0]['exchange']}; q 8 heads, K/V 8 x 64 "
          f"float32 (4 KiB per row), math backend; {args.rounds} rounds, torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs\n")
    print("| rank | rows received | rows sent | own keys | received keys |")
    print("|---|---|---|---|---|")
    for r, res in enumerate(ranks):
        print(f"| {r} | {res['received']} | {res['sent']} | {res['local_keys']} | "
              f"{res['remote_keys']} |")
    keys = ["exchange", "compute", "sequential", "overlapped", "local_attention_s",
            "exchange_wait_s", "remote_attention_s"]
    slowest = {key: [max(res["rows"][i].get(key, 0.0) for res in ranks) * 1e3
                     for i in range(args.rounds)] for key in keys}
    med = {key: statistics.median(values) for key, values in slowest.items()}
    print("\n| exchange alone (fwd + bwd) | compute alone (fwd + bwd) | sequential total | "
          "overlapped total | sequential - overlapped |")
    print("|---|---|---|---|---|")
    print(f"| {med['exchange']:.1f} ms | {med['compute']:.1f} ms | {med['sequential']:.1f} ms | "
          f"{med['overlapped']:.1f} ms | {med['sequential'] - med['overlapped']:.1f} ms |")
    print("\nOverlapped forward, slowest rank's laps: local attention (exchange in flight) "
          f"{med['local_attention_s']:.1f} ms, wait for the exchange {med['exchange_wait_s']:.1f} "
          f"ms, received keys' attention {med['remote_attention_s']:.1f} ms")
    print("\nPer round (ms):", {key: [round(x, 1) for x in values]
                                for key, values in slowest.items()})


if __name__ == "__main__":
    main()
