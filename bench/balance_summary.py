#!/usr/bin/env python3
"""Per-truth summary of a `sharding_table --balance` raw output (docs/results/cp/balance.md).

    python3 bench/balance_summary.py docs/results/cp/balance_flash_table.txt

From the `adaptive` row of every cell (stream x C x link): its mean slowest rank over the
smallest mean of the cell's rows (every strategy and peer), the worst micro-batch against the
fastest plan within the memory cap ("x capped worst"), how many cells have a micro-batch more
than 1% behind (in all and per C), and the range of its gathered key rows; then the raw file's
lines after the table (the micro-batch cells where a peer's plan beats every wlb plan, and
adaptive's worst against the fastest wlb plan within the cap).

    python3 bench/balance_summary.py --against BASE OTHER [OTHER ...]

compares the row cell by cell with BASE's (e.g. the same command at another
--cp_memory_cap_percent): per stream, the range over its C x link cells of the change of the
row's mean slowest rank, its worst micro-batch against the best of all rows before -> after, and
its fullest rank's tokens over T / C after.
"""
import argparse
import collections


def read_cells(path):
    """{(stream, C, GB/s): [row cells, ...]} of a balance table, and the lines after it."""
    cells = collections.defaultdict(list)
    after = []  # the lines after the table
    with open(path) as f:
        for line in f:
            if line.startswith("|"):
                after = []
            elif line.strip():
                after.append(line.strip())
            if not line.startswith("| ") or line.startswith("| stream"):
                continue
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            cells[tuple(row[:3])].append(row)
    if not cells:
        raise SystemExit(f"{path}: no balance table rows")
    return cells, after


def row_of(path, cell, rows, row_name):
    found = next((r for r in rows if r[3] == row_name), None)
    if found is None:
        raise SystemExit(f"{path}: no {row_name!r} row in cell {' / '.join(cell)}")
    return found


def compare(base_path, path, row_name="adaptive"):
    base, _ = read_cells(base_path)
    other, _ = read_cells(path)
    if set(base) != set(other):
        raise SystemExit(f"{path}: its cells differ from {base_path}'s")
    print(f"{path} against {base_path}, {row_name}:")
    by_stream = collections.defaultdict(list)
    for cell in base:
        a = row_of(base_path, cell, base[cell], row_name)
        b = row_of(path, cell, other[cell], row_name)
        by_stream[cell[0]].append((float(b[4]) / float(a[4]) - 1,
                                   float(a[5].split("/")[1]), float(b[5].split("/")[1]),
                                   float(b[9])))
    for stream, cells in by_stream.items():
        change = [c[0] for c in cells]
        print(f"  {stream}: mean slowest rank {min(change):+.2%} to {max(change):+.2%}; worst "
              f"micro-batch over the best row {max(c[1] for c in cells):.4f} -> "
              f"{max(c[2] for c in cells):.4f}; tokens worst up to {max(c[3] for c in cells):.3f}")


def summarize(path, row_name="adaptive"):
    cells, after = read_cells(path)
    mean_ratio, capped_worst, over, key_means, key_worst = 0.0, 0.0, 0, [], 0.0
    over_by_c = collections.Counter({c: 0 for _, c, _ in cells})  # cells > 1% per CP size
    for (_, c, _), rows in cells.items():
        adaptive = row_of(path, rows[0][:3], rows, row_name)
        # The best of the rows a best is taken over (a what-if row is scored, never the best).
        best_mean = min(float(r[4]) for r in rows if not r[3].startswith("what-if"))
        mean_ratio = max(mean_ratio, float(adaptive[4]) / best_mean)
        capped = float(adaptive[7])
        capped_worst = max(capped_worst, capped)
        over += capped > 1.01
        over_by_c[c] += capped > 1.01
        key_mean, worst = (float(x) for x in adaptive[11].split("/"))
        key_means.append(key_mean)
        key_worst = max(key_worst, worst)
    print(f"{path}: {len(cells)} cells; {row_name}'s mean slowest rank / the best row's mean, worst "
          f"cell {mean_ratio:.4f}; worst micro-batch / fastest capped plan {capped_worst:.4f}; "
          f"cells with a micro-batch > 1%: {over} ("
          + ", ".join(f"C = {c}: {n}" for c, n in sorted(over_by_c.items(), key=lambda x: int(x[0])))
          + "); key rows / (T / C) means "
          f"{min(key_means):.2f}-{max(key_means):.2f}, worst {key_worst:.2f}")
    for line in after:
        print(f"  {line}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="+", help="sharding_table --balance outputs")
    parser.add_argument("--against", metavar="BASE",
                        help="compare the row of each raw output with BASE's, cell by cell")
    parser.add_argument("--row", default="adaptive",
                        help="the row to summarize (default adaptive; e.g. the --split_what_if row, "
                        "'what-if: adaptive, segments split where cheaper')")
    args = parser.parse_args()
    for path in args.raw:
        if args.against:
            compare(args.against, path, args.row)
        else:
            summarize(path, args.row)


if __name__ == "__main__":
    main()
