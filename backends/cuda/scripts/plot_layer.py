#!/usr/bin/env python3
"""Measured vs predicted forward latency per micro-batch, from wlb_cuda_layer_bench's output.

    pip install matplotlib                       # the only dependency
    backends/cuda/scripts/plot_layer.py DIR/predictions.csv docs/img/layer_measured_vs_predicted.png

One point per micro-batch (colour: packer): x the prediction (the FLOP model at its best scale,
and the model fitted to single-document timings), y the measured one-layer forward ms, with the
y = x line. Points above the line ran slower than predicted.
"""
import argparse
import csv
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_layer.py: matplotlib is missing; install it with 'pip install matplotlib'")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predictions", help="predictions.csv written by wlb_cuda_layer_bench")
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("--title", default="", help="plot title (e.g. device and job)")
    args = parser.parse_args()
    with open(args.predictions, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"plot_layer.py: {args.predictions} holds no micro-batches")
    columns = [("flop_model_ms", "FLOP model (best scale)"),
               ("fitted_ms", "fitted to single documents"),
               ("microbatch_fit_ms", "fitted to micro-batches")]
    columns = [(c, label) for c, label in columns if rows[0].get(c)]
    fig, axes = plt.subplots(1, len(columns), figsize=(6 * len(columns), 5), squeeze=False)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for ax, (column, label) in zip(axes[0], columns):
        for method in methods:
            mine = [r for r in rows if r["method"] == method]
            ax.scatter([float(r[column]) for r in mine],
                       [float(r["measured_fwd_ms"]) for r in mine], s=18, label=method)
        top = max(max(float(r[column]), float(r["measured_fwd_ms"])) for r in rows) * 1.05
        ax.plot([0, top], [0, top], color="black", linewidth=0.8)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel(f"predicted forward ms, {label}")
        ax.set_ylabel("measured forward ms (one layer)")
        ax.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
