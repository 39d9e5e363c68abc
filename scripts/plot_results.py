#!/usr/bin/env python3
"""Turns the bench tables' CSVs into the PNGs under docs/img/.

    pip install matplotlib            # the only dependency
    scripts/plot_results.py           # reads docs/results/{packing,estimate}/*.csv, writes docs/img/*.png

Inputs (written by the commands in docs/RESULTS.md):
  packing/imbalance_wlbllm_like.csv    bench/imbalance_table --csv
  packing/step_costs_wlbllm_like.csv   bench/imbalance_table --step_csv
  estimate/speedup_wlbllm_like.csv     bench/speedup_table --csv
"""
import argparse
import csv
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_results.py: matplotlib is missing; install it with 'pip install matplotlib'")


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plot_imbalance(rows, out):
    labels = [f"{r['method']}\n{r['config']}" for r in rows]
    mean = [float(r["imbalance_mean"]) for r in rows]
    p90 = [float(r["imbalance_p90"]) for r in rows]
    bound = [m - float(r["lower_bound_gap"]) for m, r in zip(mean, rows)]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.bar([i - 0.2 for i in x], mean, width=0.4, label="mean")
    ax.bar([i + 0.2 for i in x], p90, width=0.4, label="p90")
    ax.scatter(list(x), bound, color="black", marker="_", s=200, zorder=3,
               label="mean lower bound")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("imbalance degree (max / mean micro-batch cost)")
    ax.set_ylim(0.9, max(p90) * 1.05)
    ax.set_title("Packing imbalance by method (WLB-LLM-like data, S = 128K, N = 4, LLaMA-2-7B)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_step_costs(rows, out):
    methods = []
    for r in rows:
        key = (r["method"], r["config"])
        if key not in methods:
            methods.append(key)
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods), 3.5), sharey=True)
    for ax, key in zip(axes, methods):
        mine = [r for r in rows if (r["method"], r["config"]) == key]
        ax.bar([int(r["micro_batch"]) for r in mine], [float(r["cost_over_mean"]) for r in mine])
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_title(f"{key[0]} {key[1] if key[1] != '-' else ''}".strip(), fontsize=9)
        ax.set_xlabel("micro-batch")
    axes[0].set_ylabel("cost / step mean")
    fig.suptitle(f"Per-micro-batch cost of step {rows[0]['step']}, before and after balancing",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_speedup(rows, out):
    ctx = [r for r in rows if r["table"] == "context"]
    columns = []
    for r in ctx:
        key = (r["packer"], r["cp"])
        if key not in columns and key != ("original", "per-seq"):
            columns.append(key)
    configs = []
    for r in ctx:
        if r["config"] not in configs:
            configs.append(r["config"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in columns:
        ys = [float(next(r["speedup"] for r in ctx if r["config"] == c and
                         (r["packer"], r["cp"]) == key)) for c in configs]
        ax.plot(configs, ys, marker="o", label=f"{key[0]}, {key[1]} CP")
    ax.plot(["7B-128K", "7B-160K"], [1.33, 1.40], "k*", markersize=12,
            label="paper: WLB-LLM over Plain-4D")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("estimated speedup over Plain-4D")
    ax.set_title("7B, (TP,CP,PP,DP) = (8,2,4,1): speedup vs context (1F1B simulator)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=os.path.join(root, "docs", "results"))
    parser.add_argument("--out", default=os.path.join(root, "docs", "img"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    jobs = [("packing/imbalance_wlbllm_like.csv", plot_imbalance, "imbalance_by_method.png"),
            ("packing/step_costs_wlbllm_like.csv", plot_step_costs, "step_costs.png"),
            ("estimate/speedup_wlbllm_like.csv", plot_speedup, "speedup_vs_context.png")]
    for name, fn, png in jobs:
        path = os.path.join(args.results, name)
        if not os.path.exists(path):
            sys.exit(f"plot_results.py: missing {path} (see docs/RESULTS.md for the command)")
        fn(read(path), os.path.join(args.out, png))
        print(os.path.join(args.out, png))


if __name__ == "__main__":
    main()
