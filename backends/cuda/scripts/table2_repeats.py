#!/usr/bin/env python3
"""Mean and spread of layer_bench's Table 2 over repeated runs.

  table2_repeats.py RUN_DIR [RUN_DIR ...] [--pair A=B ...]

Each RUN_DIR holds one `wlb_cuda_layer_bench` run's summary.md; its Table 2 rows
(| packer | FLOP model | measured fwd | measured fwd+bwd |) are read as printed, so the numbers
are the bench's own (layer_analysis.h), not recomputed here. Prints, per packer, every run's
value and the mean with the spread (max - min) of each column, then for each --pair A=B the
per-run difference of measured fwd+bwd imbalance (B - A) and in how many runs B was below A.
Exit status 1 when a run has no Table 2 or the runs disagree on the packers.
"""
import argparse
import pathlib
import statistics
import sys

COLUMNS = ("FLOP model", "measured fwd", "measured fwd+bwd")


def read_table2(path: pathlib.Path) -> dict[str, tuple[float, ...]]:
    rows, inside = {}, False
    for line in path.read_text().splitlines():
        if line.startswith("| packer | FLOP model |"):
            inside = True
            continue
        if inside:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells[0].startswith("---"):
                continue
            if len(cells) != 1 + len(COLUMNS):
                raise ValueError(f"{path}: Table 2 row '{line}' has {len(cells)} cells")
            rows[cells[0]] = tuple(float(c) for c in cells[1:])
    if not rows:
        raise ValueError(f"{path}: no Table 2 (| packer | FLOP model | ... |) found")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=pathlib.Path)
    ap.add_argument("--pair", action="append", default=[],
                    help="A=B: report B - A of measured fwd+bwd imbalance per run")
    args = ap.parse_args()
    tables = []
    for run in args.runs:
        try:
            tables.append(read_table2(run / "summary.md"))
        except (OSError, ValueError) as e:
            print(f"table2_repeats.py: {e}", file=sys.stderr)
            return 1
    packers = list(tables[0])
    for run, t in zip(args.runs, tables):
        if list(t) != packers:
            print(f"table2_repeats.py: {run} has packers {list(t)}, the first run {packers}",
                  file=sys.stderr)
            return 1
    pairs = []
    for pair in args.pair:
        a, sep, b = pair.partition("=")
        if not sep or a not in packers or b not in packers:
            print(f"table2_repeats.py: --pair '{pair}' does not name two packers of {packers}",
                  file=sys.stderr)
            return 1
        pairs.append((a, b))
    n = len(tables)
    print(f"Table 2 over {n} runs ({', '.join(r.name for r in args.runs)}): mean ± spread "
          "(max - min); per-run values in brackets")
    print()
    print("| packer | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for p in packers:
        cells = []
        for j in range(len(COLUMNS)):
            v = [t[p][j] for t in tables]
            cells.append(f"{statistics.fmean(v):.3f} ± {max(v) - min(v):.3f} "
                         f"({' / '.join(f'{x:.3f}' for x in v)})")
        print(f"| {p} | " + " | ".join(cells) + " |")
    for a, b in pairs:
        d = [t[b][2] - t[a][2] for t in tables]
        below = sum(x < 0 for x in d)
        print(f"\n{b} - {a} (measured fwd+bwd imbalance): mean {statistics.fmean(d):+.4f}, "
              f"per run {' / '.join(f'{x:+.4f}' for x in d)}; {b} below {a} in {below} of {n} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
