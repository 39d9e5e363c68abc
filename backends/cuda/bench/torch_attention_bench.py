#!/usr/bin/env python3
"""PyTorch's own fused attention on the shapes of attention_bench, for a side-by-side ratio.

Documents of one length are batched into one torch.nn.functional.scaled_dot_product_attention
call (B, H, L, D) with is_causal=True, which is exactly per-document causal attention; a config's
time is the sum over its distinct lengths. Forward is timed alone; backward is timed from an
already computed forward (torch.autograd.grad with a fixed random dout). FLOPs are counted as in
attention_bench: 4 * D * H * sum_docs L (L + 1) / 2 forward, 2.5x that backward.

  python3 torch_attention_bench.py --mix-lengths mix.json --json out.jsonl \
      [--tokens 131072 --heads 16 --head-dim 128 --backends flash,cudnn,default]
"""
import argparse
import collections
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def backend_context(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    table = {
        "flash": [SDPBackend.FLASH_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    }
    if name == "default":
        import contextlib
        return contextlib.nullcontext()
    return sdpa_kernel(table[name])


def time_config(lengths, heads, kv_heads, dim, backend, warmup, iters):
    groups = collections.Counter(lengths)
    tensors = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for length, count in sorted(groups.items()):
        def rnd(h):
            return (torch.rand((count, h, length, dim), device="cuda", dtype=torch.bfloat16,
                               generator=gen) * 2 - 1)
        q, k, v = rnd(heads).requires_grad_(), rnd(kv_heads).requires_grad_(), rnd(kv_heads)
        v.requires_grad_()
        tensors.append((q, k, v, rnd(heads)))
    gqa = {"enable_gqa": True} if kv_heads != heads else {}

    def fwd_all():
        return [F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
                for q, k, v, _ in tensors]

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with backend_context(backend):
        fwd_ms, bwd_ms = [], []
        for i in range(warmup + iters):
            start.record()
            with torch.no_grad():
                fwd_all()
            stop.record()
            torch.cuda.synchronize()
            if i >= warmup:
                fwd_ms.append(start.elapsed_time(stop))
        for i in range(warmup + iters):
            outs = fwd_all()
            torch.cuda.synchronize()
            start.record()
            for out, (q, k, v, dout) in zip(outs, tensors):
                torch.autograd.grad(out, (q, k, v), dout)
            stop.record()
            torch.cuda.synchronize()
            if i >= warmup:
                bwd_ms.append(start.elapsed_time(stop))
    return statistics.median(fwd_ms), statistics.median(bwd_ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--configs", default="512,2048,8192,16384,mix")
    ap.add_argument("--mix-lengths", help="JSON list written by attention_bench --dump_mix")
    ap.add_argument("--backends", default="flash,cudnn,default")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="append one JSON line per (config, backend)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch; nothing measured", file=sys.stderr)
        return 3
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name()}")
    out = open(a.json, "a") if a.json else None
    print(f"{'config':8} {'backend':8} {'fwd_ms':>9} {'fwd_TF':>7} {'bwd_ms':>9} {'bwd_TF':>7}")
    for config in a.configs.split(","):
        if config == "mix":
            if not a.mix_lengths:
                continue
            lengths = json.load(open(a.mix_lengths))
        else:
            lengths = [int(config)] * max(1, a.tokens // int(config))
        pairs = sum(l * (l + 1) // 2 for l in lengths)
        flops = 4.0 * a.head_dim * a.heads * pairs
        for backend in a.backends.split(","):
            row = {"impl": f"torch_sdpa_{backend}", "config": config, "docs": len(lengths),
                   "tokens": sum(lengths), "heads": a.heads, "kv_heads": a.kv_heads,
                   "head_dim": a.head_dim, "torch": torch.__version__}
            try:
                fwd, bwd = time_config(lengths, a.heads, a.kv_heads, a.head_dim, backend,
                                       a.warmup, a.iters)
                row.update(fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9,
                           bwd_tflops=2.5 * flops / bwd / 1e9)
                print(f"{config:8} {backend:8} {fwd:9.3f} {row['fwd_tflops']:7.1f} "
                      f"{bwd:9.3f} {row['bwd_tflops']:7.1f}")
            except Exception as e:  # a backend that refuses the shape is reported, not fatal
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"{config:8} {backend:8} unavailable: {row['error']}")
            torch.cuda.empty_cache()
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
