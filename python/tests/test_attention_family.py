"""The cost follows the attention implementation: the per-document and dense families of
wlb.CostModel, their micro-batch fit, packing under a dense cost, wlb.torch.hf's choice of family
from a transformers model, OnlineCalibration with HF batches and the dense family, and wlb's CP
attention at cp = 1 without a process group."""

import os

import numpy as np
import pytest

import wlb

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_shape_families_and_the_micro_batch_cost():
    per_doc = wlb.CostModel.from_shape(hidden=64, ffn=96, heads=4, kv_heads=2, layers=3)
    dense = wlb.CostModel.from_shape(hidden=64, ffn=96, heads=4, kv_heads=2, layers=3,
                                     attention="dense")
    assert wlb.CostModel.attention_families() == ["per-document", "dense"]
    assert per_doc.attention_family == "per-document" and dense.attention_family == "dense"
    assert dense.dense_quadratic == 3 * 4 * 64 and dense.attn_quadratic == 0 == dense.attn_linear
    assert dense.linear_per_token == per_doc.linear_per_token  # projections and MLP alike
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 5000, size=int(rng.integers(1, 9)))
        t = float(lengths.sum())
        assert per_doc.micro_batch(lengths) == pytest.approx(per_doc(lengths).sum(), rel=1e-12)
        assert dense.micro_batch(lengths) == pytest.approx(
            dense(lengths).sum() + dense.dense_quadratic * t * t, rel=1e-12)
    with pytest.raises(ValueError, match="unknown attention family 'flash' "
                                         r"\(known: per-document, dense\)"):
        wlb.CostModel.from_shape(hidden=64, ffn=96, heads=4, kv_heads=2, layers=3,
                                 attention="flash")
    with pytest.raises(ValueError, match="dense_quadratic must be >= 0 and finite, got -1"):
        wlb.CostModel(dense_quadratic=-1.0)


def synthetic(rng, count, a, b, c, per_call, dense):
    lengths, ms, steps = [], [], []
    for i in range(count):
        mb = rng.integers(1, 4000, size=int(rng.integers(1, 7)))
        t = float(mb.sum())
        quad = t * t if dense else float((mb.astype(float) ** 2).sum())
        lengths.append(mb)
        ms.append(a * quad + b * t + c * len(mb) + per_call)
        steps.append(i // 4)
    return lengths, np.array(ms), steps


@pytest.mark.parametrize("seed", range(6))
def test_dense_fit_recovers_a_dense_cost_that_the_per_document_fit_cannot(seed):
    rng = np.random.default_rng(seed)
    a, b, c, p = (float(x) for x in rng.uniform(0.2, 2.0, size=4) * [1e-6, 1e-3, 1e-2, 0.5])
    lengths, ms, steps = synthetic(rng, 48, a, b, c, p, dense=True)
    fit = wlb.fit_micro_batch_cost(lengths, ms, step=steps, attention="dense")
    assert fit.model.attention_family == "dense" and fit.model.attn_quadratic == 0
    assert fit.model.dense_quadratic == pytest.approx(a, rel=1e-6)
    assert fit.model.linear_per_token == pytest.approx(b, rel=1e-6)
    assert fit.held_out.max_relative < 1e-6
    assert fit.predict(lengths[0]) == pytest.approx(ms[0], rel=1e-6)
    assert "T^2 per micro-batch" in fit.model.description
    per_doc = wlb.fit_micro_batch_cost(lengths, ms, step=steps)
    assert per_doc.model.dense_quadratic == 0
    assert per_doc.held_out.mean_relative > 100 * max(fit.held_out.mean_relative, 1e-9)
    with pytest.raises(ValueError, match="unknown attention family 'T2'"):
        wlb.fit_micro_batch_cost(lengths, ms, attention="T2")


@pytest.mark.parametrize("name", ["wlb", "wlb-refine", "original"])
def test_a_dense_cost_packs_as_its_per_document_form_at_the_cap(name):
    from conftest import random_lengths
    dense = wlb.CostModel(dense_quadratic=3.0, linear_per_token=50.0, per_document=7.0)
    for seed in range(8):
        rng = np.random.default_rng(seed)
        context = int(rng.integers(64, 1024))
        lengths = random_lengths(rng, context, 40 * context)
        a = wlb.Packer(name, context=context, micro_batches=4, cost=dense)
        cap = a.max_tokens
        folded = wlb.CostModel(linear_per_token=50.0 + 3.0 * cap, per_document=7.0)
        b = wlb.Packer(name, context=context, micro_batches=4, cost=folded)
        assert a.cost.dense_quadratic == 0 and a.cost.linear_per_token == 50.0 + 3.0 * cap
        plans_a = a.push(lengths) + a.flush()
        plans_b = b.push(lengths) + b.flush()
        assert [[mb.lengths.tolist() for mb in s.micro_batches] for s in plans_a] == \
            [[mb.lengths.tolist() for mb in s.micro_batches] for s in plans_b]


@pytest.mark.parametrize("name", ["wlb", "wlb-refine", "wlb-lookahead"])
def test_a_pure_dense_cost_plans_as_a_token_count(name):
    """A micro-batch's dense attention rises with its tokens alone, so a packer balancing it
    balances tokens: the plans equal those of the cost 'one unit a token'."""
    from conftest import random_lengths
    for seed in range(6):
        rng = np.random.default_rng(200 + seed)
        context = int(rng.integers(64, 2048))
        lengths = random_lengths(rng, context, 30 * context)
        plans = []
        for cost in (wlb.CostModel(dense_quadratic=3.0, unit="ms"),
                     wlb.CostModel(linear_per_token=1.0, unit="ms")):
            packer = wlb.Packer(name, context=context, micro_batches=4, cost=cost)
            steps = packer.push(lengths) + packer.flush()
            plans.append([[mb.lengths.tolist() for mb in s.micro_batches] for s in steps])
        assert plans[0] == plans[1], seed


# ---- wlb.torch.hf: the family from the model, calibration with HF batches, CP at cp = 1 ------

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import wlb.torch.hf as wlb_hf  # noqa: E402
from wlb.torch import (OnlineCalibration, PackedCollate, PackedPieces,  # noqa: E402
                       cp_attention)
from wlb.torch.attention import varlen_causal_attention  # noqa: E402


def tiny_llama(attention):
    config = transformers.LlamaConfig(vocab_size=53, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attention).to(
        torch.float64)


def test_family_from_the_attention_implementation():
    wlb_hf.register()
    for attention, family in (("sdpa", "dense"), ("eager", "dense"),
                              ("wlb_cp", "per-document")):
        model = tiny_llama(attention)
        assert wlb_hf.attention_family(model) == family
        cost = wlb_hf.packing_cost(model)
        assert cost.attention_family == family
        expected = wlb.CostModel.from_shape(hidden=32, ffn=48, heads=4, kv_heads=2, layers=2,
                                            attention=family)
        assert cost.micro_batch([5, 17]) == expected.micro_batch([5, 17])
    config = tiny_llama("sdpa").config
    for name in ("flash_attention_2", "flash_attention_3", "flex_attention"):
        config._attn_implementation = name
        assert wlb_hf.attention_family(config) == "per-document"
    config._attn_implementation = "my_kernel"
    with pytest.raises(ValueError, match="attn_implementation 'my_kernel': wlb does not know"):
        wlb_hf.attention_family(config)
    assert wlb_hf.packing_cost(config, attention="dense").attention_family == "dense"


def test_calibration_measures_hf_and_varlen_batches():
    docs = [np.arange(n) % 53 for n in (5, 9, 3)]
    pieces = PackedPieces(docs)
    chosen = [pieces[(0, 0, 5)], pieces[(1, 2, 7)], pieces[(2, 0, 3)]]
    for fmt in ("hf", "varlen"):
        calibration = OnlineCalibration(attention="dense")
        with calibration.measure(PackedCollate(format=fmt)(chosen)):
            pass
        calibration.record(PackedCollate(format=fmt)(chosen), 2.0)
        assert [lengths for lengths, _ in calibration._current] == [[5, 7, 3], [5, 7, 3]]
        with calibration.measure(PackedCollate(format=fmt)([])):  # empty: not measured
            pass
        assert len(calibration._current) == 2
    with pytest.raises(ValueError, match="a measured batch must be a PackedCollate batch"):
        OnlineCalibration().record({"input_ids": torch.zeros(1, 3)}, 1.0)
    with pytest.raises(ValueError, match="attention must be one of"):
        OnlineCalibration(attention="flash")


def test_calibration_fits_the_dense_family_and_the_sampler_plans_with_it():
    rng = np.random.default_rng(1)
    calibration = OnlineCalibration(refit_every=4, window=8, min_samples=8, attention="dense")
    a, b = 2e-6, 1e-3
    for step in range(8):
        for _ in range(4):
            mb = rng.integers(1, 3000, size=int(rng.integers(1, 5)))
            calibration.record(mb, a * float(mb.sum()) ** 2 + b * float(mb.sum()))
        calibration.end_step()
    fit = calibration.cost_for(calibration.steps_ended)
    assert fit["dense_quadratic"] == pytest.approx(a, rel=1e-6) and fit["attn_quadratic"] == 0
    state = calibration.state_dict()
    assert state["config"]["attention"] == "dense"
    other = OnlineCalibration(refit_every=4, window=8, min_samples=8)
    with pytest.raises(ValueError, match="saved with attention = 'dense'"):
        other.load_state_dict(state)
    # A state saved before the dense family (no 'attention', fits without 'dense_quadratic')
    # loads as per-document.
    old = OnlineCalibration(refit_every=4, window=8, min_samples=8)
    for step in range(8):
        for _ in range(4):
            mb = rng.integers(1, 3000, size=int(rng.integers(1, 5)))
            old.record(mb, 1e-6 * float((mb.astype(float) ** 2).sum()) + 1e-3 * float(mb.sum()))
        old.end_step()
    legacy = old.state_dict()
    del legacy["config"]["attention"]
    for f in legacy["fits"]:
        del f["dense_quadratic"]
    fresh = OnlineCalibration(refit_every=4, window=8, min_samples=8)
    fresh.load_state_dict(legacy)
    assert fresh.fits() == old.fits()


def test_cp_attention_at_cp_1_without_a_process_group():
    import torch.distributed as dist
    assert not dist.is_initialized()
    rng = np.random.default_rng(2)
    for mask in ("causal", "window:7", "chunk:5"):
        lengths = rng.integers(1, 30, size=5)
        plan = wlb.plan_shards(lengths, 1, "per-doc", layer_mix=mask)
        t = int(lengths.sum())
        torch.manual_seed(0)
        q = torch.randn(t, 4, 8, dtype=torch.float64, requires_grad=True)
        k = torch.randn(t, 2, 8, dtype=torch.float64, requires_grad=True)
        v = torch.randn(t, 2, 8, dtype=torch.float64, requires_grad=True)
        out, lse = cp_attention(q, k, v, plan)
        # The reference: the same kernel segments over all rows, in one call.
        r = plan[0]
        rows = torch.from_numpy(r.key_rows.astype(np.int64))
        window = int(plan.kernel_window)
        ref, _ = varlen_causal_attention(
            q, k[rows], v[rows], torch.from_numpy(r.cu_seqlens_q), torch.from_numpy(r.cu_seqlens_k),
            int(r.max_seqlen_q), int(r.max_seqlen_k), **({"window": window} if window else {}))
        assert torch.allclose(out, ref)
        out.sum().backward()
        assert q.grad is not None and k.grad is not None
    plan = wlb.plan_shards(np.array([4, 6]), 2, "per-doc")
    q = torch.zeros(plan[0].tokens, 2, 4)
    with pytest.raises(RuntimeError, match="process group for a plan of cp_size 2"):
        cp_attention(q, q[:, :1], q[:, :1], plan)
    plan = wlb.plan_shards(np.array([4, 6]), 1, "per-doc")
    with pytest.raises(ValueError, match="q has 3 rows but the plan gives rank 0 10 tokens"):
        cp_attention(torch.zeros(3, 2, 4), torch.zeros(3, 1, 4), torch.zeros(3, 1, 4), plan)


def test_wlb_cp_model_at_cp_1_equals_sdpa():
    wlb_hf.register()
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 53, size=int(n)) for n in (9, 20, 4)]
    pieces = PackedPieces(docs)
    batch = PackedCollate(format="hf")([pieces[(i, 0, len(d))] for i, d in enumerate(docs)])
    reference = tiny_llama("sdpa")(**batch).loss
    model = tiny_llama("wlb_cp")
    plan = wlb_hf.plan_shards(batch, cp=1)
    loss = model(**wlb_hf.cp_inputs(batch, plan, 0)).loss
    assert torch.allclose(loss, reference, rtol=1e-10, atol=1e-10)
