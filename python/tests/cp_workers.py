"""Worker side of the multi-process CP attention tests (imported by spawned gloo ranks).

``spawn(world, target, payload)`` starts ``world`` processes that join one gloo group through a
file store, run ``target(rank, world, payload)`` and save what it returns; the parent waits with a
deadline, kills every child on timeout or failure, and returns the per-rank results.
"""

import os
import tempfile
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import wlb


def _main(rank, world, store, target, payload, result_dir):
    path = os.path.join(result_dir, f"rank{rank}.pt")
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=world)
        torch.set_num_threads(1)
        result = target(rank, world, payload)
        dist.destroy_process_group()
        torch.save({"ok": True, "result": result}, path)
    except BaseException:  # report everything to the parent, which fails the test
        torch.save({"ok": False, "error": traceback.format_exc()}, path)


def spawn(world, target, payload, timeout=240.0):
    """Runs target on `world` gloo ranks; returns [result of rank 0, ..., rank world-1]."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_main, args=(r, world, store, target, payload, tmp))
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join(timeout)
                if p.is_alive():
                    raise TimeoutError(f"a CP rank did not finish within {timeout} s")
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        results = []
        for r in range(world):
            path = os.path.join(tmp, f"rank{r}.pt")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} exited with code {procs[r].exitcode} and no result")
            saved = torch.load(path, weights_only=False)
            if not saved["ok"]:
                raise RuntimeError(f"rank {r} failed:\n{saved['error']}")
            results.append(saved["result"])
        return results


def case_tensors(case, tokens):
    """The whole packed micro-batch's q, k, v and output gradient for a case (same on every rank)."""
    g = torch.Generator().manual_seed(case["seed"])
    shape_q = (tokens, case["q_heads"], case["head_dim"])
    shape_kv = (tokens, case["kv_heads"], case["head_dim"])
    q = torch.randn(shape_q, generator=g, dtype=torch.float64)
    k = torch.randn(shape_kv, generator=g, dtype=torch.float64)
    v = torch.randn(shape_kv, generator=g, dtype=torch.float64)
    d_out = torch.randn(shape_q, generator=g, dtype=torch.float64)
    return q, k, v, d_out


def plan_options(case):
    """doc-degree cases with "pair_model": a tile-1 kernel model without per-segment overhead and
    a fast link, so that even the tests' short documents get sharded over rank groups."""
    if not case.get("pair_model"):
        return {}
    return {"kernel_model": wlb.KernelModel.analytic(tile_q=1, tile_k=1, q_half=0.0,
                                                     segment_overhead_ms=0.0),
            "cp_link_gbps": 1e5}


def case_plan(case, world):
    """The case's plan: planned for its "layer_mix" (default causal), narrowed to its "mask"."""
    lengths = np.asarray(case["lengths"], dtype=np.int64)
    plan = wlb.plan_shards(lengths, world, case["strategy"],
                           layer_mix=case.get("layer_mix", "causal"), **plan_options(case))
    return plan.for_mask(case["mask"]) if "mask" in case else plan


def run_cases(rank, world, cases):
    """Each case: this rank's output, lse and dq/dk/dv rows (packed order via token_indices), and
    the bytes it passed to the collectives in forward and in backward."""
    from wlb.torch import cp_attention, cp_slice
    from wlb.torch.collective_bytes import CollectiveBytes

    out = []
    with CollectiveBytes() as counter:
        for case in cases:
            plan = case_plan(case, world)
            q, k, v, d_out = case_tensors(case, plan.tokens)
            ql, kl, vl = (cp_slice(t, plan, rank).requires_grad_() for t in (q, k, v))
            counter.take()  # the agreement all-reduce is not an exchange collective
            timings = {}
            o, lse = cp_attention(ql, kl, vl, plan, timings=timings,
                                  overlap=case.get("overlap"))
            forward = counter.take()
            (o * cp_slice(d_out, plan, rank)).sum().backward()
            backward = counter.take()
            out.append({"rows": plan[rank].token_indices, "out": o.detach(), "lse": lse,
                        "dq": ql.grad, "dk": kl.grad, "dv": vl.grad, "strategy": plan.strategy,
                        "forward": forward, "backward": backward,
                        "overlapped": "local_attention_s" in timings})
    return out


def run_module_twice(rank, world, case):
    """CPAttention called twice (two layers) on one plan: the outputs of plain cp_attention, and
    how often this rank's index tensors were built."""
    import importlib

    from wlb.torch import CPAttention, cp_attention, cp_slice

    cpa = importlib.import_module("wlb.torch.cp_attention")  # the module, not the function

    built = []
    build = cpa._rank_plan
    cpa._rank_plan = lambda *args: built.append(1) or build(*args)
    plan = case_plan(case, world)
    q, k, v, _ = case_tensors(case, plan.tokens)
    ql, kl, vl = (cp_slice(t, plan, rank) for t in (q, k, v))
    layer = CPAttention(plan)
    outs = [layer(ql, kl, vl), layer(ql, kl, vl)]
    module_builds = len(built)
    expected, _ = cp_attention(ql, kl, vl, plan)
    return {"builds": module_builds, "equal": all(torch.equal(o, expected) for o in outs)}


def run_bad_inputs(rank, world, _payload):
    """Bad plans and tensors raise on every rank without hanging; the group stays usable."""
    from wlb.torch import cp_attention, cp_slice

    messages = []
    lengths = np.array([5, 9, 3], dtype=np.int64)
    q, k, v, _ = case_tensors({"seed": 1, "q_heads": 4, "kv_heads": 2, "head_dim": 4}, 17)
    wrong_size = wlb.plan_shards(lengths, world + 1, "per-doc")
    plan = wlb.plan_shards(lengths, world, "per-doc")
    ql, kl, vl = (cp_slice(t, plan, rank) for t in (q, k, v))
    attempts = [
        ("wrong rank count", lambda: cp_attention(ql, kl, vl, wrong_size)),
        # Only the last rank's tensors are wrong: every rank must raise, none may hang.
        ("rows", lambda: cp_attention(ql if rank != world - 1 else ql[:-1] if len(ql) else
                                      torch.zeros(1, 4, 4, dtype=torch.float64), kl, vl, plan)),
        ("heads", lambda: cp_attention(ql[:, :3], kl, vl, plan)),
        ("dtype", lambda: cp_attention(ql.float(), kl, vl, plan)),
        ("backend", lambda: cp_attention(ql, kl, vl, plan, backend="varlen")),
        ("not a plan", lambda: cp_attention(ql, kl, vl, "per-doc")),
    ]
    for what, call in attempts:
        try:
            call()
            messages.append((what, None))
        except (ValueError, TypeError) as e:
            messages.append((what, str(e)))
    o, _ = cp_attention(ql, kl, vl, plan)  # still in step with the other ranks
    return {"messages": messages, "rows": o.shape[0]}
