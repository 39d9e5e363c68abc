"""Bad input raises ValueError / TypeError / OSError with the library's message, never crashes."""

import numpy as np
import pytest

import wlb


@pytest.fixture
def packer():
    return wlb.Packer("wlb", context=1024, micro_batches=2)


@pytest.mark.parametrize("lengths, message", [
    ([5, -3], "document 1: document length must be > 0, got -3"),
    ([0], "document 0: document length must be > 0, got 0"),
    (np.array([4, 0, 2], dtype=np.int32), "got 0"),
])
def test_bad_lengths_raise_value_error(packer, lengths, message):
    with pytest.raises(ValueError, match=message):
        packer.push(lengths)
    assert packer.next_document_id == 0 and len(packer.pending) == 0  # nothing happened


@pytest.mark.parametrize("lengths, message", [
    ([1.5, 2.0], "integer array, got a float64"),
    (np.array([3, 4], dtype=np.float32), "integer array, got a float32"),
    (np.array([True, False]), "got a bool"),
    ([[1, 2], [3, 4]], "1-D integer array, got 2 dimensions"),
    (7, "got 0 dimensions"),
    ("lengths", "1-D integer array"),
])
def test_wrong_dtypes_raise_type_error(packer, lengths, message):
    with pytest.raises(TypeError, match=message):
        packer.push(lengths)


def test_wrong_argument_types_raise_type_error(packer):
    with pytest.raises(TypeError):
        packer.push(None)
    with pytest.raises(TypeError):
        wlb.Packer("wlb", micro_batches="four")
    with pytest.raises(TypeError):
        wlb.plan_shards([3, 4], "two")
    with pytest.raises(TypeError):
        packer.load_state_dict({"packer_state": "not bytes"})


def test_uint64_overflow(packer):
    with pytest.raises(ValueError, match="does not fit int64"):
        packer.push(np.array([2**63], dtype=np.uint64))


@pytest.mark.parametrize("kwargs, message", [
    ({"micro_batches": 0}, r"micro-batches per step \(N\) must be in \[1, 4096\], got 0"),
    ({"micro_batches": -2}, "got -2"),
    ({"context": 0}, r"context window \(S\) must be in \[1, 16777216\] tokens, got 0"),
    ({"context": 1000, "max_tokens": 999}, r"S_max\) 999 is below the context window"),
    ({"thresholds": [500, 400]}, "strictly increasing"),
    ({"thresholds": [0]}, r"outlier threshold 0 is outside \[1, 131072\]"),
    ({"queues": 17}, r"queues must be in \[0, 16\], got 17"),
    ({"cost": "gpt-5"}, "neither a readable profile file nor a preset"),
])
def test_bad_packer_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        wlb.Packer("wlb", **kwargs)


def test_unknown_packer_and_window():
    with pytest.raises(ValueError, match="unknown packer 'best' \\(known: original"):
        wlb.Packer("best")
    with pytest.raises(ValueError, match=r"fixed-greedy window must be in \[1, 4096\] steps, got 0"):
        wlb.Packer("fixed-greedy", window=0)
    # Keyword arguments are read by wlb-plan's parser (wlb::kPlanSettings), with its message.
    with pytest.raises(ValueError, match="--delay-budget must be a finite number >= 0, got -1"):
        wlb.Packer("wlb-lookahead", delay_budget=-1.0)
    budgeted = wlb.Packer("wlb-lookahead", delay_budget=0.25)  # a budget in range is taken
    assert budgeted.flush() == []


@pytest.mark.parametrize("name, kwargs, message", [
    ("wlb", {"window": 2},
     "--window is not used by this run: only fixed-greedy reads it, and the packer is 'wlb'"),
    ("original", {"thresholds": [1000]},
     r"--thresholds is not used by this run: only wlb, wlb-refine, wlb-lookahead and .* read it, "
     "and the packer is 'original'"),
    ("fixed-greedy", {"queues": 1}, "--queues is not used by this run: .*'fixed-greedy'"),
    ("wlb", {"lookahead": 2},
     "--lookahead is not used by this run: only wlb-lookahead reads it, and the packer is 'wlb'"),
    ("wlb", {"refine_rounds": 3},
     "--refine-rounds is not used by this run: only wlb-refine, wlb-lookahead read it"),
    ("wlb-refine", {"delay_budget": 0.5},
     "--delay-budget is not used by this run: .*'wlb-refine'"),
    ("wlb-refine", {"bound_delay": True},
     "--bound-delay is not used by this run: only wlb-lookahead reads it, and the packer is "
     "'wlb-refine'"),
])
def test_an_option_the_packer_does_not_use_is_an_error(name, kwargs, message):
    # Never silently ignored: the one check and wording of wlb-plan's (PlanSpec::Validate),
    # naming the option, the packers that read it and the packer.
    with pytest.raises(ValueError, match=f"^{message}"):
        wlb.Packer(name, context=4096, **kwargs)
    wlb.Packer("wlb-lookahead", context=4096, queues=1, lookahead=2, refine_rounds=3,
               delay_budget=0.5, bound_delay=True)  # all used by wlb-lookahead
    wlb.Packer("wlb-lookahead", context=4096, bound_delay=False)  # the delay price alone


def test_piece_longer_than_context_is_rejected(packer):
    docs = wlb.Documents([0], [2000])
    with pytest.raises(ValueError, match=r"length 2000 is outside \[1, 1024\]"):
        packer.push(docs)
    with pytest.raises(ValueError, match="same size"):
        wlb.Documents([0, 1], [3])
    with pytest.raises(ValueError, match="need id >= 0"):
        wlb.Documents([-1], [3])


def test_corrupted_state_is_rejected_and_leaves_packer_unchanged(packer):
    packer.push([900, 600, 700, 30, 20])
    blob = packer.save_state()
    before = packer.save_state()
    flipped = bytearray(blob)
    flipped[-5] ^= 1
    with pytest.raises(ValueError, match="checksum .* does not match the payload"):
        packer.restore_state(bytes(flipped))
    with pytest.raises(ValueError, match="missing the 'wlb-packer-state v1' header"):
        packer.restore_state(b"hello")
    with pytest.raises(ValueError, match="missing the 'wlb-packer-state v1' header"):
        packer.restore_state(blob[:10])
    other = wlb.Packer("wlb", context=2048, micro_batches=2)
    with pytest.raises(ValueError, match="packer state was saved by"):
        other.restore_state(blob)
    with pytest.raises(ValueError, match="no 'packer_state'"):
        packer.load_state_dict({})
    with pytest.raises(ValueError, match="next_document_id"):
        packer.load_state_dict({"packer_state": blob, "next_document_id": -1})
    assert packer.save_state() == before


def test_shard_errors():
    with pytest.raises(ValueError, match=r"cp_size must be in \[1, 4096\], got 0"):
        wlb.plan_shards([3, 4], 0)
    # documents x C is bounded (2^26): the balancing strategies weigh every document on every rank.
    with pytest.raises(ValueError, match="16385 documents at cp_size 4096: .* over the limit 67108864"):
        wlb.plan_shards([1] * 16385, 4096)
    with pytest.raises(ValueError, match="unknown sharding 'zigzag'"):
        wlb.plan_shards([3, 4], 2, "zigzag")
    with pytest.raises(ValueError, match="document length must be > 0"):
        wlb.plan_shards([3, -4], 2)
    with pytest.raises(ValueError, match="document 0 has 2147483648 tokens, above the limit"):
        wlb.plan_shards([2**31, 5], 1, "per-seq")
    with pytest.raises(ValueError, match="exceed the int32 cu_seqlens_k"):
        wlb.plan_shards([2**24] * 128, 1, "per-seq")


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="cannot open lengths file"):
        wlb.read_lengths(str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_text("12\n-3\n")
    with pytest.raises(ValueError, match="bad.txt:2: '-3' is not a positive integer length"):
        wlb.read_lengths(str(bad))
    with pytest.raises(FileNotFoundError, match="cannot open kernel profile"):
        wlb.KernelModel.from_profile(str(tmp_path / "missing.csv"))
    with pytest.raises(FileNotFoundError, match="cannot open profile"):
        wlb.CostModel.from_profile(str(tmp_path / "missing.csv"))


def test_model_errors():
    with pytest.raises(ValueError, match="unknown cost preset 'x'"):
        wlb.CostModel.from_preset("x")
    with pytest.raises(ValueError, match="at least 3 profile points"):
        wlb.CostModel.fit([1, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match=r"latency in \[1e-06, 1e\+07\] ms"):
        wlb.CostModel.fit([1, 2, 3], [0.1, -0.2, 0.3])
    with pytest.raises(ValueError, match="attn_quadratic must be >= 0"):
        wlb.CostModel(attn_quadratic=-1.0)
    with pytest.raises(ValueError, match="peak_tflops must be > 0"):
        wlb.KernelModel.analytic(peak_tflops=0.0)
    with pytest.raises(ValueError, match="need 0 < q_len <= kv_len"):
        wlb.KernelModel.from_points([128], [64], [1.0])
    with pytest.raises(ValueError, match=r"tokens per step \(S x N\) must be in \[1, .*got 0"):
        wlb.split_into_steps(wlb.make_documents([3], 8), 0)
    with pytest.raises(ValueError, match=r"got 68719476737"):
        wlb.split_into_steps(wlb.make_documents([3], 8), 2**36 + 1)
    with pytest.raises(ValueError, match="min_total_tokens must be in"):
        wlb.sample_default_lengths(-1)
