#!/usr/bin/env python3
"""The attention ratio table: wlb's engines against PyTorch's on the same shapes, one run.

  bench_ratios.py WLB_JSONL TORCH_JSONL

WLB_JSONL: wlb_cuda_attention_bench --json rows (impl wlb_flash / wlb_cudnn, block_order,
flash_backward: rows without it are q64, the default);
TORCH_JSONL: torch_attention_bench.py --json rows (impl torch_sdpa_flash, torch_sdpa_cudnn,
torch_sdpa_efficient on uniform configs; torch_varlen on every config; rows with "error" or
"skipped" carry no timing). Prints a Markdown table of TFLOP/s with each wlb row's ratio to the
best PyTorch backend of its config and to PyTorch's cuDNN (uniform configs) or varlen (the mix),
head_major against heaviest_first, each flash backward configuration against q64 and cudnn
against flash, and the issue-19 targets at 16K.
A ratio above 1 means wlb is faster.
"""
import json
import sys


def rows(path):
    try:
        return [json.loads(line) for line in open(path) if line.strip()]
    except OSError:
        return []


def timed(row):
    return "fwd_tflops" in row and "bwd_tflops" in row and not row.get("error")


def backward_config(row):
    """The row's flash backward configuration; "-" for engines that have none."""
    return row.get("flash_backward", "q64" if row.get("kernel", "flash") == "flash" else "-")


def main():
    wlb = [r for r in rows(sys.argv[1]) if timed(r)]
    torch = rows(sys.argv[2])
    print("| config | engine | block order | fwd TF/s | bwd TF/s | torch cuDNN fwd / bwd | "
          "torch varlen fwd / bwd | best torch fwd (backend) | best torch bwd (backend) | "
          "fwd vs best | bwd vs best | fwd vs torch cuDNN | bwd vs torch cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def tf(row):
        return f"{row['fwd_tflops']:.1f} / {row['bwd_tflops']:.1f}" if row else "n/a"

    for w in wlb:
        config = w["config"]
        base = [t for t in torch if t.get("config") == config and timed(t)]
        cudnn = next((t for t in base if t["impl"] == "torch_sdpa_cudnn"), None)
        varlen = next((t for t in base if t["impl"] == "torch_varlen"), None)
        order = w["block_order"]
        if backward_config(w) not in ("q64", "-"):
            order += f", bwd {backward_config(w)}"
        line = (f"| {config} | {w.get('kernel', 'flash')} | {order} | "
                f"{w['fwd_tflops']:.1f} | {w['bwd_tflops']:.1f} | {tf(cudnn)} | {tf(varlen)} |")
        if not base:
            print(line + " n/a | n/a | | | | |")
            continue
        bf = max(base, key=lambda t: t["fwd_tflops"])
        bb = max(base, key=lambda t: t["bwd_tflops"])
        line += (f" {bf['fwd_tflops']:.1f} ({bf['impl']}) | {bb['bwd_tflops']:.1f} ({bb['impl']}) |"
                 f" {w['fwd_tflops'] / bf['fwd_tflops']:.2f} |"
                 f" {w['bwd_tflops'] / bb['bwd_tflops']:.2f} |")
        if cudnn:
            line += (f" {w['fwd_tflops'] / cudnn['fwd_tflops']:.2f} |"
                     f" {w['bwd_tflops'] / cudnn['bwd_tflops']:.2f} |")
        else:
            line += " n/a | n/a |"
        print(line)
    for t in torch:
        if not timed(t):
            why = t.get("error") or t.get("skipped") or "no timing"
            print(f"\n{t.get('impl')} on {t.get('config')}: {why}")

    configs = {(w["config"], w.get("kernel", "flash"), w["block_order"], backward_config(w)): w
               for w in wlb}
    by = {k[:3]: w for k, w in configs.items() if k[3] in ("q64", "-")}
    print()
    for c in dict.fromkeys(w["config"] for w in wlb):
        a, b = by.get((c, "flash", "heaviest_first")), by.get((c, "flash", "head_major"))
        if a and b:
            print(f"block order {c}: head_major / heaviest_first time, fwd "
                  f"{b['fwd_ms'] / a['fwd_ms']:.3f}, bwd {b['bwd_ms'] / a['bwd_ms']:.3f}")
        for (cc, kernel, order, bwd), w in configs.items():
            base = by.get((c, "flash", order))
            if cc == c and kernel == "flash" and bwd != "q64" and base:
                print(f"flash backward {c} ({order}): {bwd} / q64 time, bwd "
                      f"{w['bwd_ms'] / base['bwd_ms']:.3f}, fwd {w['fwd_ms'] / base['fwd_ms']:.3f}")
        f, d = by.get((c, "flash", "heaviest_first")), by.get((c, "cudnn", "-"))
        if f and d:
            print(f"engine {c}: cudnn / flash time, fwd {d['fwd_ms'] / f['fwd_ms']:.3f}, "
                  f"bwd {d['bwd_ms'] / f['bwd_ms']:.3f}")
    print()
    cudnn16 = by.get(("16384", "cudnn", "-"))
    torch16 = next((t for t in torch if t.get("config") == "16384"
                    and t.get("impl") == "torch_sdpa_cudnn" and timed(t)), None)
    if cudnn16:
        met = cudnn16["fwd_tflops"] >= 500 and cudnn16["bwd_tflops"] >= 400
        close = (torch16 is not None and cudnn16["fwd_tflops"] >= 0.95 * torch16["fwd_tflops"]
                 and cudnn16["bwd_tflops"] >= 0.95 * torch16["bwd_tflops"])
        print(f"target cudnn at 16K >= 500 fwd / 400 bwd TFLOP/s: {cudnn16['fwd_tflops']:.1f} / "
              f"{cudnn16['bwd_tflops']:.1f}: {'MET' if met else 'NOT MET'}; within 5% of "
              f"torch_sdpa_cudnn: {'MET' if close else 'NOT MET'}")
    for (c, kernel, order, bwd), f16 in configs.items():
        if c == "16384" and kernel == "flash":
            met = f16["fwd_tflops"] >= 335 and f16["bwd_tflops"] >= 300
            name = order if bwd == "q64" else f"{order}, bwd {bwd}"
            print(f"target flash ({name}) at 16K >= 335 fwd / 300 bwd TFLOP/s (FA2's published "
                  f"H100 figures): {f16['fwd_tflops']:.1f} / {f16['bwd_tflops']:.1f}: "
                  f"{'MET' if met else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
