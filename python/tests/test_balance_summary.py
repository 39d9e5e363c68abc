"""bench/balance_summary.py on the committed balance tables (docs/results/cp/balance.md quotes
its numbers) and on a file that is not one."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "balance_summary.py"


def run(*paths):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, paths)], capture_output=True,
                          text=True, cwd=ROOT)


def table_cells(path):
    """A balance table's 54 cells, (stream, C, link) -> {row name: its columns}; a row's columns
    are its "|"-separated fields (columns[4] the row name, [5] the mean slowest rank, ...)."""
    cells = {}
    for line in path.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| stream"):
            columns = [c.strip() for c in line.split("|")]
            cells.setdefault(tuple(columns[1:4]), {})[columns[4]] = columns
    assert len(cells) == 54, path
    return cells


def test_committed_tables_give_the_quoted_numbers():
    raw = ROOT / "docs" / "results" / "cp"
    out = run(raw / "balance_flash_table.txt", raw / "balance_gather_3350.txt")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    flash = lines[0]
    gather = next(line for line in lines if line.startswith(str(raw / "balance_gather_3350.txt")))
    assert "54 cells" in flash and "fastest capped plan 1.0237" in flash
    assert "worst cell 1.0044" in flash and "> 1%: 18 (C = 2: 14, C = 4: 2, C = 8: 2);" in flash
    assert "fastest capped plan 1.0317" in gather and "> 1%: 1 (C = 2: 1, C = 4: 0, C = 8: 0)" in gather
    assert "1140 of 10920" in out.stdout and "252 of 10920" in out.stdout
    # adaptive is the fastest wlb plan within the cap on every micro-batch under both truths
    assert out.stdout.count("within the memory cap, worst micro-batch cell: 1.0000") == 2


def test_other_seeds_hold_what_balance_md_says():
    """The balance table at seeds 2-13 (docs/results/cp/seeds), as balance.md says: no micro-batch
    of adaptive more than 2.7% behind the fastest plan within the cap, and at C = 4 and 8 none
    more than 2.2% (the peer's 1024-token chunks and one small micro-batch)."""
    import re

    files = sorted((ROOT / "docs" / "results" / "cp" / "seeds").glob("balance_flash_table_seed*.txt"),
                   key=lambda p: int(re.search(r"seed(\d+)", p.name).group(1)))
    assert [int(re.search(r"seed(\d+)", p.name).group(1)) for p in files] == list(range(2, 14))
    out = run(*files)
    assert out.returncode == 0, out.stderr
    summaries = [line for line in out.stdout.splitlines() if "54 cells" in line]
    assert len(summaries) == 12
    for path, line in zip(files, summaries):
        worst = float(re.search(r"fastest capped plan (\S+);", line).group(1))
        assert worst <= 1.027, line
        # adaptive's "x capped worst" column at C = 4 and 8
        rows = [[c.strip() for c in row.split("|")] for row in path.read_text().splitlines()]
        wide = [float(c[8]) for c in rows if len(c) > 8 and c[4] == "adaptive" and c[2] in "48"]
        assert len(wide) == 36 and max(wide) <= 1.022, path


def test_a_file_without_rows_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("no table here\n")
    out = run(bad)
    assert out.returncode != 0
    assert "notes.txt: no balance table rows" in out.stderr


def test_split_what_if_moves_no_token_and_closes_most_cells():
    """docs/results/cp/split_what_if (sharding_table --balance --split_what_if): the what-if row
    cuts adaptive's segments into pieces, so in every cell it holds the same tokens, buffer, causal
    pairs and received bytes as adaptive and gathers at least as many key rows; the summary gives
    the numbers balance.md quotes."""
    import re

    what_if = "what-if: adaptive, segments split where cheaper"
    files = sorted((ROOT / "docs" / "results" / "cp" / "split_what_if").glob("balance_*.txt"))
    assert len(files) == 16
    for path in files:
        for key, cell in table_cells(path).items():
            a, w = cell["adaptive"], cell[what_if]
            # pair imbalance, tokens and buffer worst, received MB: unchanged by the split
            assert (a[9], a[10], a[11], a[13]) == (w[9], w[10], w[11], w[13]), (path, key)
            a_keys, w_keys = (float(x.split("/")[0]) for x in (a[12], w[12]))
            assert w_keys >= a_keys, (path, key)
            # never slower under the model it was split with (it plans and scores with the same)
            assert float(w[5]) <= float(a[5]) * (1 + 1e-9), (path, key)
    out = subprocess.run([sys.executable, str(SCRIPT), "--row", what_if, *map(str, files)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    summary = {pathlib.Path(line.split(":")[0]).name: line for line in out.stdout.splitlines()
               if "54 cells" in line}
    assert "capped plan 1.0208; cells with a micro-batch > 1%: 1 (C = 2: 1, C = 4: 0, C = 8: 0)" \
        in summary["balance_flash_table.txt"]
    assert "> 1%: 0 (" in summary["balance_packed_calls.txt"]
    seeds = [line for name, line in summary.items() if "seed" in name]
    assert len(seeds) == 12
    assert sum(int(re.search(r"> 1%: (\d+)", line).group(1)) for line in seeds) == 3
    assert max(float(re.search(r"capped plan (\S+);", line).group(1)) for line in seeds) <= 1.023


def test_finer_cut_what_if_stays_in_the_cap_and_closes_most_monotone_cells():
    """docs/results/cp/finer_cut_what_if (sharding_table --balance --finer_cut_what_if, seeds 1-13
    under the flash table and under its monotone envelope): in every cell the what-if row holds
    tokens and buffer within the cap and is never slower than adaptive on the mean under the model
    it was planned and scored with; the summary gives the numbers balance.md quotes."""
    import re

    what_if = "what-if: adaptive, or a finer balanced-chunks cut where faster"
    raw = ROOT / "docs" / "results" / "cp" / "finer_cut_what_if"
    totals = {}
    for truth in ("flash_table", "monotone"):
        files = [raw / f"balance_{truth}_seed{s}.txt" for s in range(1, 14)]
        for path in files:
            for key, cell in table_cells(path).items():
                a, w = cell["adaptive"], cell[what_if]
                assert float(w[10]) <= 1.01 and float(w[11]) <= 1.01, (path, key)
                assert float(w[5]) <= float(a[5]) * (1 + 1e-9), (path, key)
        counts = {}
        for row in ("adaptive", what_if):
            out = subprocess.run([sys.executable, str(SCRIPT), "--row", row, *map(str, files)],
                                 capture_output=True, text=True, cwd=ROOT)
            assert out.returncode == 0, out.stderr
            lines = [line for line in out.stdout.splitlines() if "54 cells" in line]
            assert len(lines) == 13
            counts[row] = sum(int(re.search(r"> 1%: (\d+)", line).group(1)) for line in lines)
        totals[truth] = (counts["adaptive"], counts[what_if])
    assert totals == {"flash_table": (210, 175), "monotone": (9, 5)}


def test_an_unknown_row_is_an_error_naming_it():
    raw = ROOT / "docs" / "results" / "cp" / "balance_flash_table.txt"
    out = subprocess.run([sys.executable, str(SCRIPT), "--row", "no-such-strategy", str(raw)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0
    assert "no 'no-such-strategy' row in cell" in out.stderr


def test_a_larger_memory_cap_holds_what_its_readme_says():
    """docs/results/cp/memory_cap/README.md: with the cap at 125% and with none, no cell of the
    committed streams is slower than at the default, and the fullest rank stays within the cap;
    --against prints the quoted ranges."""
    raw = ROOT / "docs" / "results" / "cp"
    base = table_cells(raw / "balance_flash_table.txt")
    for name, cap in (("balance_flash_table_cap125.txt", 1.25),
                      ("balance_flash_table_cap409700.txt", None)):
        other = table_cells(raw / "memory_cap" / name)
        assert set(other) == set(base)
        for cell, rows in other.items():
            assert float(rows["adaptive"][5]) <= float(base[cell]["adaptive"][5]), (name, cell)
            if cap is not None:
                assert float(rows["adaptive"][10]) <= cap and float(rows["adaptive"][11]) <= cap
    out = run("--against", raw / "balance_flash_table.txt",
              raw / "memory_cap" / "balance_flash_table_cap125.txt")
    assert out.returncode == 0, out.stderr
    assert ("small micro-batches, 8K-32K tokens (synthetic): mean slowest rank -16.18% to -2.44%; "
            "worst micro-batch over the best row 2.4709 -> 1.9625; tokens worst up to 1.250"
            ) in out.stdout
    # a table of other cells is refused
    mismatch = run("--against", raw / "memory_cap" / "balance_pareto_cap101.txt",
                   raw / "balance_flash_table.txt")
    assert mismatch.returncode != 0 and "cells differ" in mismatch.stderr


def test_stress_lengths_are_the_same_files_everywhere(tmp_path):
    """bench/stress_lengths.py (the memory-cap README's other shapes): a seeded shape is the same
    file on every run, holds the tokens asked for, and an unknown shape is an error naming it."""
    import hashlib
    import json
    script = ROOT / "bench" / "stress_lengths.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "longtail", "full"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    longtail = (tmp_path / "longtail.json").read_bytes()
    assert hashlib.sha256(longtail).hexdigest()[:16] == "49eff2313fb4f976"
    full = json.loads((tmp_path / "full.json").read_text())
    assert set(full) == {131072} and sum(full) >= 52 * 4 * 131072
    bad = subprocess.run([sys.executable, str(script), str(tmp_path), "zipf"], capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "unknown shape 'zipf'" in bad.stderr
