"""Shard plans as index arrays: every token exactly once, keys where the all-gather puts them,
and the same plans as wlb-plan --cp writes."""

import json
import subprocess

import numpy as np
import pytest

import wlb
from conftest import binary, random_lengths

STRATEGIES = wlb.shard_strategy_names()


def test_shard_strategy_names_are_the_registry():
    # The binding's list is the C++ registry's: the one wlb-plan reads.
    listed = subprocess.run([str(binary("tools/wlb-plan")), "--list", "sharding"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert STRATEGIES == listed and len(set(STRATEGIES)) == len(STRATEGIES) >= 7
    # Every name plans, records what was asked, and appears in plan_shards' docstring.
    for name in STRATEGIES:
        plan = wlb.plan_shards(np.array([300, 40, 9], dtype=np.int64), 2, name)
        assert plan.requested == name
        assert name in wlb.plan_shards.__doc__
    with pytest.raises(ValueError, match="expected one of " + ", ".join(STRATEGIES)):
        wlb.plan_shards(np.array([8], dtype=np.int64), 2, "zigzag")


def check_plan(plan, lengths):
    total = int(np.sum(lengths))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    assert plan.tokens == total and len(plan) == plan.cp_size
    held = np.concatenate([r.token_indices for r in plan.ranks])
    assert held.dtype == np.int64
    assert np.array_equal(np.sort(held), np.arange(total)), "a token held twice or by no rank"
    # The all-gather layout: rank r's local row i is gathered row r * rank_capacity + i.
    gathered = np.full(plan.cp_size * plan.rank_capacity, -1, dtype=np.int64)
    for r in plan.ranks:
        assert r.token_indices.size == r.tokens <= plan.rank_capacity
        gathered[r.rank * plan.rank_capacity + np.arange(r.tokens)] = r.token_indices
    assert np.array_equal(gathered[plan.packed_to_gathered], np.arange(total))
    for r in plan.ranks:
        cu_q, cu_k = r.cu_seqlens_q, r.cu_seqlens_k
        assert cu_q.dtype == np.int32 and cu_k.dtype == np.int32
        # Any mask: the key rows the map names hold the rank's keys.
        assert np.array_equal(gathered[r.key_rows], r.key_indices)
        if plan.mask != "causal":
            continue  # the masks' kernel segments: test_cp_attention.py
        q_len = r.q_end - r.q_begin
        assert np.array_equal(np.diff(cu_q), q_len) and np.array_equal(np.diff(cu_k), r.q_end)
        assert r.max_seqlen_q == (q_len.max() if q_len.size else 0)
        assert r.max_seqlen_k == (r.q_end.max() if q_len.size else 0)
        # Queries: each segment's packed rows, in segment order.
        assert np.array_equal(r.q_pos, starts[r.doc_index] + r.q_begin)
        expected_q = [np.arange(p, p + n) for p, n in zip(r.q_pos, q_len)]
        assert np.array_equal(r.token_indices,
                              np.concatenate(expected_q) if expected_q else np.zeros(0))
        # Keys: the piece's prefix [0, q_end), found in the gathered rows the map names.
        expected_k = [np.arange(p, p + n) for p, n in zip(r.k_pos, r.q_end)]
        expected_k = np.concatenate(expected_k) if expected_k else np.zeros(0, dtype=np.int64)
        assert np.array_equal(r.key_indices, expected_k)
        assert np.array_equal(gathered[r.key_rows], r.key_indices)
        assert r.causal_pairs == int(np.sum((r.q_end * (r.q_end + 1) - r.q_begin * (r.q_begin + 1)) // 2))
    assert plan.predicted_ms.shape == (plan.cp_size,)


def test_index_arrays_cover_every_token_once():
    rng = np.random.default_rng(11)
    for trial in range(300):
        context = int(rng.integers(8, 4096))
        lengths = random_lengths(rng, context, int(rng.integers(1, 3 * context)))
        lengths = np.minimum(lengths, context)
        cp = int(rng.integers(1, 9))
        strategy = STRATEGIES[trial % len(STRATEGIES)]
        # doc-degree under a slow, a default and a fast link, causal or with local layers
        link = [1.0, 450.0, 1e5][trial % 3]
        mix = ["causal", "window:300x5,causal", "chunk:512x3,causal"][trial % 3]
        # the memory cap: the default, the tightest, a loose one, none
        cap_percent = [101, 100, 125, 409700][trial % 4]
        plan = wlb.plan_shards(lengths, cp, strategy, cp_link_gbps=link, layer_mix=mix,
                               cp_memory_cap_percent=cap_percent)
        assert plan.requested == strategy
        assert (plan.mask is None) == (mix != "causal")  # a mix of two masks: pick one
        # adaptive's candidates (adaptive.hpp); doc-degree keeps its greedy plan or per-doc,
        # hybrid or per-seq-ordered when predicted faster
        adaptive = ["per-seq-ordered", "per-doc", "hybrid", "doc-degree", "per-seq",
                    "balanced-chunks", "contiguous"]
        allowed = {"adaptive": adaptive,
                   "doc-degree": ["doc-degree", "per-seq-ordered", "per-doc", "hybrid"]}
        assert plan.strategy in allowed.get(strategy, [strategy])
        if strategy in ("adaptive", "doc-degree", "balanced-chunks", "contiguous"):
            # the memory cap (wlb::CpRankTokenCap)
            total, mean = int(np.sum(lengths)), int(np.sum(lengths)) // cp
            cap = max(2 * -(-total // (2 * cp)), mean + mean * (cap_percent - 100) // 100)
            assert plan.rank_capacity <= cap
        for mask in ("causal", mix.split("x")[0]):
            check_plan(plan.for_mask(mask), lengths)


def test_worked_example():
    # The WLB-LLM-CP artifact's example: documents 5, 19, 8 at CP 2.
    seq = wlb.plan_shards([5, 19, 8], 2, "per-seq")
    doc = wlb.plan_shards([5, 19, 8], 2, "per-doc")
    assert [r.causal_pairs for r in seq.ranks] == [57, 184]
    assert [r.causal_pairs for r in doc.ranks] == [121, 120]
    te = wlb.plan_shards([5, 19, 8], 2, "te-zigzag")
    assert te.rank_capacity == 18 and te.padding_tokens == 4
    assert te.ranks[0].q_begin.tolist() == [0, 0, 15, 0, 6]
    assert te.ranks[0].q_end.tolist() == [2, 5, 19, 2, 8]


def test_doc_degree_exchange_and_link():
    # the long document fits the memory cap whole (12000 <= 13347 tokens at C = 4)
    lengths = [12000] + [300 + 37 * i for i in range(40)]
    fast = wlb.plan_shards(lengths, 4, "doc-degree")
    per_doc = wlb.plan_shards(lengths, 4, "per-doc")
    check_plan(fast, lengths)
    assert fast.strategy == "doc-degree"
    assert fast.cp_prediction["exchanged_bytes"] < per_doc.cp_prediction["exchanged_bytes"]
    assert fast.cp_prediction["max_ms"] <= per_doc.cp_prediction["max_ms"] * (1 + 1e-12)
    slow = wlb.plan_shards(lengths, 4, "doc-degree", cp_link_gbps=1e-3)
    check_plan(slow, lengths)
    assert slow.cp_prediction["exchanged_bytes"] == 0
    assert all(np.array_equal(r.q_end - r.q_begin, np.asarray(lengths)[r.doc_index])
               for r in slow.ranks)
    # With a tile-1 kernel model and a fast link without collective latency even a 40-token
    # document is sharded over ranks; the default 10 us per collective outweighs its attention,
    # so the greedy step (which prices the executor's collective) keeps it whole (the memory cap,
    # 40 tokens a rank here, lets every document stay whole).
    pairs = wlb.KernelModel.analytic(tile_q=1, tile_k=1, q_half=0.0, segment_overhead_ms=0.0)
    tiny = [40] + [20] * 6
    small = wlb.plan_shards(tiny, 4, "doc-degree", kernel_model=pairs, cp_link_gbps=1e5,
                            cp_latency_us=0.0)
    check_plan(small, tiny)
    assert sum(int(np.sum(r.doc_index == 0)) for r in small.ranks) > 1
    whole = wlb.plan_shards(tiny, 4, "doc-degree", kernel_model=pairs, cp_link_gbps=1e5)
    check_plan(whole, tiny)
    assert whole.cp_prediction["exchanged_bytes"] == 0
    # With 8-row query tiles its zig-zag shards are whole tiles, the 203 mod 8 rest leading the
    # first shard (no other shard pays a partial tile).
    tiles = wlb.KernelModel.analytic(tile_q=8, tile_k=8, q_half=0.0, segment_overhead_ms=0.0)
    tiled = wlb.plan_shards([203] + [20] * 6, 4, "doc-degree", kernel_model=tiles,
                            cp_link_gbps=1e5, cp_latency_us=0.0)
    check_plan(tiled, [203] + [20] * 6)
    assert tiled.strategy == "doc-degree"
    shards = sorted((int(b), int(e)) for r in tiled.ranks
                    for b, e, d in zip(r.q_begin, r.q_end, r.doc_index) if d == 0)
    assert len(shards) == 8 and shards[0] == (0, 35), shards  # 4 tiles + the rest of 3
    assert all((e - b) % 8 == 0 and e - b in (24, 32) for b, e in shards[1:]), shards
    # Local layers need fewer keys: less to exchange for the same plan.
    windowed = wlb.plan_shards(lengths, 4, "per-doc", layer_mix="window:1024x5,causal")
    assert windowed.cp_prediction["exchanged_bytes"] < per_doc.cp_prediction["exchanged_bytes"]
    # ... and fewer pairs: one causal layer counts the plan's causal pairs, the mix its own.
    assert per_doc.cp_prediction["max_rank_pairs"] == max(r.causal_pairs for r in per_doc.ranks)
    assert windowed.cp_prediction["max_rank_pairs"] < 6 * per_doc.cp_prediction["max_rank_pairs"]


def test_row_exchange_is_the_planners_rows_and_finds_every_key():
    """RankShard.row_exchange (wlb::BuildRowExchange) under each mask: its counts are
    plan.exchange's rows, the two sides of every pair agree, and each key row of the rank's
    buffer (own rows, then the received ones by source) holds the token key_indices names."""
    rng = np.random.default_rng(3)
    for trial in range(24):
        lengths = [int(x) for x in rng.integers(1, 900, size=int(rng.integers(1, 7)))]
        cp = int(rng.choice([2, 4, 8]))
        mix = ["causal", "window:64", "chunk:100"][trial % 3]
        for name in wlb.shard_strategy_names():
            plan = wlb.plan_shards(lengths, cp, name, layer_mix=mix)
            choice = plan.exchange(8)
            xs = [plan[r].row_exchange for r in range(cp)]
            sends = [plan[r].token_indices[x["send_rows"]] for r, x in enumerate(xs)]
            for d, x in enumerate(xs):
                assert int(x["recv_counts"].sum()) == choice["recv_rows"][d]
                assert len(x["send_rows"]) == choice["send_rows"][d]
                assert x["send_counts"][d] == 0 and x["recv_counts"][d] == 0
                buffer = [plan[d].token_indices]
                for s_rank, y in enumerate(xs):
                    assert y["send_counts"][d] == x["recv_counts"][s_rank]
                    start = int(y["send_counts"][:d].sum())
                    buffer.append(sends[s_rank][start:start + int(y["send_counts"][d])])
                buffer = np.concatenate(buffer)
                np.testing.assert_array_equal(buffer[x["key_rows"]], plan[d].key_indices,
                                              err_msg=f"{name} C={cp} {mix} rank {d}")


def test_gather_rate_prices_each_ranks_key_rows():
    """cp_gather_gbps adds each rank's gathered key rows (its cu_seqlens_k's last entry), read
    and written once, to the prediction, and adaptive ranks by it: a slow copy moves it to plans
    that gather fewer keys."""
    rng = np.random.default_rng(57)
    row_ms = 2 * 16384 / 20e9 * 1e3  # 16 KiB K/V rows at 20 GB/s
    fewer = 0
    for trial in range(12):
        lengths = [int(x) for x in rng.integers(64, 40000, size=int(rng.integers(1, 9)))]
        cp = [2, 4, 8][trial % 3]
        # balanced-chunks keeps the fastest of its deals: the same plan priced with the copy
        # costs its key rows more; another deal only when that is cheaper than the first's copy.
        fixed = wlb.plan_shards(lengths, cp, "balanced-chunks")
        fixed_priced = wlb.plan_shards(lengths, cp, "balanced-chunks", cp_gather_gbps=20.0)
        keys = [int(r.cu_seqlens_k[-1]) for r in fixed.ranks]
        extra = fixed_priced.cp_prediction["max_ms"] - fixed.cp_prediction["max_ms"]
        if [r.token_indices.tolist() for r in fixed_priced.ranks] == [
                r.token_indices.tolist() for r in fixed.ranks]:
            assert min(keys) * row_ms * (1 - 1e-9) <= extra <= max(keys) * row_ms * (1 + 1e-9)
        else:
            assert extra <= max(keys) * row_ms * (1 + 1e-9)
        free = wlb.plan_shards(lengths, cp)
        priced = wlb.plan_shards(lengths, cp, cp_gather_gbps=20.0)
        check_plan(priced, lengths)
        for name in ("per-seq-ordered", "per-doc", "per-seq", "balanced-chunks"):
            other = wlb.plan_shards(lengths, cp, name, cp_gather_gbps=20.0)
            assert priced.cp_prediction["max_ms"] <= other.cp_prediction["max_ms"] * (1 + 1e-12)
        fewer += (sum(int(r.cu_seqlens_k[-1]) for r in priced.ranks)
                  < sum(int(r.cu_seqlens_k[-1]) for r in free.ranks))
    assert fewer > 0
    with pytest.raises(ValueError, match=r"key gather bandwidth must be in \[0, 1e6\].*got -1"):
        wlb.plan_shards([5, 19, 8], 2, cp_gather_gbps=-1.0)


def test_memory_cap_trades_memory_for_time():
    """cp_memory_cap_percent: above the default 101 adaptive may hold more tokens on a rank; on
    a long document among many short ones over a slow link its plan then moves fewer K/V rows,
    predicted faster than its plan within 1.01 x T / C."""
    lengths = [49152] + [512] * 160
    cp, link = 8, 25.0
    capped = wlb.plan_shards(lengths, cp, cp_link_gbps=link)
    loose = wlb.plan_shards(lengths, cp, cp_link_gbps=link, cp_memory_cap_percent=150)
    check_plan(loose, lengths)
    mean = sum(lengths) // cp
    assert capped.rank_capacity <= mean + mean // 100
    assert mean + mean // 100 < loose.rank_capacity <= mean + mean // 2
    assert loose.cp_prediction["max_ms"] < capped.cp_prediction["max_ms"]
    for bad in (99, 0, -3, 409701):
        with pytest.raises(ValueError, match=rf"memory cap must be in \[100, 409700\].*got {bad}"):
            wlb.plan_shards(lengths, cp, cp_memory_cap_percent=bad)
    with pytest.raises(TypeError):
        wlb.plan_shards(lengths, cp, cp_memory_cap_percent=1.25)


def test_bad_cp_options_name_the_value():
    with pytest.raises(ValueError, match="got 0"):
        wlb.plan_shards([5, 19, 8], 2, "doc-degree", cp_link_gbps=0.0)
    with pytest.raises(ValueError, match="'window:0'"):
        wlb.plan_shards([5, 19, 8], 2, "doc-degree", layer_mix="window:0")
    with pytest.raises(ValueError, match="te-zigzag, doc-degree"):
        wlb.plan_shards([5, 19, 8], 2, "zigzag")


def test_kernel_model_choice_is_used():
    mb = wlb.MicroBatch(np.array([40000, 300, 200, 100]))
    table = wlb.KernelModel.from_points([128, 128, 1024], [128, 65536, 65536], [0.01, 1.0, 2.0])
    for model in (None, wlb.KernelModel(), table):
        plan = wlb.plan_shards(mb, 4, "adaptive", kernel_model=model)
        check_plan(plan, mb.lengths)


def test_plans_match_wlb_plan_json(tmp_path):
    exe = binary("tools/wlb-plan")
    rng = np.random.default_rng(5)
    context, n, cp = 4096, 4, 4
    lengths = random_lengths(rng, context, 12 * n * context)
    docs = tmp_path / "lengths.txt"
    docs.write_text("\n".join(map(str, lengths)) + "\n")
    for strategy in STRATEGIES:
        out = subprocess.run(
            [str(exe), f"--docs={docs}", f"--context={context}", f"--micro-batches={n}",
             f"--cp={cp}", f"--sharding={strategy}", "--format=json", "--timing=false",
             "--packer=wlb"] + (["--cp-link-gbps=100"] if strategy == "doc-degree" else []),
            check=True, capture_output=True, text=True).stdout
        expected = json.loads(out)
        packer = wlb.Packer("wlb", context=context, micro_batches=n)
        steps = []
        for arrivals in wlb.split_into_steps(wlb.make_documents(lengths, context), n * context):
            steps += packer.push(arrivals)
        steps += packer.flush()
        assert len(steps) == len(expected["steps"])
        for step, want in zip(steps, expected["steps"]):
            got = json.loads(step.to_json())
            for mb_json, mb in zip(want["micro_batches"], step.micro_batches):
                link = 100.0 if strategy == "doc-degree" else 450.0
                plan = wlb.plan_shards(mb, cp, strategy, cp_link_gbps=link)
                plan_json = json.loads(plan.to_json())
                for key, value in plan_json.items():
                    assert mb_json[key] == value, key
                for r, shard in zip(plan.ranks, mb_json["shards"]):
                    q = [np.arange(s["q_pos"], s["q_pos"] + s["q_end"] - s["q_begin"])
                         for s in shard["segments"]]
                    assert np.array_equal(r.token_indices,
                                          np.concatenate(q) if q else np.zeros(0))
                    assert r.cu_seqlens_q.tolist() == shard["cu_seqlens_q"]
                    assert r.cu_seqlens_k.tolist() == shard["cu_seqlens_k"]
                    assert r.max_seqlen_q == shard["max_seqlen_q"]
                    assert r.max_seqlen_k == shard["max_seqlen_k"]
                assert mb_json["cp_balance"] == pytest.approx(plan.balance)
                for key in ("cp_balance", "sharding", "requested_sharding", "shards",
                            "cp_size", "rank_capacity", "padding_tokens"):
                    mb_json.pop(key)
            assert got == want
