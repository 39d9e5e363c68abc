"""Package surface: version, stubs, models, lengths helpers and the README example."""

import importlib.metadata
import importlib.util
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import wlb
from conftest import REPO


def test_version_matches_cmake_project():
    cmake = (REPO / "CMakeLists.txt").read_text()
    version = re.search(r"project\(wlb VERSION ([0-9.]+)", cmake).group(1)
    assert wlb.__version__ == version
    assert importlib.metadata.version("wlb") == version


def test_stubs_and_marker_ship_with_the_package():
    assert (pathlib.Path(wlb.__file__).parent / "py.typed").is_file()
    # Next to the extension (in an editable install that is not where __init__.py is).
    extension = pathlib.Path(importlib.util.find_spec("wlb._wlb").origin)
    stub = (extension.parent / "_wlb.pyi").read_text()
    for name in ("class Packer", "def push", "def plan_shards", "class ShardPlan",
                 "def state_dict", "class CostModel", "class KernelModel"):
        assert name in stub


def test_cost_models():
    cost = wlb.CostModel.from_preset("llama2-7b")
    assert set(wlb.CostModel.presets()) >= {"llama2-7b", "llama2-70b", "wlb-550m"}
    assert cost.unit == "flop"
    # 32 layers x (4h * d(d+1)/2) attention + linear FLOPs.
    assert cost.attention(1000) == pytest.approx(32 * 4 * 4096 * 1000 * 1001 / 2)
    assert cost(1000) == pytest.approx(cost.attention(1000) + cost.linear(1000))
    assert np.allclose(cost(np.array([10, 1000])), [cost(10), cost(1000)])
    same = wlb.CostModel.from_shape(4096, 11008, 32, 32, 32)
    assert same(777) == pytest.approx(cost(777))
    d = np.array([64, 256, 1024, 4096, 16384])
    ms = 3e-8 * d.astype(float) ** 2 + 2e-5 * d + 0.01
    fit = wlb.CostModel.fit(d, ms)
    assert fit.unit == "ms"
    assert fit.attn_quadratic == pytest.approx(3e-8, rel=1e-6)
    assert fit.per_document == pytest.approx(0.01, rel=1e-6)
    assert "rms rel. error" in fit.description
    packer = wlb.Packer("wlb", context=4096, cost=fit)
    assert packer.cost.attn_quadratic == fit.attn_quadratic


def test_cost_model_from_profile(tmp_path):
    csv = tmp_path / "profile.csv"
    csv.write_text("L,ms\n" + "".join(f"{d},{1e-6 * d * d + 0.01}\n" for d in (64, 512, 4096, 8192)))
    model = wlb.CostModel.from_profile(str(csv))
    assert model(4096) == pytest.approx(1e-6 * 4096**2 + 0.01, rel=1e-6)
    packer = wlb.Packer("wlb", context=8192, cost=str(csv))
    assert packer.cost.unit == "ms"


def test_kernel_models(tmp_path):
    # The default is the measured H100 table: a 128-row segment over 4096 keys as timed.
    default = wlb.KernelModel()
    assert default.tile_q == 128 and not default.analytic_model
    assert default.segment_ms(128, 4096) == pytest.approx(0.135779, rel=1e-9)
    analytic = wlb.KernelModel.analytic()
    assert analytic.analytic_model
    # Flat latency for query shards of 1..128 tokens (one tile), as the paper measured.
    assert analytic.segment_ms(16, 4096) == pytest.approx(analytic.segment_ms(128, 4096))
    assert analytic.segment_ms(256, 4096) > analytic.segment_ms(128, 4096)
    csv = tmp_path / "kernel.csv"
    csv.write_text("q_len,kv_len,ms\n128,128,0.01\n128,4096,0.1\n1024,4096,0.5\n")
    table = wlb.KernelModel.from_profile(str(csv))
    assert not table.analytic_model
    assert table.segment_ms(128, 4096) == pytest.approx(0.1)


def test_lengths_helpers(tmp_path):
    a = wlb.sample_default_lengths(1 << 20, seed=3)
    b = wlb.sample_default_lengths(1 << 20, seed=3)
    assert a.dtype == np.int64 and np.array_equal(a, b) and a.sum() >= 1 << 20
    assert a.max() <= 131072 and a.min() >= 1
    f = tmp_path / "lengths.txt"
    f.write_text("# comment\n5\n\n300000\n19\n")
    assert wlb.read_lengths(str(f)).tolist() == [5, 300000, 19]
    assert wlb.parse_lengths("[1, 2, 3]").tolist() == [1, 2, 3]
    docs = wlb.make_documents([5, 300000, 19], 131072)
    assert docs.ids.tolist() == [0, 1, 1, 1, 2]
    assert docs.pieces.tolist() == [0, 0, 1, 2, 0]
    assert docs.offsets.tolist() == [0, 0, 131072, 262144, 0]
    assert docs.lengths.tolist() == [5, 131072, 131072, 37856, 19]
    assert docs.tokens == 300024
    assert wlb.default_thresholds(131072, 2) == [32768, 65536]
    assert wlb.default_max_tokens(131072) == 163840
    assert {"original", "fixed-greedy", "wlb", "wlb-refine"} <= set(wlb.packer_names())


def test_arrays_accept_lists_numpy_and_other_int_dtypes():
    for lengths in ([3, 4, 5], np.array([3, 4, 5], dtype=np.int32),
                    np.array([3, 4, 5], dtype=np.uint16), np.arange(10, dtype=np.int64)[3:6],
                    np.array([5, 4, 3])[::-1]):
        packer = wlb.Packer("original", context=4, micro_batches=3)
        steps = packer.push(lengths) + packer.flush()
        assert sum(int(s.tokens.sum()) for s in steps) == 12


def test_readme_example_runs():
    example = REPO / "examples" / "python" / "plan_steps.py"
    out = subprocess.run([sys.executable, str(example)], check=True, capture_output=True,
                         text=True).stdout
    assert "resumed plan matches" in out
