#!/usr/bin/env python3
"""A kernel profile's envelope in which a smaller query block is never cheaper per tile.

    python3 bench/monotone_profile.py docs/results/gpu/h100_kernel_profile_flash.csv OUT.csv

Reads a `q_len,kv_len,ms[,bwd_ms]` profile (wlb::ReadKernelProfileCsv's format, provenance in the
header's last column) and writes it with, at every kv_len, each entry's time per padded FLOP at
least the next larger q_len's: walking q_len downwards, an entry the larger one beats on
efficiency is raised to that efficiency. Only the forward (ms) is changed: bwd_ms is kept as
measured, since the backward parallelises over key blocks, not query blocks. Padded FLOPs are
the library's (KernelModel.analytic at a constant throughput: zero q_half, kv_half and overhead,
so its segment_ms is the tiled kernel's padded FLOPs over the peak). Prints every raised entry.

Why: a profile can price one entry a few percent off its neighbours (a run's noise or the
kernel's own), and planning and scoring with it then prefer query pieces of that size
(docs/results/cp/balance.md, "the rest of the gap is 35 of the table's 103 entries"). The
envelope is a what-if for that question, not a model wlb plans with.
"""
import argparse
import collections

import wlb


def read_profile(path):
    with open(path) as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not lines:
        raise SystemExit(f"{path}: empty profile")
    header = lines[0].split(",")
    if header[:3] != ["q_len", "kv_len", "ms"]:
        raise SystemExit(f"{path}: header must start with q_len,kv_len,ms, got {lines[0]!r}")
    times = 2 if len(header) > 3 and header[3] == "bwd_ms" else 1
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        cells = line.split(",")
        try:
            q, kv = int(cells[0]), int(cells[1])
            ms = [float(c) for c in cells[2:2 + times]]
            if len(ms) != times:
                raise ValueError
        except (ValueError, IndexError):
            raise SystemExit(f"{path}:{n}: not a profile row: {line!r}") from None
        if q < 1 or kv < q or any(not t > 0 for t in ms):
            raise SystemExit(f"{path}:{n}: need 1 <= q_len <= kv_len and times > 0, got {line!r}")
        rows.append([q, kv, ms, cells[2 + times:]])
    return header, times, rows


def monotone_in_q(rows, work, only=None):
    """Raises rows' forward ms in place (of the (q_len, kv_len) in `only` alone when given);
    returns (q_len, kv_len, old, new) for each raised one."""
    raised = []
    by_kv = collections.defaultdict(list)
    for row in rows:
        by_kv[row[1]].append(row)
    for kv, column in sorted(by_kv.items()):
        column.sort(key=lambda row: row[0])
        larger = None  # the next larger q_len's ms per unit of work
        for row in reversed(column):
            q = row[0]
            per_work = row[2][0] / work(q, kv)
            if larger is not None and per_work < larger and (only is None or (q, kv) in only):
                new = larger * work(q, kv)
                raised.append((q, kv, row[2][0], new))
                row[2][0] = new
                per_work = larger
            larger = per_work
    return raised


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("out")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--tile_q", type=int, default=128)
    parser.add_argument("--tile_k", type=int, default=128)
    parser.add_argument("--only", help="raise only these entries: q_len:kv_len[,q_len:kv_len...]")
    args = parser.parse_args()
    only = None
    if args.only is not None:
        try:
            only = {tuple(int(x) for x in e.split(":", 1)) for e in args.only.split(",")}
        except ValueError:
            raise SystemExit(f"--only: need q_len:kv_len[,q_len:kv_len...], got {args.only!r}")
    header, times, rows = read_profile(args.profile)
    flops = wlb.KernelModel.analytic(heads=args.heads, head_dim=args.head_dim, tile_q=args.tile_q,
                                     tile_k=args.tile_k, q_half=0.0, kv_half=0.0,
                                     segment_overhead_ms=0.0)
    raised = monotone_in_q(rows, flops.segment_ms, only)
    if only is not None and {(q, kv) for q, kv, *_ in raised} != only:
        raise SystemExit(f"--only: {sorted(only)} are not all entries the envelope raises")
    for q, kv, old, new in raised:
        print(f"q_len {q} kv_len {kv}: {old:.6f} -> {new:.6f} ms ({100 * (new / old - 1):+.1f}%)")
    print(f"{len(raised)} of {len(rows)} entries raised")
    provenance = header[2 + times:] or [""]
    provenance[-1] = (provenance[-1] + "; " if provenance[-1] else "") + (
        f"monotone in q_len by bench/monotone_profile.py from {args.profile}"
        + (f" (only {args.only})" if only is not None else ""))
    with open(args.out, "w") as f:
        f.write(",".join(header[:2 + times] + provenance) + "\n")
        for q, kv, ms, rest in rows:
            f.write(",".join([str(q), str(kv)] + [f"{t:.6f}" for t in ms] + rest) + "\n")


if __name__ == "__main__":
    main()
