#!/usr/bin/env python3
"""wlb.torch's CP attention on one device: a correctness check, then per-rank times per strategy
on the micro-batches and plans of wlb_cuda_cp_bench, for a side-by-side comparison.

1. Check (``--no-check`` skips it). On a micro-batch of --check-tokens tokens:
   - ``cp_attention`` itself in a one-rank process group (NCCL on CUDA, gloo on the CPU: NCCL
     allows one rank per GPU, so one GPU runs C = 1; the C = 2/4/8 collectives are proven by the
     gloo tests in CI), output and dQ/dK/dV;
   - every strategy at every --cp, its ranks emulated one after another on this device (below),
     their outputs and gradients reassembled over the whole micro-batch;
   each against the ``math`` backend in float32 (float64 inputs: float64) over the whole
   micro-batch, per document causal. The relative L2 error must stay under --tolerance (default
   2e-2 for half types, 1e-10 for float64), else the script exits 1.
2. Timing. Micro-batch i is wlb_cuda_cp_bench's (``WlbLikeMicroBatch(tokens, seed + i)``: the
   default distribution's lengths from ``wlb.sample_default_lengths``, the last one cut at
   --tokens), planned by ``wlb.plan_shards`` for each C and strategy with the same kernel model
   (--profile, else the analytic default of --heads / --head-dim) and, for adaptive, cp_bench's
   ranking by kernel time alone (``KERNEL_TIME_ONLY``), so the plans are cp_bench's.
   Each rank's attention is what ``cp_attention`` runs after its all-gather: its query rows
   (``token_indices``) and key rows (``key_indices``, the gathered rows ``key_rows`` select), the
   backend ``cp_attention`` picks for the device and dtype (``varlen`` on CUDA for bf16), one rank
   at a time (cp_bench's ``isolate_ranks``), forward and backward (``torch.autograd.grad``) timed
   with CUDA events: --warmup untimed, then the median of --iters. No collectives are timed.
   Apart from the attention, each rank's key-row copies are timed the same way (``gather_ms``:
   its K and V rows ``index_select``-ed into one contiguous run, every segment's keys [0, end);
   ``key_gradients_ms``: as many dK/dV rows ``index_add_``-ed back in float32), with ``key_rows``.
   One JSON line per (C, micro-batch, strategy), cp_bench's fields plus ``backend``.
3. --compare FILE...: cp_bench JSON lines of the same run's cp stage: summed slowest-rank ms per
   (C, strategy) for wlb's kernels next to PyTorch's. Rows are paired only where both predicted the
   same per-rank forward ms (the same plan under the same model); the rest are counted, not used.

  python3 torch_cp_bench.py --cp 2,4,8 --micro-batches 4 --json torch_cp.jsonl \\
      [--profile kernel_profile_flash.csv] [--compare cp_bench_c2.jsonl ...]

Exit status: 0; 1 when a check failed; 2 for bad arguments; 3 without PyTorch or the device.
Output is line-buffered and every JSON line flushed, so a run killed by `timeout` keeps its rows.
"""
import argparse
import itertools
import json
import socket
import statistics
import sys
import time
from collections import defaultdict

STRATEGIES = ("per-seq", "per-seq-ordered", "per-doc", "hybrid", "adaptive")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
# cp_bench plans adaptive with bench::KernelTimeOnly (a link so fast that the exchange vanishes:
# it times each rank's kernels without the exchange); with the default link adaptive often picks
# another plan, whose rows then pair with none of cp_bench's.
KERNEL_TIME_ONLY = {"cp_link_gbps": 1e6, "cp_latency_us": 0.0}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=131072)
    p.add_argument("--cp", default="2,4,8", help="comma-separated CP sizes")
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--profile", default="", help="kernel profile CSV (q_len,kv_len,ms)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--backend", default=None, help="attention backend (default: by device)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--check-tokens", type=int, default=8192)
    p.add_argument("--tolerance", type=float, default=None)
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--json", default="")
    p.add_argument("--compare", nargs="*", default=[])
    a = p.parse_args(argv)
    try:
        a.cp = [int(c) for c in a.cp.split(",")]
    except ValueError:
        p.error(f"--cp must be comma-separated integers, got {a.cp!r}")
    a.strategies = a.strategies.split(",")
    bad = [s for s in a.strategies if s not in STRATEGIES]
    if bad:
        p.error(f"unknown strategies {bad}; allowed: {','.join(STRATEGIES)}")
    for name in ("tokens", "micro_batches", "heads", "kv_heads", "head_dim", "iters",
                 "check_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if min(a.cp) < 1 or a.warmup < 0 or a.heads % a.kv_heads:
        p.error("--cp >= 1, --warmup >= 0 and --heads a multiple of --kv-heads are needed")
    return a


def wlb_like_micro_batch(wlb, tokens, seed, longest=None):
    """The lengths of cp_workload.h's WlbLikeMicroBatch(tokens, seed); with ``longest``, every
    document is first cut to at most that many tokens (the check's mix of several documents)."""
    lengths, total = [], 0
    for length in wlb.sample_default_lengths(tokens if longest is None else 64 * tokens, seed):
        take = min(int(length), longest or tokens, tokens - total)
        if take <= 0:
            break
        lengths.append(take)
        total += take
    return lengths


def plan_like_cp_bench(wlb, lengths, c, strategy, model):
    """The plan wlb_cuda_cp_bench measures for ``strategy`` on these lengths."""
    options = KERNEL_TIME_ONLY if strategy == "adaptive" else {}
    return wlb.plan_shards(lengths, c, strategy, model, **options)


class Rank:
    """One rank's inputs under a plan: what cp_attention's attention call sees on that rank."""

    def __init__(self, torch, plan, r, device):
        rk = plan.ranks[r]
        self.tokens = int(rk.tokens)
        self.rows = torch.from_numpy(rk.token_indices).to(device)
        self.keys = torch.from_numpy(rk.key_indices).to(device)
        self.cu_q = torch.from_numpy(rk.cu_seqlens_q).to(device)
        self.cu_k = torch.from_numpy(rk.cu_seqlens_k).to(device)
        self.max_q, self.max_k = int(rk.max_seqlen_q), int(rk.max_seqlen_k)
        self.predicted_ms = float(rk.predicted_ms)


def run_rank(torch, attention, rank, q, k, v, d_out, backend):
    """Forward and backward of one rank; returns (out, lse, dq, dk, dv) for its rows / keys."""
    qr = q.index_select(0, rank.rows).requires_grad_()
    kr = k.index_select(0, rank.keys).requires_grad_()
    vr = v.index_select(0, rank.keys).requires_grad_()
    out, lse = attention(qr, kr, vr, rank.cu_q, rank.cu_k, rank.max_q, rank.max_k,
                         backend=backend)
    dq, dk, dv = torch.autograd.grad(out, (qr, kr, vr), d_out.index_select(0, rank.rows))
    return out, lse, dq, dk, dv


def rel_err(torch, got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    return float(torch.linalg.vector_norm(got - ref) /
                 max(float(torch.linalg.vector_norm(ref)), 1e-30))


def random_inputs(torch, tokens, a, device, dtype, seed):
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(heads):
        return torch.rand((tokens, heads, a.head_dim), generator=g, device=device,
                          dtype=torch.float32).mul_(2).sub_(1).to(dtype)

    return rand(a.heads), rand(a.kv_heads), rand(a.kv_heads), rand(a.heads)


def reference(torch, attention, lengths, q, k, v, d_out):
    """The math backend over the whole micro-batch in float32 (float64 stays float64)."""
    ref_type = torch.float64 if q.dtype == torch.float64 else torch.float32
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)),
                      dtype=torch.int32, device=q.device)
    qq, kk, vv = (t.to(ref_type).requires_grad_() for t in (q, k, v))
    out, lse = attention(qq, kk, vv, cu, cu, max(lengths), max(lengths), backend="math")
    grads = torch.autograd.grad(out, (qq, kk, vv), d_out.to(ref_type))
    return (out, lse) + tuple(grads)


def check(torch, wlb, attention, a, device, dtype, model, tolerance):
    """Section 1 of the docstring; returns the number of failed comparisons."""
    from wlb.torch import cp_attention
    from wlb.torch.cp_attention import describe_backend
    import torch.distributed as dist

    lengths = wlb_like_micro_batch(wlb, a.check_tokens, a.seed, longest=max(1, a.check_tokens // 4))
    n = sum(lengths)
    q, k, v, d_out = random_inputs(torch, n, a, device, dtype, a.seed)
    ref = reference(torch, attention, lengths, q, k, v, d_out)
    names = ("out", "lse", "dq", "dk", "dv")
    failed = 0

    def verdict(where, got):
        nonlocal failed
        errs = {name: rel_err(torch, g, r) for name, g, r in zip(names, got, ref)}
        worst = max(errs.values())
        ok = worst <= tolerance
        failed += not ok
        print(f"check {where}: max relative error {worst:.2e} "
              f"({', '.join(f'{k} {e:.1e}' for k, e in errs.items())}) "
              f"{'OK' if ok else f'FAILED (tolerance {tolerance:g})'}")

    # cp_attention in a one-rank group over the real collectives.
    backend_name = "nccl" if torch.device(device).type == "cuda" else "gloo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend_name, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        plan = wlb.plan_shards(lengths, 1, "per-doc", model)
        rows = torch.from_numpy(plan.ranks[0].token_indices).to(device)
        qq, kk, vv = (t.index_select(0, rows).requires_grad_() for t in (q, k, v))
        out, lse = cp_attention(qq, kk, vv, plan, backend=a.backend)
        grads = torch.autograd.grad(out, (qq, kk, vv), d_out.index_select(0, rows))
        inv = torch.empty_like(rows)
        inv[rows] = torch.arange(n, device=device)
        got = (out[inv], lse[:, inv]) + tuple(g[inv] for g in grads)
        info = describe_backend(q.device, q.dtype, a.backend)
        verdict(f"cp_attention, {backend_name} group of 1, {info['backend']} backend, "
                f"{info['dtype']}, {len(lengths)} documents / {n} tokens", got)
    finally:
        dist.destroy_process_group()

    # Every strategy and CP size, ranks emulated: reassembled output and gradients.
    for c in a.cp:
        for strategy in a.strategies:
            plan = plan_like_cp_bench(wlb, lengths, c, strategy, model)
            out = torch.zeros_like(ref[0], dtype=q.dtype)
            lse = torch.zeros_like(ref[1])
            acc = ref[2].dtype  # gradients summed over ranks at the reference's precision
            dq, dk, dv = (torch.zeros_like(t, dtype=acc) for t in (q, k, v))
            for r in range(c):
                rank = Rank(torch, plan, r, device)
                if rank.tokens == 0:
                    continue
                o, l, gq, gk, gv = run_rank(torch, attention, rank, q, k, v, d_out, a.backend)
                out[rank.rows], lse[:, rank.rows] = o.detach(), l.to(lse.dtype)
                dq[rank.rows] = gq.to(acc)
                dk.index_add_(0, rank.keys, gk.to(acc))
                dv.index_add_(0, rank.keys, gv.to(acc))
            verdict(f"C={c} {strategy} ({plan.strategy}), ranks emulated", (out, lse, dq, dk, dv))
    return failed


def time_ms(torch, device, fn, warmup, iters):
    """Median forward and backward ms of fn() -> (forward thunk result, backward thunk)."""
    cuda = torch.device(device).type == "cuda"
    fwd, bwd = [], []
    for i in range(warmup + iters):
        if cuda:
            e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            e[0].record()
            backward = fn()
            e[1].record()
            backward()
            e[2].record()
            torch.cuda.synchronize()
            f, b = e[0].elapsed_time(e[1]), e[1].elapsed_time(e[2])
        else:
            t0 = time.perf_counter()
            backward = fn()
            t1 = time.perf_counter()
            backward()
            t2 = time.perf_counter()
            f, b = 1e3 * (t1 - t0), 1e3 * (t2 - t1)
        if i >= warmup:
            fwd.append(f)
            bwd.append(b)
    return statistics.median(fwd), statistics.median(bwd)


def bench(torch, wlb, attention, a, device, dtype, model, js):
    """Section 2 of the docstring: prints per-rank rows and per-C sums, writes JSON lines."""
    from wlb.torch.attention import select_backend
    backend = select_backend(torch.device(device), dtype, a.backend)
    q, k, v, d_out = random_inputs(torch, a.tokens, a, device, dtype, a.seed + 1)
    dk_sum, dv_sum = (torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (k, v))
    totals = defaultdict(float)
    for c in a.cp:
        err = defaultdict(list)
        oracle = 0.0
        for i in range(a.micro_batches):
            lengths = wlb_like_micro_batch(wlb, a.tokens, a.seed + i)
            best = None
            for strategy in a.strategies:
                plan = plan_like_cp_bench(wlb, lengths, c, strategy, model)
                fwd, bwd, pred, keys, gather, key_grads = [], [], [], [], [], []
                for r in range(c):
                    rank = Rank(torch, plan, r, device)
                    pred.append(rank.predicted_ms)
                    keys.append(int(rank.keys.numel()))
                    if rank.tokens == 0:
                        fwd.append(0.0)
                        bwd.append(0.0)
                        gather.append(0.0)
                        key_grads.append(0.0)
                        continue

                    def copies(rank=rank):
                        kk, vv = k.index_select(0, rank.keys), v.index_select(0, rank.keys)
                        return lambda: (dk_sum.index_add_(0, rank.keys, kk.float()),
                                        dv_sum.index_add_(0, rank.keys, vv.float()))

                    g, kg = time_ms(torch, device, copies, a.warmup, a.iters)
                    gather.append(g)
                    key_grads.append(kg)
                    qr = q.index_select(0, rank.rows)
                    kr, vr = k.index_select(0, rank.keys), v.index_select(0, rank.keys)
                    dr = d_out.index_select(0, rank.rows)

                    def step(qr=qr, kr=kr, vr=vr, dr=dr, rank=rank):
                        qq, kk, vv = (t.detach().requires_grad_() for t in (qr, kr, vr))
                        out, _ = attention(qq, kk, vv, rank.cu_q, rank.cu_k, rank.max_q,
                                           rank.max_k, backend=backend)
                        return lambda: torch.autograd.grad(out, (qq, kk, vv), dr)

                    f, b = time_ms(torch, device, step, a.warmup, a.iters)
                    fwd.append(f)
                    bwd.append(b)
                    if f > 0:
                        err[strategy].append(abs(rank.predicted_ms - f) / f)
                total = [f + b for f, b in zip(fwd, bwd)]
                max_ms = max(total)
                mean = sum(total) / len(total)
                imbalance = max_ms / mean if mean > 0 else 1.0
                totals[(c, strategy)] += max_ms
                if strategy != "adaptive":
                    best = max_ms if best is None else min(best, max_ms)
                chosen = plan.strategy
                print(f"C={c} mb {i} {strategy:<15} ({chosen:<15}) max fwd+bwd {max_ms:9.3f} ms  "
                      f"imbalance {imbalance:.3f}  fwd ms [{' '.join(f'{x:.3f}' for x in fwd)}]  "
                      f"bwd ms [{' '.join(f'{x:.3f}' for x in bwd)}]  key rows {keys}  "
                      f"gather ms [{' '.join(f'{x:.3f}' for x in gather)}]  dK/dV sums ms "
                      f"[{' '.join(f'{x:.3f}' for x in key_grads)}]")
                row = {"kernel": f"torch-{backend}", "backend": backend, "cp": c, "mb": i,
                       "tokens": sum(lengths), "strategy": strategy, "chosen": chosen,
                       "max_ms": round(max_ms, 4), "imbalance": round(imbalance, 4),
                       "fwd_ms": [round(x, 4) for x in fwd], "bwd_ms": [round(x, 4) for x in bwd],
                       "predicted_fwd_ms": [round(x, 4) for x in pred], "key_rows": keys,
                       "gather_ms": [round(x, 4) for x in gather],
                       "key_gradients_ms": [round(x, 4) for x in key_grads]}
                if js:
                    js.write(json.dumps(row) + "\n")
                    js.flush()
            if best is not None:
                oracle += best
        print(f"\nC={c}: sum over {a.micro_batches} micro-batches of the slowest rank's fwd+bwd ms "
              f"({backend} backend):")
        per_seq = totals.get((c, "per-seq"))
        for strategy in a.strategies:
            t = totals[(c, strategy)]
            ratio = f"  (per-seq / this = {per_seq / t:.3f}x)" if per_seq and t else ""
            e = err.get(strategy)
            model_err = (f"  model fwd error {100 * sum(e) / len(e):.1f}% per rank" if e else "")
            print(f"  {strategy:<15} {t:10.3f} ms{ratio}{model_err}")
        if len([s for s in a.strategies if s != "adaptive"]) > 1:
            print(f"  {'oracle':<15} {oracle:10.3f} ms  (fastest measured strategy per micro-batch)")


def compare(paths, torch_rows_path):
    """Section 3 of the docstring: a Markdown table; returns its lines."""
    def load(path):
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]

    ours = [r for p in paths for r in load(p)]
    theirs = {(r["cp"], r["mb"], r["strategy"]): r for r in load(torch_rows_path)}
    sums = defaultdict(lambda: [0.0, 0.0, 0])
    unpaired = 0
    for r in ours:
        t = theirs.get((r.get("cp"), r["mb"], r["strategy"]))
        if t is None or "predicted_fwd_ms" not in r or len(r["predicted_fwd_ms"]) != len(
                t["predicted_fwd_ms"]) or any(abs(x - y) > 1e-3 * max(abs(x), 1e-9) + 1e-4
                                              for x, y in zip(r["predicted_fwd_ms"],
                                                              t["predicted_fwd_ms"])):
            unpaired += 1
            continue
        s = sums[(r["kernel"], t["kernel"], r["cp"], r["strategy"])]
        s[0] += r["max_ms"]
        s[1] += t["max_ms"]
        s[2] += 1
    lines = ["| wlb kernel | PyTorch | C | strategy | micro-batches | wlb ms | PyTorch ms | "
             "PyTorch / wlb |", "|---|---|---|---|---|---|---|---|"]
    for (kw, kt, c, strategy), (w, t, n) in sorted(sums.items()):
        lines.append(f"| {kw} | {kt} | {c} | {strategy} | {n} | {w:.3f} | {t:.3f} | "
                     f"{t / w:.3f} |" if w > 0 else f"| {kw} | {kt} | {c} | {strategy} | {n} | 0 | "
                     f"{t:.3f} | - |")
    lines.append(f"{unpaired} cp_bench rows not paired (no PyTorch row with the same plan)")
    return lines


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except AttributeError:
        pass
    try:
        import torch
        import wlb
        from wlb.torch import varlen_causal_attention as attention
    except ImportError as e:
        print(f"torch_cp_bench: {e}", file=sys.stderr)
        return 3
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch_cp_bench: no CUDA device", file=sys.stderr)
        return 3
    dtype = getattr(torch, DTYPES[a.dtype])
    tolerance = a.tolerance if a.tolerance is not None else (
        1e-10 if dtype == torch.float64 else 2e-2)
    model = (wlb.KernelModel.from_profile(a.profile, heads=a.heads, head_dim=a.head_dim)
             if a.profile else wlb.KernelModel.analytic(heads=a.heads, head_dim=a.head_dim))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name} | PyTorch {torch.__version__} | {a.tokens} tokens, C={a.cp}, heads "
          f"{a.heads}/{a.kv_heads}, head_dim {a.head_dim}, {a.dtype}, model "
          f"{a.profile or 'analytic default'}")
    failed = check(torch, wlb, attention, a, device, dtype, model, tolerance) if a.check else 0
    js = open(a.json, "w") if a.json else None
    try:
        bench(torch, wlb, attention, a, device, dtype, model, js)
    finally:
        if js:
            js.close()
    if a.compare and a.json:
        print("\n" + "\n".join(compare(a.compare, a.json)))
    if failed:
        print(f"torch_cp_bench: {failed} check(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
