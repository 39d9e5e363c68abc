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
    """doc-degree cases with "pair_model": a tile-1 kernel model (tile "pair_tile" when given,
    so that doc-degree cuts whole-tile shards with the rest leading the first) without
    per-segment overhead and a fast link, so that even the tests' short documents get sharded
    over rank groups; with "analytic_model": the analytic curve (KernelModel.analytic()); with
    "memory_cap_percent": that memory cap (a rank may hold more than 1.01 x T / C)."""
    cap = ({"cp_memory_cap_percent": case["memory_cap_percent"]}
           if "memory_cap_percent" in case else {})
    if case.get("analytic_model"):
        return {"kernel_model": wlb.KernelModel.analytic(), **cap}
    if not case.get("pair_model"):
        return cap
    tile = case.get("pair_tile", 1)
    return {"kernel_model": wlb.KernelModel.analytic(tile_q=tile, tile_k=tile, q_half=0.0,
                                                     segment_overhead_ms=0.0),
            "cp_link_gbps": 1e5, **cap}


def case_plan(case, world):
    """The case's plan: planned for its "layer_mix" (default causal), narrowed to its "mask"."""
    lengths = np.asarray(case["lengths"], dtype=np.int64)
    plan = wlb.plan_shards(lengths, world, case["strategy"],
                           layer_mix=case.get("layer_mix", "causal"), **plan_options(case))
    return plan.for_mask(case["mask"]) if "mask" in case else plan


def _fake_flash_ops():
    """CPU stand-ins for torch.ops.aten._flash_attention_forward / _backward with their
    signatures, computed by the math backend (bottom-right causal or unmasked per segment), that
    check what the varlen kernels require of their arguments: int32 cumulative lengths, max
    lengths at least every segment's, contiguous K/V, K/V heads dividing the query heads, no
    dropout."""
    from wlb.torch.attention import math_backward, math_forward

    def check(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p):
        assert cu_q.dtype == cu_k.dtype == torch.int32
        assert max_q >= max([1] + torch.diff(cu_q).tolist())
        assert max_k >= max([1] + torch.diff(cu_k).tolist())
        assert k.is_contiguous() and v.is_contiguous() and q.stride(-1) == 1
        assert q.shape[1] % k.shape[1] == 0 and dropout_p == 0.0

    def forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
                scale=None):
        check(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p)
        out, lse = math_forward(q, k, v, cu_q, cu_k, scale, causal=is_causal)
        empty = torch.empty(0)
        return out, lse, torch.zeros(2, dtype=torch.int64), empty, empty

    def backward(grad_out, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout_p, is_causal,
                 rng_state, unused, *, scale=None):
        check(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p)
        assert grad_out.is_contiguous() and out.is_contiguous() and lse.is_contiguous()
        assert rng_state.shape == (2,)
        return math_backward(q, k, v, out, lse, grad_out, cu_q, cu_k, scale, causal=is_causal)

    return forward, backward


def _fake_varlen_attention(q, k, v, plan, rank, timings):
    """The overlapped path on its varlen part kernels (_VarlenParts), over whatever
    cp_attention.kernels._flash_ops gives (run_cases swaps in _fake_flash_ops)."""
    import importlib

    cpa = importlib.import_module("wlb.torch.cp_attention")
    rp = cpa._rank_plan(plan, rank, q.device, 2 * k.shape[1] * k.shape[2] * k.element_size())
    assert cpa._overlap_parts("varlen", rp, True) is cpa._VarlenParts
    assert cpa._overlap_parts("varlen", rp, None) is None  # opt-in until run on a GPU
    scale = 1.0 / np.sqrt(q.shape[-1])
    return cpa._OverlappedAttention.apply(q, k, v, rp, None, scale,
                                          cpa._Clock(timings, q.device), cpa._VarlenParts)


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
            if case.get("fake_varlen"):  # forward and backward over the fake varlen ops
                import importlib

                kernels = importlib.import_module("wlb.torch.cp_attention.kernels")
                real, kernels._flash_ops = kernels._flash_ops, _fake_flash_ops
            try:
                if case.get("fake_varlen"):
                    o, lse = _fake_varlen_attention(ql, kl, vl, plan, rank, timings)
                else:
                    o, lse = cp_attention(ql, kl, vl, plan, timings=timings,
                                          overlap=case.get("overlap"))
                forward = counter.take()
                (o * cp_slice(d_out, plan, rank)).sum().backward()
            finally:
                if case.get("fake_varlen"):
                    kernels._flash_ops = real
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

    layer_module = importlib.import_module("wlb.torch.cp_attention.layer")  # where it is called

    built = []
    build = layer_module._rank_plan
    layer_module._rank_plan = lambda *args: built.append(1) or build(*args)
    plan = case_plan(case, world)
    q, k, v, _ = case_tensors(case, plan.tokens)
    ql, kl, vl = (cp_slice(t, plan, rank) for t in (q, k, v))
    layer = CPAttention(plan)
    outs = [layer(ql, kl, vl), layer(ql, kl, vl)]
    module_builds = len(built)
    expected, _ = cp_attention(ql, kl, vl, plan)
    return {"builds": module_builds, "equal": all(torch.equal(o, expected) for o in outs)}


def disagreement_cases():
    """What the last rank changes in run_disagreements: every field of the agreement, and every
    check that used to raise on one rank only."""
    return ["dtype", "kv_heads", "head_dim", "heads", "strategy", "mask", "micro_batch",
            "plan", "scale", "cp_size", "mix", "meta", "nan_scale", "not_a_plan", "rows", "gqa",
            "backend"]


def run_disagreements(rank, world, payload):
    """Each case of ``payload["cases"]`` on the whole gloo group and on a subgroup of ranks 0 and
    1 (one spawn serves both sizes): the group's last rank calls cp_attention differently from
    the others, and every rank records (case, exception type, message, seconds to raise). The
    last rank lingers ``payload["linger_s"]`` seconds after raising in the "cp_size" case, so a
    rank that waited for it would take at least that long. A valid call ends every case: the
    group must still be in step. Returns {group size: outcomes}."""

    groups = [(None, world)]
    if world > 2:
        groups.append((dist.new_group([0, 1]), 2))  # every rank creates it
    out = {}
    for group, size in groups:
        if rank < size:
            out[size] = _disagreements(rank, size, group, payload)
    return out


def _disagreements(rank, world, group, payload):
    import time

    from wlb.torch import cp_attention, cp_slice

    bad = rank == world - 1
    lengths = np.array([9, 5, 14, 3], dtype=np.int64)
    base = {"seed": 4, "q_heads": 4, "kv_heads": 2, "head_dim": 4}
    plan = wlb.plan_shards(lengths, world, "per-doc")
    results = []
    for name in payload["cases"]:
        case_plan_, scale, dtype = plan, None, torch.float64
        shape = dict(base)
        if bad:
            if name == "strategy":
                case_plan_ = wlb.plan_shards(lengths, world, "per-seq")
            elif name == "mask":
                case_plan_ = wlb.plan_shards(lengths, world, "per-doc", layer_mix="window:4")
            elif name == "micro_batch":
                case_plan_ = wlb.plan_shards(np.array([9, 5, 14, 4]), world, "per-doc")
            elif name == "plan":  # same strategy, mask, C and tokens; other documents
                case_plan_ = wlb.plan_shards(np.array([14, 5, 9, 3]), world, "per-doc")
            elif name == "cp_size":
                case_plan_ = wlb.plan_shards(lengths, world + 1, "per-doc")
            elif name == "mix":
                case_plan_ = wlb.plan_shards(lengths, world, "per-doc",
                                             layer_mix="window:4x3,causal")
            elif name == "dtype":
                dtype = torch.float32
            elif name in ("kv_heads", "heads", "head_dim"):
                shape.update({"kv_heads": {"kv_heads": 1}, "heads": {"q_heads": 2},
                              "head_dim": {"head_dim": 2}}[name])
            elif name == "scale":
                scale = 0.25
            elif name == "nan_scale":
                scale = float("nan")
        rows_plan = plan if name == "cp_size" else case_plan_
        q, k, v, _ = case_tensors(shape, rows_plan.tokens)
        ql, kl, vl = (cp_slice(t, rows_plan, rank).to(dtype) for t in (q, k, v))
        if bad and name == "meta":
            ql, kl, vl = (t.to("meta") for t in (ql, kl, vl))
        if bad and name == "rows":
            ql = ql[:-1] if len(ql) else torch.zeros(1, 4, 4, dtype=dtype)
        if bad and name == "gqa":
            ql = ql[:, :3]
        call_plan = "per-doc" if bad and name == "not_a_plan" else case_plan_
        backend = "varlen" if bad and name == "backend" else None
        start = time.perf_counter()
        try:
            cp_attention(ql, kl, vl, call_plan, group, scale=scale, backend=backend)
            outcome = (name, None, None, time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 - the test compares every rank's exception
            outcome = (name, type(e).__name__, str(e), time.perf_counter() - start)
            if bad and name == "cp_size":
                time.sleep(payload["linger_s"])
        results.append(outcome)
        ql, kl, vl = (cp_slice(t, plan, rank) for t in case_tensors(base, plan.tokens)[:3])
        o, _ = cp_attention(ql, kl, vl, plan, group)  # the group is still in step
        assert o.shape[0] == plan[rank].tokens
    return results


def run_agreement_cache(rank, world, payload):
    """cp_attention called repeatedly on one plan, then with the last rank alone changing its
    plan or its head dim, then validly again; counts the agreement's collectives (all_reduce,
    all_gather) per call. Returns [(step, all_reduce calls, all_gather calls, error type,
    message)] and whether the repeated calls' outputs equal the first call's."""
    from wlb.torch import CPAttention, cp_attention, cp_slice

    counts = {"all_reduce": 0, "all_gather": 0}
    real = {name: getattr(dist, name) for name in counts}

    def counted(name):
        def call(*args, **kwargs):
            counts[name] += 1
            return real[name](*args, **kwargs)
        return call

    for name in counts:
        setattr(dist, name, counted(name))
    lengths = np.array(payload["lengths"], dtype=np.int64)
    plan = wlb.plan_shards(lengths, world, "per-doc")
    other = wlb.plan_shards(lengths[::-1].copy(), world, "per-doc")  # same tokens and C
    shape = {"seed": 5, "q_heads": 4, "kv_heads": 2, "head_dim": 4}
    bad = rank == world - 1
    steps, outs = [], []
    layer = CPAttention(plan)
    for step in ("first", "repeat", "module", "module again", "other plan", "head dim",
                 "valid again"):
        call_plan, call_shape = plan, dict(shape)
        if bad and step == "other plan":
            call_plan = other
        if bad and step == "head dim":
            call_shape["head_dim"] = 2
        q, k, v, _ = case_tensors(call_shape, call_plan.tokens)
        ql, kl, vl = (cp_slice(t, call_plan, rank) for t in (q, k, v))
        before = dict(counts)
        error = (None, None)
        try:
            if step.startswith("module"):
                outs.append(layer(ql, kl, vl))
            else:
                outs.append(cp_attention(ql, kl, vl, call_plan)[0])
        except ValueError as e:
            error = (type(e).__name__, str(e))
        steps.append((step, counts["all_reduce"] - before["all_reduce"],
                      counts["all_gather"] - before["all_gather"]) + error)
    for name, fn in real.items():
        setattr(dist, name, fn)
    return {"steps": steps, "equal": all(torch.equal(o, outs[0]) for o in outs)}
