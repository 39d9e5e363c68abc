"""Micro-batch measurements as a cost: wlb.fit_micro_batch_cost, the measurement CSV reader and
the shipped calibrations (presets), as the Python API exposes them."""

import math
import pathlib

import numpy as np
import pytest

import wlb

REPO = pathlib.Path(__file__).resolve().parents[2]
MEASURED_7B = REPO / "docs/results/gpu/h100_layer_7b_128k_measurements.csv"


def synthetic(rng, a, b, c, per_call, rows=96, noise=0.02):
    lengths, ms = [], []
    for _ in range(rows):
        # Log-uniform lengths (many short documents, as real streams).
        size = rng.integers(1, 11)
        d = np.exp(rng.uniform(np.log(32), np.log(120000), size=size)).astype(np.int64)
        truth = a * float((d.astype(np.float64) ** 2).sum()) + b * float(d.sum()) + c * len(d)
        lengths.append(d)
        ms.append((truth + per_call) * (1 + rng.uniform(-noise, noise)))
    return lengths, np.array(ms)


def test_fit_recovers_known_curves_under_seeded_noise():
    rng = np.random.default_rng(7)
    for _ in range(10):
        a, b = rng.uniform(0.5, 3) * 3e-9, rng.uniform(0.5, 3) * 1e-4
        c, per_call = rng.uniform(0.5, 3) * 0.01, rng.uniform(0.5, 3) * 0.1
        lengths, ms = synthetic(rng, a, b, c, per_call)
        fit = wlb.fit_micro_batch_cost(lengths, ms)
        assert fit.model.unit == "ms"
        assert fit.model.attn_quadratic == pytest.approx(a, rel=0.05)
        assert fit.in_sample.max_relative < 0.05
        assert fit.held_out.mean_relative < 0.03
        assert fit.held_out.points == len(lengths)
        assert fit.held_out_rule == "by position parity"
        one = np.array([30000])
        want = a * 30000**2 + b * 30000 + c + per_call
        assert fit.predict(one) == pytest.approx(want, rel=0.05)
        assert fit.predict(one) == pytest.approx(fit.model(30000) + fit.per_call_ms)


def test_noise_free_fit_is_exact_and_steps_choose_the_split():
    rng = np.random.default_rng(3)
    lengths, ms = synthetic(rng, 2e-9, 1e-4, 0.02, 0.3, rows=40, noise=0.0)
    fit = wlb.fit_micro_batch_cost(lengths, ms, step=np.arange(40) // 4)
    assert fit.held_out_rule == "by step parity"
    assert fit.in_sample.max_relative < 1e-9
    assert fit.held_out.max_relative < 1e-9
    assert fit.per_call_ms == pytest.approx(0.3, rel=1e-6)
    assert fit.model.per_document == pytest.approx(0.02, rel=1e-6)


def test_the_fit_plans_as_a_cost_model():
    rng = np.random.default_rng(5)
    fit = wlb.fit_micro_batch_cost(*synthetic(rng, 2e-9, 1e-4, 0.0, 0.1))
    packer = wlb.Packer("wlb", context=32768, micro_batches=4, cost=fit.model)
    assert packer.cost.unit == "ms"
    steps = packer.push(rng.integers(100, 32768, size=40)) + packer.flush()
    assert sum(len(mb.ids) for s in steps for mb in s.micro_batches) == 40


def test_bad_input_names_the_row_and_value():
    lengths = [np.array([100, 200])] * 8
    ms = np.ones(8)
    bad = ms.copy()
    bad[3] = math.nan
    with pytest.raises(ValueError, match=r"row 3: time nan ms"):
        wlb.fit_micro_batch_cost(lengths, bad)
    bad[3] = -1.0
    with pytest.raises(ValueError, match=r"row 3: time -1 ms"):
        wlb.fit_micro_batch_cost(lengths, bad)
    bad[3] = 0.0
    with pytest.raises(ValueError, match=r"row 3: time 0 ms"):
        wlb.fit_micro_batch_cost(lengths, bad)
    with pytest.raises(ValueError, match=r"row 2: no document lengths"):
        wlb.fit_micro_batch_cost(lengths[:2] + [np.array([], dtype=np.int64)] + lengths[3:], ms)
    with pytest.raises(ValueError, match=r"row 5: document length 0 is not in"):
        wlb.fit_micro_batch_cost(lengths[:5] + [np.array([0])] + lengths[6:], ms)
    with pytest.raises(TypeError, match=r"lengths\[1\] must be an integer array"):
        wlb.fit_micro_batch_cost([lengths[0], np.array([1.5])] + lengths[2:], ms)
    with pytest.raises(ValueError, match=r"3 micro-batches for 4 unknowns"):
        wlb.fit_micro_batch_cost(lengths[:3], ms[:3])
    with pytest.raises(ValueError, match=r"lengths has 8 micro-batches but ms has 7"):
        wlb.fit_micro_batch_cost(lengths, ms[:7])
    with pytest.raises(ValueError, match=r"row 1: step -1 is not in"):
        wlb.fit_micro_batch_cost(lengths, ms, step=[0, -1, 2, 3, 4, 5, 6, 7])
    varied = [np.arange(1, k + 2) * 100 for k in range(8)]  # 1..8 documents: identifiable
    with pytest.raises(ValueError, match=r"odd half: 0 micro-batches"):
        wlb.fit_micro_batch_cost(varied, ms, step=[2] * 8)
    with pytest.raises(ValueError, match=r"needs measurements, got none"):
        wlb.fit_micro_batch_cost([], [])


def test_reads_the_committed_h100_measurements_and_matches_the_shipped_preset(tmp_path):
    data = wlb.read_micro_batch_measurements(str(MEASURED_7B))
    assert len(data["lengths"]) == 288 and data["ms"].shape == (288,)
    assert data["step"] is not None and data["step"].min() == 2
    fit = wlb.fit_micro_batch_cost(**data)
    assert fit.held_out_rule == "by step parity"
    shipped = wlb.CostModel.from_preset("h100-flash-llama2-7b-tp8")
    assert shipped.unit == "ms"
    assert fit.model.attn_quadratic == pytest.approx(shipped.attn_quadratic, rel=1e-6)
    assert fit.model.linear_per_token == pytest.approx(shipped.linear_per_token, rel=1e-6)
    assert fit.held_out.mean_relative < 0.02
    assert "h100-flash-llama2-7b-tp8" in wlb.CostModel.presets()
    assert "h100-cudnn-wlb-550m-tp2" in wlb.CostModel.presets()
    by_name = wlb.Packer("wlb", context=131072, cost="h100-flash-llama2-7b-tp8")
    by_file = wlb.Packer("wlb", context=131072, cost=str(MEASURED_7B))
    assert by_name.cost.attn_quadratic == pytest.approx(by_file.cost.attn_quadratic, rel=1e-6)
    assert "held out by step parity" in by_file.cost.description
    bad = tmp_path / "bad.csv"
    bad.write_text("# provenance\nstep,ms,lengths\n0,1.5,100;200\n1,2.5,100;x\n")
    with pytest.raises(ValueError, match=r"bad.csv:4: document length 'x'"):
        wlb.read_micro_batch_measurements(str(bad))
    with pytest.raises(FileNotFoundError):
        wlb.read_micro_batch_measurements(str(tmp_path / "missing.csv"))
