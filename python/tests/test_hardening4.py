"""Hardening IV (issue 59), by class: numbers checked at every Python boundary (numpy scalars
taken where a Python number is, bools and floats refused where an int is, messages naming the
value and its type), measurements that cannot identify the fit refused (also in the online
refit), sources taken literally before globs and save_to_disk folders checked, process groups and
CP ranks checked before they are used, and a check that fails on one CP rank raised on every
rank instead of a hang. Each table below is the class's property test: a new entry point is
added to the table and gets every check."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet  # noqa: E402,F401

import wlb  # noqa: E402
from cp_workers import spawn  # noqa: E402
from wlb._checks import describe, integer, real  # noqa: E402
from wlb.formats import ArrowTokens  # noqa: E402
from wlb.torch import (CPAttention, OnlineCalibration, PackedCollate,  # noqa: E402
                       PackedSeqParams, cp_varlen_args)
from wlb.torch import hf as wlb_hf  # noqa: E402

# ---- numbers at the boundary --------------------------------------------------------------------

_PLAN = wlb.plan_shards([5, 5], 2, "per-doc")
_HF_BATCH = PackedCollate(format="hf")([(0, 0, np.arange(5)), (1, 0, np.arange(5))])
_CU = torch.tensor([0, 4], dtype=torch.int32)

# name -> (call(value), a value every accepted form of which must pass, the argument's name in
# the message, "int", "real" or "real or None").
NUMBER_ENTRIES = {
    "OnlineCalibration refit_every": (lambda v: OnlineCalibration(refit_every=v), 3,
                                      "refit_every", "int"),
    "OnlineCalibration window": (lambda v: OnlineCalibration(window=v), 6, "window", "int"),
    "OnlineCalibration delay": (lambda v: OnlineCalibration(delay=v), 1, "delay", "int"),
    "OnlineCalibration min_samples": (lambda v: OnlineCalibration(min_samples=v), 9,
                                      "min_samples", "int"),
    "OnlineCalibration.record ms": (lambda v: OnlineCalibration().record([3, 4], v), 2.5,
                                    "measured time", "real"),
    "PackedCollate ignore_index": (lambda v: PackedCollate(ignore_index=v), -100, "ignore_index",
                                   "int"),
    "cp_varlen_args rank": (lambda v: cp_varlen_args(_PLAN, v), 1, "rank", "int"),
    "cp_inputs rank": (lambda v: wlb_hf.cp_inputs(_HF_BATCH, _PLAN, v), 1, "rank", "int"),
    "cp_inputs ignore_index": (lambda v: wlb_hf.cp_inputs(_HF_BATCH, _PLAN, 0, ignore_index=v),
                               -100, "ignore_index", "int"),
    "PackedSeqParams cp_rank": (lambda v: PackedSeqParams(_CU, _CU, 4, 4, cp_size=2, cp_rank=v),
                                1, "cp_rank", "int"),
    "PackedSeqParams cp_size": (lambda v: PackedSeqParams(_CU, _CU, 4, 4, cp_size=v), 2,
                                "cp_size", "int"),
    "PackedSeqParams max_seqlen_q": (lambda v: PackedSeqParams(_CU, _CU, v, 4), 4,
                                     "max_seqlen_q", "int"),
    "CPAttention scale": (lambda v: CPAttention(_PLAN, scale=v), 0.125, "scale", "real or None"),
}


def _accepted_forms(value, kind):
    forms = [value, np.int64(value), np.int32(value)] if kind == "int" else \
        [value, np.float32(value), np.float64(value), np.int64(int(value) or 1)]
    return forms


@pytest.mark.parametrize("name", sorted(NUMBER_ENTRIES))
def test_numpy_scalars_are_numbers_and_bools_or_floats_are_not(name):
    call, good, argument, kind = NUMBER_ENTRIES[name]
    for form in _accepted_forms(good, kind):
        call(form)  # accepted: a numpy scalar is a number
    refused = [True, False, np.bool_(True), "3", float("nan")]
    if kind == "real or None":
        call(None)
    else:
        refused.append(None)
    if kind == "int":
        refused += [1.5, float(good), np.float64(good)]
    else:
        refused += [float("inf"), -1.0, 0.0]
    for bad in refused:
        with pytest.raises(ValueError) as error:
            call(bad)
        message = str(error.value)
        assert argument in message, (name, bad, message)
        assert describe(bad) in message, (name, bad, message)  # the value and its type


def test_collate_never_writes_a_cast_ignore_index():
    """PackedCollate(ignore_index=1.5 or True) used to write 1 into the labels."""
    for bad in (1.5, True, np.float32(-100)):
        with pytest.raises(ValueError, match="ignore_index must be an integer"):
            PackedCollate(ignore_index=bad)
    labels = PackedCollate(ignore_index=np.int64(-7))([(0, 0, np.arange(4))])["labels"]
    assert labels.tolist() == [1, 2, 3, -7]


def test_checks_helpers_name_value_and_type():
    assert describe(np.float32(2.5)).endswith(" (numpy.float32)")
    assert describe(True) == "True (bool)"
    assert integer("n", np.int64(3), 0, 5) == 3 and type(integer("n", np.int64(3))) is int
    assert real("x", np.float32(2.5)) == 2.5
    with pytest.raises(ValueError, match=r"x must be a finite number in \[0, inf\], got 1000+\.\.\. "
                                         r"\(int\)"):
        real("x", 10**400, 0)
    with pytest.raises(ValueError, match=r"n must be an integer in \[0, 5\], got True \(bool\)"):
        integer("n", True, 0, 5)


# ---- OnlineCalibration: lengths, groups, refused fits ------------------------------------------

def test_measure_refuses_lengths_that_would_wrap():
    """uint64 lengths above 2^63 used to wrap into negative int64 lengths; the refit then failed
    and the saved state could not be loaded."""
    calibration = OnlineCalibration()
    for lengths in (np.array([2**63 + 5], dtype=np.uint64), np.array([2**64 - 1], dtype=np.uint64),
                    np.array([3, 2**40], dtype=np.int64)):
        with pytest.raises(ValueError, match=r"document of length \d+ \((uint64|int64)\); "
                                             r"lengths must be in \[1, 16777216\]"):
            with calibration.measure(lengths):
                pass
        with pytest.raises(ValueError, match="lengths must be in"):
            calibration.record(lengths, 1.0)
    calibration.record(np.array([5, 7], dtype=np.uint64), np.float32(1.5))
    assert calibration.state_dict()["current"] == [[[5, 7], 1.5]]


def test_group_must_be_a_process_group_at_construction():
    for bad in ("default", 3, object(), [0, 1]):
        with pytest.raises(TypeError, match="group must be None, 'world' or a torch.distributed "
                                            "process group, got"):
            OnlineCalibration(group=bad)
    OnlineCalibration(group=None)
    OnlineCalibration(group="world")


def test_refit_refuses_measurements_that_cannot_identify_the_terms():
    """Every micro-batch alike (or every one a single document) used to be fitted with an
    arbitrary split between the terms and a 0.0% held-out error."""
    rng = np.random.default_rng(59)
    for lengths_of in (lambda i: [300, 40, 7],                         # all alike
                       lambda i: [int(rng.integers(1, 5000))]):        # one document each
        calibration = OnlineCalibration(refit_every=4, window=8, min_samples=8)
        for step in range(8):
            for _ in range(3):
                calibration.record(lengths_of(step), float(rng.uniform(1, 2)))
            calibration.end_step()
        assert calibration.fits() == [], calibration.fits()
        assert calibration.refits_skipped >= 1
        assert "cannot tell apart the terms" in calibration.last_error, calibration.last_error
    with pytest.raises(ValueError, match=r"cannot tell apart the terms c \(documents\), per call"):
        wlb.fit_micro_batch_cost([np.array([int(n)]) for n in rng.integers(1, 9000, 20)],
                                 rng.uniform(1, 2, 20).tolist())


# ---- sources ----------------------------------------------------------------------------------

def test_existing_paths_are_literal_before_globs(tmp_path):
    """A file whose name holds '[', '?' or '*' used to be taken as a glob: nothing read, or
    silently another file."""
    docs = [[1, 2, 3], [4, 5]]
    other = [[9] * 7]
    for name in ("data[1].parquet", "what?.parquet", "star*.parquet"):
        pa.parquet.write_table(pa.table({"input_ids": docs}), tmp_path / name)
    pa.parquet.write_table(pa.table({"input_ids": other}), tmp_path / "data1.parquet")
    pa.parquet.write_table(pa.table({"input_ids": other}), tmp_path / "whatX.parquet")
    for name in ("data[1].parquet", "what?.parquet", "star*.parquet"):
        source = ArrowTokens(str(tmp_path / name))
        assert source.lengths.tolist() == [3, 2], name
    # A glob that names no existing file still globs.
    assert ArrowTokens(str(tmp_path / "data?.parquet")).lengths.tolist() == [7]


def test_save_to_disk_state_without_a_file_list_is_named(tmp_path):
    folder = tmp_path / "saved"
    folder.mkdir()
    for state, match in (({}, "has no '_data_files' list"),
                         ({"_data_files": []}, "has no '_data_files' list"),
                         ({"_data_files": [{"name": "x"}]}, "has no relative 'filename'"),
                         ({"_data_files": [{"filename": "/etc/passwd"}]},
                          "has no relative 'filename'"),
                         ([1, 2], "has no '_data_files' list")):
        (folder / "state.json").write_text(json.dumps(state))
        with pytest.raises(ValueError, match=match):
            ArrowTokens(str(folder))
    (folder / "state.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not readable JSON"):
        ArrowTokens(str(folder))


# ---- CP ranks ---------------------------------------------------------------------------------

def _hf_one_rank_fails(rank, world, payload):
    """Rank 1's layer attends under a window its plan does not have: every rank must raise the
    same error (before the fix rank 1 raised alone and rank 0 hung in the agreement)."""
    batch = PackedCollate(format="hf")([(0, 0, np.arange(6)), (1, 0, np.arange(6))])
    plan = wlb_hf.plan_shards(batch, world, "per-doc")
    inputs = wlb_hf.cp_inputs(batch, plan, rank)
    tokens = plan[rank].tokens
    q = torch.zeros(1, 4, tokens, 8, dtype=torch.float64)
    kv = torch.zeros(1, 2, tokens, 8, dtype=torch.float64)

    class Layer:
        layer_idx = 0
        sliding_window = 4 if rank == 1 else None

    out = {}
    try:
        wlb_hf.cp_attention_forward(Layer(), q, kv, kv, None, **inputs)
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    try:  # another rank's shard: refused, not a silently wrong loss
        wlb_hf.cp_inputs(batch, plan, 1 - rank)
        out["other"] = None
    except ValueError as e:
        out["other"] = str(e)
    return out


def test_a_check_failing_on_one_hf_rank_raises_on_every_rank():
    results = spawn(2, _hf_one_rank_fails, None, timeout=120.0)
    for rank, result in enumerate(results):
        assert result["error"] is not None, rank
        assert "rank 1 of 2 rejected its inputs" in result["error"], result["error"]
        assert "attends under 'window:4'" in result["error"], result["error"]
        assert result["other"] == (f"rank {1 - rank} is not this process's rank in the default "
                                   f"group ({rank}); give cp_inputs dist.get_rank(group) for the "
                                   "group it is passed"), result["other"]
