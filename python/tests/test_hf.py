"""Hugging Face conventions, the typed packed-sequence record and the empty-safe packed loss,
against the real transformers and megatron-core packages (nothing downloaded)."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import wlb  # noqa: E402
import wlb.torch.hf as wlb_hf  # noqa: E402
from wlb.torch import (PackedCollate, PackedPieces, PackedSeqParams, cp_varlen_args,  # noqa: E402
                       packed_cross_entropy)

REPO = pathlib.Path(__file__).resolve().parents[2]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_llama(attention, dtype=torch.float64):
    config = transformers.LlamaConfig(vocab_size=53, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attention).to(
        dtype)


def test_hf_collate_layout():
    pieces = PackedPieces([np.arange(10, 20), np.arange(100, 103)])
    mb = PackedCollate(format="hf")([pieces[(0, 4, 3)], pieces[(1, 0, 3)], pieces[(0, 9, 1)]])
    assert mb["input_ids"].tolist() == [[14, 15, 16, 100, 101, 102, 19]]
    assert mb["labels"].tolist() == [[-100, 15, 16, -100, 101, 102, -100]]  # unshifted
    assert mb["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 0]]
    assert mb["cu_seq_lens_q"].dtype == torch.int32
    assert mb["cu_seq_lens_q"].tolist() == mb["cu_seq_lens_k"].tolist() == [0, 3, 6, 7]
    assert mb["max_length_q"] == mb["max_length_k"] == 3
    assert mb["use_cache"] is False
    empty = PackedCollate(format="hf")([])
    assert empty["input_ids"].shape == (1, 0) and empty["cu_seq_lens_q"].tolist() == [0]
    with pytest.raises(ValueError, match="format must be one of .* got 'thd'"):
        PackedCollate(format="thd")


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_hf_batch_loss_is_the_token_weighted_mean_of_pieces_alone(attention):
    model = tiny_llama(attention)
    rng = np.random.default_rng(7)
    for trial in range(4):
        docs = [rng.integers(0, 53, size=int(n)) for n in rng.integers(1, 60, size=7)]
        pieces = PackedPieces(docs)
        chosen = []
        for d, tokens in enumerate(docs):  # whole documents and random pieces, length-1 included
            offset = int(rng.integers(0, len(tokens)))
            chosen.append(pieces[(d, offset, int(rng.integers(1, len(tokens) - offset + 1)))])
        batch = PackedCollate(format="hf")(chosen)
        with torch.no_grad():
            packed = float(model(**batch).loss)
            total, count = 0.0, 0
            for _, _, tokens in chosen:
                if tokens.size < 2:
                    continue
                ids = torch.from_numpy(tokens)[None]
                total += float(model(input_ids=ids, labels=ids).loss) * (tokens.size - 1)
                count += tokens.size - 1
        # transformers computes the loss in float32: agreement to its rounding.
        assert packed == pytest.approx(total / count, rel=2e-6), (trial, attention)


def test_default_collate_carries_a_typed_record():
    pieces = PackedPieces([np.arange(10, 20), np.arange(100, 103)])
    mb = PackedCollate()([pieces[(0, 4, 3)], pieces[(1, 0, 2)]])
    p = mb["packed_seq_params"]
    assert isinstance(p, PackedSeqParams) and p.qkv_format == "thd" and not p.is_cp
    assert p.cu_seqlens_q is mb["cu_seqlens"] and p.cu_seqlens_kv.tolist() == [0, 3, 5]
    assert p.max_seqlen_q == p.max_seqlen_kv == mb["max_seqlen"] == 3
    assert p.hf_kwargs()["cu_seq_lens_k"].tolist() == [0, 3, 5]
    assert p.hf_kwargs()["max_length_q"] == 3
    assert p == p.to("cpu") and p != PackedCollate()([pieces[(0, 4, 3)]])["packed_seq_params"]


def test_record_converts_to_megatron_core():
    from megatron.core.packed_seq_params import PackedSeqParams as MegatronParams
    pieces = PackedPieces([np.arange(10, 20), np.arange(100, 103)])
    p = PackedCollate()([pieces[(0, 0, 10)], pieces[(1, 0, 3)]])["packed_seq_params"]
    m = p.to_megatron()
    assert isinstance(m, MegatronParams) and m.qkv_format == "thd"
    assert m.cu_seqlens_q.tolist() == m.cu_seqlens_kv.tolist() == [0, 10, 13]
    assert (m.max_seqlen_q, m.max_seqlen_kv) == (10, 10)
    assert m.cu_seqlens_q_padded is None and m.cp_group is None


def test_cp_record_refuses_whole_batch_conversions():
    plan = wlb.plan_shards([40, 9, 30], 2, "per-doc")
    p = cp_varlen_args(plan, 1)
    assert p.is_cp and (p.cp_size, p.cp_rank) == (2, 1) and p.shard_plan is plan
    assert p.cu_seqlens_q[-1].item() == plan[1].tokens
    for convert in (p.to_megatron, p.hf_kwargs):
        with pytest.raises(ValueError, match="CP rank 1's share of a 2-rank"):
            convert()
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 1\], got 2 \(int\)"):
        cp_varlen_args(plan, 2)
    with pytest.raises(ValueError, match="cp_rank 3 is not in"):
        PackedSeqParams(p.cu_seqlens_q, p.cu_seqlens_kv, 1, 1, cp_size=2, cp_rank=3)


def test_packed_cross_entropy_sums_counts_and_survives_empty_micro_batches():
    rng = np.random.default_rng(3)
    head = torch.nn.Linear(8, 11, dtype=torch.float64)
    for trial in range(10):
        sizes = rng.integers(0, 30, size=3)  # three "ranks", some empty
        parts, totals, counts = [], [], []
        for n in sizes:
            x = torch.from_numpy(rng.normal(size=(int(n), 8)))
            labels = torch.from_numpy(rng.integers(-1, 11, size=int(n)))
            labels[labels < 0] = -100
            loss = packed_cross_entropy(head(x), labels)
            parts.append((x, labels))
            totals.append(loss.sum.detach())
            counts.append(int(loss.count))
            assert loss.count.dtype == torch.int64 and torch.isfinite(loss.mean())
        x = torch.cat([p[0] for p in parts])
        labels = torch.cat([p[1] for p in parts])
        if sum(counts) == 0:
            continue
        expected = torch.nn.functional.cross_entropy(head(x), labels, ignore_index=-100)
        assert float(sum(totals) / sum(counts)) == pytest.approx(float(expected), rel=1e-12)
    # An empty micro-batch: zero, and backward reaches the parameters (DDP stays in lockstep).
    head.zero_grad()
    empty = packed_cross_entropy(head(torch.zeros(0, 8, dtype=torch.float64)),
                                 torch.zeros(0, dtype=torch.int64))
    assert float(empty.sum) == 0.0 and int(empty.count) == 0 and float(empty.mean()) == 0.0
    empty.mean().backward()
    assert head.weight.grad is not None and float(head.weight.grad.abs().sum()) == 0.0
    with pytest.raises(ValueError, match=r"labels' shape plus a vocabulary.*\(4, 11\) and \(5,\)"):
        packed_cross_entropy(torch.zeros(4, 11), torch.zeros(5, dtype=torch.int64))


def test_packed_cross_entropy_shift_matches_transformers_loss():
    model = tiny_llama("sdpa")
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 53, size=int(n)) for n in rng.integers(1, 40, size=5)]
    pieces = PackedPieces(docs)
    batch = PackedCollate(format="hf")([pieces[(d, 0, len(t))] for d, t in enumerate(docs)])
    with torch.no_grad():
        out = model(**batch)
    loss = packed_cross_entropy(out.logits, batch["labels"], shift=True)
    assert int(loss.count) == sum(len(t) - 1 for t in docs)
    assert float(loss.mean()) == pytest.approx(float(out.loss), rel=2e-6)


def test_cp_attention_function_checks_its_inputs():
    q = torch.zeros(1, 4, 5, 8)
    kv = torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match="needs packed_seq_params from wlb.torch.hf.cp_inputs"):
        wlb_hf.cp_attention_forward(None, q, kv, kv, None)
    plan = wlb.plan_shards([5, 5], 2, "per-doc")
    params = cp_varlen_args(plan, 0)

    class Layer:
        layer_idx = 3

    with pytest.raises(ValueError, match="layer 3 attends under 'window:16' but the shard plan's "
                                         "mask is 'causal'"):
        wlb_hf.cp_attention_forward(Layer(), q, kv, kv, None, packed_seq_params=params,
                                    sliding_window=16)
    mistral = transformers.MistralConfig(sliding_window=16)
    batch = PackedCollate(format="hf")([(0, 0, np.arange(5)), (1, 0, np.arange(5))])
    assert wlb_hf.plan_shards(batch, 2, "per-doc", model=mistral).mask == "window:16"
    assert wlb_hf.plan_shards(batch, 2, "per-doc", model=transformers.Qwen2Config()).mask == \
        "causal"
    with pytest.raises(ValueError, match="the plan covers 10 tokens but the micro-batch has 4"):
        wlb_hf.cp_inputs(PackedCollate(format="hf")([(0, 0, np.arange(4))]), plan, 0)
    assert wlb_hf.register() == "wlb_cp"
    assert "wlb_cp" in transformers.AttentionInterface._global_mapping


def test_train_hf_example_matches_one_process():
    """examples/python/train_hf.py: 4 gloo ranks, Llama, Qwen2 and Mistral (sliding window),
    every CP strategy; losses and gradients equal one-process HF training (float64: 1e-6)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(REPO / "examples/python/train_hf.py"),
                           "--models", "llama,qwen2,mistral", "--dtypes", "float64,float32"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("(tolerance 1e-06)") == 3, done.stdout
    assert done.stdout.count("(tolerance 0.0001)") == 3, done.stdout
    for strategy in wlb.shard_strategy_names():
        assert done.stdout.count(f" {strategy}: losses") == 6, done.stdout
