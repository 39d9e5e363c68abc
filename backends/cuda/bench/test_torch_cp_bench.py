"""torch_cp_bench.py on the CPU (float64, math backend, gloo): the check, the rows, the pairing.

  build/pyenv/bin/python -m pytest backends/cuda/bench/test_torch_cp_bench.py -q
"""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
wlb = pytest.importorskip("wlb")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_cp_bench as tcb  # noqa: E402

# cp_bench's bench::KernelTimeOnly, spelled out here so the test does not read it from the script.
KERNEL_TIME_ONLY = {"cp_link_gbps": 1e6, "cp_latency_us": 0.0}

SMALL = ["--device", "cpu", "--dtype", "fp64", "--tokens", "400", "--check-tokens", "300",
         "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--cp", "2,4",
         "--micro-batches", "2", "--iters", "1", "--warmup", "0"]


def test_micro_batches_are_cp_benchs():
    for seed in (1, 2, 7):
        sample = [int(x) for x in wlb.sample_default_lengths(131072, seed)]
        lengths = tcb.wlb_like_micro_batch(wlb, 131072, seed)
        assert sum(lengths) == 131072
        assert lengths[:-1] == sample[:len(lengths) - 1]
        assert lengths[-1] <= sample[len(lengths) - 1]
    mixed = tcb.wlb_like_micro_batch(wlb, 1000, 3, longest=250)
    assert sum(mixed) == 1000 and max(mixed) <= 250 and len(mixed) >= 4


def test_check_passes_and_every_row_is_written(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert tcb.main(SMALL + ["--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "check cp_attention, gloo group of 1, math backend" in text
    assert text.count(" OK") == 1 + 2 * len(tcb.STRATEGIES)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["cp"], r["mb"], r["strategy"]) for r in rows} == {
        (c, m, s) for c in (2, 4) for m in (0, 1) for s in tcb.STRATEGIES}
    model = wlb.KernelModel.analytic(heads=4, head_dim=8)
    for r in rows:
        lengths = tcb.wlb_like_micro_batch(wlb, 400, 1 + r["mb"])
        plan = wlb.plan_shards(lengths, r["cp"], r["strategy"], model,
                               **(KERNEL_TIME_ONLY if r["strategy"] == "adaptive" else {}))
        assert r["tokens"] == 400 and r["chosen"] == plan.strategy
        assert len(r["fwd_ms"]) == len(r["bwd_ms"]) == r["cp"]
        assert r["predicted_fwd_ms"] == pytest.approx(
            [rk.predicted_ms for rk in plan.ranks], abs=1e-4)
        for rk, f in zip(plan.ranks, r["fwd_ms"]):
            assert (f > 0) == (rk.tokens > 0)  # a rank without queries is not timed
        # The key rows' copies: as many rows as the rank's varlen call reads, timed apart.
        assert r["key_rows"] == [int(rk.cu_seqlens_k[-1]) for rk in plan.ranks]
        assert r["key_rows"] == [len(rk.key_indices) for rk in plan.ranks]
        for rk, g, kg in zip(plan.ranks, r["gather_ms"], r["key_gradients_ms"]):
            assert (g > 0) == (kg > 0) == (rk.tokens > 0)
        assert r["max_ms"] == pytest.approx(max(f + b for f, b in zip(r["fwd_ms"], r["bwd_ms"])),
                                            abs=1e-3)


def test_adaptive_is_planned_as_cp_bench_plans_it():
    # cp_bench ranks adaptive by kernel time alone; at 128K tokens and C = 4 the default link
    # makes adaptive choose other plans, whose rows would pair with none of cp_bench's.
    model = wlb.KernelModel.analytic(heads=32, head_dim=128)
    differs = 0
    for seed in (1, 2, 3, 4):
        lengths = tcb.wlb_like_micro_batch(wlb, 131072, seed)
        ours = tcb.plan_like_cp_bench(wlb, lengths, 4, "adaptive", model)
        cp_bench = wlb.plan_shards(lengths, 4, "adaptive", model, **KERNEL_TIME_ONLY)
        default = wlb.plan_shards(lengths, 4, "adaptive", model)
        assert [rk.predicted_ms for rk in ours.ranks] == [rk.predicted_ms for rk in cp_bench.ranks]
        differs += [rk.predicted_ms for rk in default.ranks] != [rk.predicted_ms for rk in ours.ranks]
        per_doc = tcb.plan_like_cp_bench(wlb, lengths, 4, "per-doc", model)
        assert per_doc.strategy == "per-doc"  # the measured strategies keep the default options
    assert differs > 0


def test_a_wrong_attention_fails_the_check(monkeypatch, capsys):
    from wlb.torch import attention as att

    real = att.varlen_causal_attention

    def drops_the_first_key(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, backend=None):
        if k.shape[0] != q.shape[0]:  # a CP rank's keys (the reference has as many as queries)
            k = k.clone()
            k[0] = 0  # a wrong key row: what a bad key_rows map would give
        return real(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, backend=backend)

    monkeypatch.setattr("wlb.torch.varlen_causal_attention", drops_the_first_key)
    monkeypatch.setattr(sys.modules["wlb.torch.cp_attention.layer"], "varlen_causal_attention",
                        drops_the_first_key)
    assert tcb.main(SMALL[:-4] + ["--micro-batches", "1", "--iters", "1", "--warmup", "0",
                                  "--cp", "2"]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_compare_pairs_rows_with_the_same_plan(tmp_path):
    torch_rows = tmp_path / "torch.jsonl"
    torch_rows.write_text("\n".join(json.dumps(r) for r in [
        {"kernel": "torch-varlen", "cp": 2, "mb": 0, "strategy": "per-doc", "max_ms": 3.0,
         "predicted_fwd_ms": [1.0, 1.0]},
        {"kernel": "torch-varlen", "cp": 2, "mb": 1, "strategy": "per-doc", "max_ms": 5.0,
         "predicted_fwd_ms": [2.0, 2.0]}]) + "\n")
    ours = tmp_path / "cp_bench_c2.jsonl"
    ours.write_text("\n".join(json.dumps(r) for r in [
        {"kernel": "flash", "cp": 2, "mb": 0, "strategy": "per-doc", "max_ms": 2.0,
         "predicted_fwd_ms": [1.0, 1.0]},
        {"kernel": "flash", "cp": 2, "mb": 1, "strategy": "per-doc", "max_ms": 9.0,
         "predicted_fwd_ms": [2.0, 2.5]}]) + "\n")  # another plan: not paired
    lines = tcb.compare([str(ours)], str(torch_rows))
    assert "| flash | torch-varlen | 2 | per-doc | 1 | 2.000 | 3.000 | 1.500 |" in lines
    assert lines[-1].startswith("1 cp_bench rows not paired")


@pytest.mark.parametrize("bad", [["--cp", "2,x"], ["--strategies", "zigzag"],
                                 ["--heads", "3", "--kv-heads", "2"], ["--iters", "0"]])
def test_bad_arguments_exit_2(bad):
    with pytest.raises(SystemExit) as e:
        tcb.parse_args(bad)
    assert e.value.code == 2
