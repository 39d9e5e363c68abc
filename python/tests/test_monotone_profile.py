"""bench/monotone_profile.py: the committed what-if profiles are what it writes from the committed
flash table (docs/results/cp/balance.md quotes them); on random tables it only raises forward
times, leaves bwd_ms and already-monotone entries alone, and leaves every kv_len's forward time
per padded FLOP non-increasing in q_len; bad input is refused by name."""
import pathlib
import random
import subprocess
import sys

import wlb

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "monotone_profile.py"
FLASH = ROOT / "docs" / "results" / "gpu" / "h100_kernel_profile_flash.csv"
WHAT_IF = ROOT / "docs" / "results" / "cp" / "monotone_what_if"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


def rows_of(path):
    lines = pathlib.Path(path).read_text().splitlines()
    return lines[0], [line.split(",") for line in lines[1:]]


def test_committed_what_if_profiles_are_what_the_script_writes(tmp_path):
    for name, extra in [("h100_kernel_profile_flash_monotone_q.csv", []),
                        ("h100_kernel_profile_flash_1024_65536.csv", ["--only", "1024:65536"])]:
        out = tmp_path / name
        # Relative paths, as the committed files were made (the provenance names the input).
        done = run(FLASH.relative_to(ROOT), out, *extra)
        assert done.returncode == 0, done.stderr
        assert out.read_text() == (WHAT_IF / name).read_text(), name
    assert (WHAT_IF / "raised.txt").read_text().endswith("35 of 103 entries raised\n")


def test_random_tables_become_monotone_by_raising_only(tmp_path):
    work = wlb.KernelModel.analytic(q_half=0.0, kv_half=0.0, segment_overhead_ms=0.0).segment_ms
    rng = random.Random(7)
    for trial in range(20):
        qs = sorted(rng.sample([16, 64, 128, 192, 256, 512, 1024, 2048, 4096], rng.randint(1, 6)))
        kvs = sorted(rng.sample([256, 1024, 4096, 8192, 32768], rng.randint(1, 4)))
        src = tmp_path / f"in{trial}.csv"
        lines = ["q_len,kv_len,ms,bwd_ms,a test table"]
        for q in qs:
            for kv in kvs:
                if kv >= q:
                    ms = work(q, kv) * rng.uniform(0.5, 1.5)
                    lines.append(f"{q},{kv},{ms:.6f},{rng.uniform(0.1, 9):.6f},")
        src.write_text("\n".join(lines) + "\n")
        dst = tmp_path / f"out{trial}.csv"
        done = run(src, dst)
        assert done.returncode == 0, done.stderr
        header_in, before = rows_of(src)
        header_out, after = rows_of(dst)
        assert header_out.startswith(header_in + "; monotone in q_len by bench/monotone_profile.py")
        assert [r[:2] + r[3:] for r in before] == [r[:2] + r[3:] for r in after]  # bwd_ms kept
        assert all(float(b[2]) >= float(a[2]) for a, b in zip(before, after))
        columns = {}
        for q, kv, ms, *_ in after:
            columns.setdefault(int(kv), []).append((int(q), float(ms)))
        for kv, column in columns.items():
            column.sort()
            for (q, ms), (q_larger, ms_larger) in zip(column, column[1:]):
                # ms per padded FLOP at q at least q_larger's, up to the 6 decimals written
                assert ms >= ms_larger / work(q_larger, kv) * work(q, kv) - 1e-6, (q, kv)
        raised = int(done.stdout.splitlines()[-1].split()[0])
        assert raised == sum(float(b[2]) > float(a[2]) for a, b in zip(before, after))
    # A second pass raises nothing but the written times' rounding (6 decimals).
    done = run(dst, tmp_path / "again.csv")
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines()[:-1]:
        old, new = (float(x) for x in line.split(": ")[1].split(" ms")[0].split(" -> "))
        assert new - old <= 1.5e-6, line


def test_bad_input_is_refused_by_name(tmp_path):
    cases = {
        "q,kv,ms\n16,16,0.1\n": "header must start with q_len,kv_len,ms",
        "q_len,kv_len,ms\n16,sixteen,0.1\n": ":2: not a profile row",
        "q_len,kv_len,ms,bwd_ms\n16,16,0.1\n": ":2: not a profile row",
        "q_len,kv_len,ms\n32,16,0.1\n": ":2: need 1 <= q_len <= kv_len and times > 0",
        "q_len,kv_len,ms\n16,16,0\n": ":2: need 1 <= q_len <= kv_len and times > 0",
        "": "empty profile",
    }
    for i, (text, message) in enumerate(cases.items()):
        src = tmp_path / f"bad{i}.csv"
        src.write_text(text)
        done = run(src, tmp_path / "out.csv")
        assert done.returncode != 0 and message in done.stderr, (text, done.stderr)
    done = run(FLASH, tmp_path / "out.csv", "--only", "1024-65536")
    assert done.returncode != 0 and "--only: need q_len:kv_len" in done.stderr
    done = run(FLASH, tmp_path / "out.csv", "--only", "8192:8192")
    assert done.returncode != 0 and "are not all entries the envelope raises" in done.stderr
