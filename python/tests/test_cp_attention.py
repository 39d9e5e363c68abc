"""wlb.torch.cp_attention: CP attention over gloo ranks equals single-process attention.

Multi-process cases run in one spawn per world size (2, 4, 8 ranks): random packed micro-batches
from every packer, every strategy, GQA and edge cases, float64, output and dQ/dK/dV to 1e-10.
"""

import os

import numpy as np
import pytest

import wlb

torch = pytest.importorskip("torch")

from cp_workers import (case_plan, case_tensors, disagreement_cases,  # noqa: E402
                        run_agreement_cache, run_cases, run_disagreements, run_module_twice,
                        spawn)
from wlb.torch import cp_attention, varlen_causal_attention  # noqa: E402
from wlb.torch.cp_attention import comm_volume  # noqa: E402

STRATEGIES = wlb.shard_strategy_names()  # the CP strategy registry
CI = os.environ.get("CI") == "true"


def mask_allowed(lengths, mask="causal"):
    """(tokens, tokens) bool: query row i may see key row j, per document, under ``mask``
    ("causal", "window:W", "chunk:C"), from the definition: query p of a document sees its keys
    [max(0, p - W + 1), p], or [floor(p / C) * C, p]."""
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    doc = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths))
    pos = torch.arange(int(np.sum(lengths))) - torch.from_numpy(np.repeat(starts, lengths))
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    kind, _, size = mask.partition(":")
    if kind == "window":
        allowed &= pos[None, :] > pos[:, None] - int(size)
    elif kind == "chunk":
        allowed &= pos[None, :] // int(size) == pos[:, None] // int(size)
    return allowed


def dense_reference(q, k, v, lengths, mask="causal"):
    """Plain attention per document under ``mask`` over the whole packed micro-batch (autograd)."""
    allowed = mask_allowed(lengths, mask)
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q, kk) / np.sqrt(q.shape[2])
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hnm,mhd->nhd", torch.softmax(scores, dim=-1), vv)
    return out, lse


def micro_batches(rng, count):
    """Lengths of packed micro-batches from every packer on random small streams."""
    found = []
    names = wlb.packer_names()
    while len(found) < count:
        name = names[len(found) % len(names)]
        context = int(rng.integers(16, 160))
        lengths = np.where(rng.random(40) < 0.15, rng.integers(context // 2, 2 * context, 40),
                           rng.integers(1, max(2, context // 5), 40))
        packer = wlb.Packer(name, context=context, micro_batches=int(rng.integers(1, 4)))
        steps = packer.push(lengths) + packer.flush()
        mbs = [mb.lengths for step in steps for mb in step.micro_batches if mb.lengths.size]
        found.append((name, mbs[int(rng.integers(0, len(mbs)))].tolist()))
    return found


def cases_for(world, seed, count):
    rng = np.random.default_rng(seed)
    cases = []
    for i, (packer, lengths) in enumerate(micro_batches(rng, count)):
        q_heads, kv_heads = [(2, 2), (8, 2), (4, 1), (3, 3)][i % 4]
        cases.append({"packer": packer, "lengths": lengths,
                      "strategy": STRATEGIES[i % len(STRATEGIES)],
                      "pair_model": i % (2 * len(STRATEGIES)) == len(STRATEGIES) - 1,
                      "pair_tile": 4 if i % (4 * len(STRATEGIES)) >= 2 * len(STRATEGIES) else 1,
                      "seed": int(rng.integers(1 << 30)), "q_heads": q_heads,
                      "kv_heads": kv_heads, "head_dim": int(rng.choice([4, 8])),
                      "overlap": None if i % 3 else False, "fake_varlen": i % 3 == 1})
        if i % 4 == 2:  # a larger memory cap: ranks of unequal tokens past 1.01 x T / C
            cases[-1]["memory_cap_percent"] = [150, 409700][i % 8 // 4]
    # Edge cases: documents shorter than C (ranks with no queries), one document of S tokens,
    # a single token.
    for s, strategy in enumerate(STRATEGIES):
        for j, lengths in enumerate(([1], [world - 1 or 1, 1, 2], [int(rng.integers(60, 200))])):
            cases.append({"packer": "edge", "lengths": lengths, "strategy": strategy,
                          "seed": int(rng.integers(1 << 30)), "q_heads": 8, "kv_heads": 2,
                          "head_dim": 4, "fake_varlen": (s + j) % 2 == 1})
    return cases


def check_against_reference(world, cases, results):
    empty_rank_seen = False
    for c, case in enumerate(cases):
        lengths = np.asarray(case["lengths"])
        q, k, v, d_out = case_tensors(case, int(lengths.sum()))
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        mask = case.get("mask", case.get("layer_mix", "causal"))
        ref_out, ref_lse = dense_reference(q, k, v, lengths, mask)
        (ref_out * d_out).sum().backward()
        got = {name: torch.zeros_like(t) for name, t in
               (("out", ref_out), ("dq", q), ("dk", k), ("dv", v))}
        got_lse = torch.zeros_like(ref_lse)
        covered = np.zeros(int(lengths.sum()), dtype=np.int64)
        for r in range(world):
            part = results[r][c]
            rows = torch.from_numpy(part["rows"])
            empty_rank_seen |= rows.numel() == 0
            covered[part["rows"]] += 1
            for name in got:
                got[name][rows] = part[name]
            got_lse[:, rows] = part["lse"]
        where = (f"world {world}, case {c} ({case['packer']}, {case['strategy']}, {mask}, "
                 f"{lengths.tolist()})")
        assert np.all(covered == 1), f"{where}: a row held twice or by no rank"
        for name, ref in (("out", ref_out), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            assert torch.allclose(got[name], ref.detach(), atol=1e-10, rtol=0), f"{where}: {name}"
        assert torch.allclose(got_lse, ref_lse.detach(), atol=1e-10, rtol=0), f"{where}: lse"
    assert empty_rank_seen, "no case gave a rank with no queries"
    return check_collective_bytes(world, cases, results)


def check_collective_bytes(world, cases, results):
    """The bytes every rank passed to the collectives (counted in the worker) are comm_volume's
    for that rank, forward and backward, and what plan.cp_prediction prices: its exchange kind,
    the slowest rank's max(sent, received) and the received sum, in rows. Returns the
    (exchange, mask kind) pairs that ran on the overlapped path."""
    kinds, overlapped = set(), set()
    for c, case in enumerate(cases):
        plan = case_plan(case, world)
        row = 2 * case["kv_heads"] * case["head_dim"] * 8  # float64 K and V of one token
        where = f"world {world}, case {c} ({case['strategy']}, {plan.mask}, {case['lengths']})"
        worst, received = 0, 0
        for r in range(world):
            vol = comm_volume(plan, case["kv_heads"], case["head_dim"], 8, rank=r)
            f_sent, f_recv, f_calls = results[r][c]["forward"]
            b_sent, b_recv, _ = results[r][c]["backward"]
            assert (f_sent, f_recv) == (vol.sent_bytes, vol.gathered_bytes), (where, r)
            assert (b_sent, b_recv) == (vol.scattered_bytes, vol.grad_received_bytes), (where, r)
            assert len(f_calls) <= 1, (where, f_calls)  # one collective, K and V together
            kinds.add(vol.exchange)
            worst = max(worst, f_sent, f_recv)
            received += f_recv
        # The overlapped path runs wherever it applies (the math backend: every exchange and
        # mask) unless the case asks for the sequential one.
        assert results[0][c]["overlapped"] == (case.get("overlap") is not False), where
        if results[0][c]["overlapped"]:
            overlapped.add((vol.exchange, plan.mask.partition(":")[0]) +
                           (("varlen",) if case.get("fake_varlen") else ()))
        predicted = plan.cp_prediction
        if world == 1 or len(plan.layer_mix.split(",")) != 1:
            continue  # a mix's prediction is its layers' mean
        assert predicted["exchange"] == [vol.exchange], where
        pred_row = predicted["allgather_bytes"] / (world * (world - 1) * plan.rank_capacity)
        assert np.isclose(worst / row, predicted["max_rank_bytes"] / pred_row, rtol=1e-12), where
        assert np.isclose(received / row, predicted["exchanged_bytes"] / pred_row, rtol=1e-12), \
            where
    assert "row-exact" in kinds, "no case took the row-exact exchange"
    return overlapped


@pytest.mark.parametrize("world", [2, 4, 8])
def test_cp_attention_equals_single_process_attention(world):
    count = {2: 24, 4: 16, 8: 10}[world] if CI else {2: 60, 4: 40, 8: 25}[world]
    cases = cases_for(world, seed=world, count=count)
    results = spawn(world, run_cases, cases)
    overlapped = check_against_reference(world, cases, results)
    assert {("row-exact", "causal"), ("all-gather", "causal"), ("row-exact", "causal", "varlen"),
            ("all-gather", "causal", "varlen")} <= overlapped, overlapped
    strategies = {r["strategy"] for res in results for r in res}
    assert {"per-seq", "per-doc", "hybrid", "te-zigzag", "doc-degree"} <= strategies
    # A larger memory cap's plans, a capped strategy's rank past 1.01 x T / C, ran exactly too.
    def past_default_cap(case):
        tokens = int(np.sum(case["lengths"]))
        mean = tokens // world
        cap = max(2 * -(-tokens // (2 * world)), mean + mean // 100)
        return case_plan(case, world).rank_capacity > cap
    capped = ("adaptive", "doc-degree", "balanced-chunks", "contiguous")
    assert any(past_default_cap(c) for c in cases
               if "memory_cap_percent" in c and c["strategy"] in capped)


def masked_cases(world, seed):
    """Every strategy under window and chunk masks of sizes below, equal to and above the
    documents' lengths; planned for the mask alone or for a mix of it and causal layers."""
    rng = np.random.default_rng(seed)
    found = micro_batches(rng, 2 * len(STRATEGIES))
    cases = []
    for i, strategy in enumerate(STRATEGIES):
        for j, kind in enumerate(("window", "chunk")):
            packer, lengths = found[(2 * i + j) % len(found)]
            longest = max(lengths)
            for size in (int(rng.integers(1, 6)), lengths[int(rng.integers(len(lengths)))],
                         longest + int(rng.integers(1, 40))):
                mask = f"{kind}:{size}"
                q_heads, kv_heads = [(2, 2), (8, 2), (4, 1)][len(cases) % 3]
                case = {"packer": packer, "lengths": lengths, "strategy": strategy,
                        # doc-degree's cases cycle through the tile-1 model, the analytic
                        # curve and the default: the first two shard even these short documents
                        # (its greedy plan runs), the measured default rarely does
                        "layer_mix": mask,
                        "pair_model": strategy == "doc-degree" and len(cases) % 3 == 0,
                        "pair_tile": 4 if len(cases) % 2 else 1,  # whole-tile shards too
                        "analytic_model": strategy == "doc-degree" and len(cases) % 3 == 1,
                        "seed": int(rng.integers(1 << 30)), "q_heads": q_heads,
                        "kv_heads": kv_heads, "head_dim": 4}
                if len(cases) % 4 == 3:  # one layer kind of a mix
                    case["layer_mix"] = f"{mask}x3,causal"
                    case["mask"] = mask
                if len(cases) % 5 == 4:  # the sequential path too
                    case["overlap"] = False
                elif kind == "chunk" and len(cases) % 2:  # the varlen parts over fake kernels
                    case["fake_varlen"] = True
                cases.append(case)
    # One token (ranks without queries), and documents shorter than C, under short masks.
    for lengths, mask in (([1], "window:1"), ([world - 1 or 1, 1, 2], "chunk:2")):
        cases.append({"packer": "edge", "lengths": lengths, "strategy": "per-doc",
                      "layer_mix": mask, "seed": 3, "q_heads": 2, "kv_heads": 1, "head_dim": 4})
    return cases


@pytest.mark.parametrize("world", [2, 4, 8])
def test_cp_attention_under_window_and_chunk_masks_equals_single_process(world):
    cases = masked_cases(world, seed=100 + world)
    if world == 8:  # every strategy and both masks, a third of the sizes (all of doc-degree's,
        # whose greedy plan must run): the test stays short
        cases = [c for k, c in enumerate(cases[:-2])
                 if k % 3 == 0 or c["strategy"] == "doc-degree"] + cases[-2:]
    results = spawn(world, run_cases, cases)
    overlapped = check_against_reference(world, cases, results)
    assert {("row-exact", "window"), ("row-exact", "chunk"),
            ("row-exact", "chunk", "varlen")} <= overlapped, overlapped
    assert {r["strategy"] for res in results for r in res} >= {"per-doc", "doc-degree"}


@pytest.mark.parametrize("mask", ["window:1", "window:7", "window:40", "chunk:1", "chunk:9",
                                  "chunk:40", "causal"])
def test_masked_plans_gather_exactly_the_keys_their_queries_see(mask):
    """Key rows, kernel segments and pair counts of every rank agree with the mask's definition;
    comm_volume is the exchange cp_prediction predicts (the selective one), smaller than the
    causal all-gather."""
    rng = np.random.default_rng(len(mask))
    for trial in range(12):
        lengths = rng.integers(1, 90, int(rng.integers(1, 6)))
        cp = int(rng.integers(1, 6))
        strategy = STRATEGIES[trial % len(STRATEGIES)]
        plan = wlb.plan_shards(lengths, cp, strategy, layer_mix=mask)
        assert plan.mask == mask and plan.layer_mix == f"{mask}x1"
        allowed = mask_allowed(lengths, mask).numpy()
        starts = np.concatenate([[0], np.cumsum(lengths)])
        for r in range(cp):
            rank = plan[r]
            rows = rank.token_indices
            seen = 0
            cu_q, cu_k, key_packed = rank.cu_seqlens_q, rank.cu_seqlens_k, rank.key_indices
            assert len(key_packed) == len(rank.key_rows) == cu_k[-1]
            for i in range(len(cu_q) - 1):
                n_q, n_k = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
                keys = key_packed[cu_k[i]:cu_k[i + 1]]
                seg = rank.kernel_segment[i]
                assert keys[0] == rank.k_pos[seg] + rank.key_begin[i]
                for t in range(n_q):
                    last = n_k - n_q + t
                    first = max(0, last - plan.kernel_window + 1) if plan.kernel_window else 0
                    visible = np.zeros(int(starts[-1]), dtype=bool)
                    visible[keys[first:last + 1]] = True
                    assert np.array_equal(visible, allowed[rows[cu_q[i] + t]]), (mask, r, i, t)
                    seen += last - first + 1
            assert seen == rank.pairs == allowed[rows].sum()
            # at most the keys the same segments gather causally: each one's prefix [0, q_end)
            assert len(rank.key_rows) <= int(np.sum(rank.q_end))
        # comm_volume vs the planner's prediction of the exchange it picks (16 KiB rows).
        vol = [comm_volume(plan, 32, 128, 2, rank=r) for r in range(cp)]
        predicted = plan.cp_prediction
        assert predicted["exchange"] == [vol[0].exchange]
        assert sum(v.gathered_bytes for v in vol) == predicted["exchanged_bytes"]
        assert max(max(v.gathered_bytes, v.sent_bytes) for v in vol) == \
            predicted["max_rank_bytes"]
        assert comm_volume(plan, 32, 128, 2).gathered_bytes == max(v.gathered_bytes
                                                                   for v in vol)
        allgather = (cp - 1) * plan.rank_capacity * 16384
        assert all(v.gathered_bytes <= allgather for v in vol)


def test_mixed_plans_need_a_mask_and_for_mask_checks_it():
    plan = wlb.plan_shards(np.array([30, 9]), 2, "per-doc", layer_mix="window:8x3,chunk:4")
    assert plan.mask is None and plan.layer_mix == "window:8x3,chunk:4x1"
    assert len(plan[0].token_indices) == plan[0].tokens  # mask-free rows still work
    with pytest.raises(ValueError, match="window:8x3,chunk:4x1 has several masks"):
        plan[0].key_rows
    with pytest.raises(ValueError, match="has several masks"):
        cp_attention(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), plan)
    with pytest.raises(ValueError, match="mask causal is not in the plan's layer mix"):
        plan.for_mask("causal")
    with pytest.raises(ValueError, match="unknown attention mask"):
        plan.for_mask("window")
    window, chunk = plan.for_mask("window:8"), plan.for_mask("chunk:4")
    assert (window.mask, window.kernel_window, chunk.mask, chunk.kernel_window) == \
        ("window:8", 8, "chunk:4", 0)
    assert np.array_equal(window[1].token_indices, plan[1].token_indices)
    assert plan.mask is None  # for_mask returns a new plan
    from wlb.torch import CPAttention

    assert "mask=chunk:4" in CPAttention(chunk).extra_repr()


def test_module_builds_its_index_tensors_once_for_every_layer():
    case = {"lengths": [7, 19, 4, 11], "strategy": "per-doc", "layer_mix": "window:5", "seed": 9,
            "q_heads": 2, "kv_heads": 1, "head_dim": 4}
    results = spawn(2, run_module_twice, case)
    assert [r["builds"] for r in results] == [1, 1]
    assert all(r["equal"] for r in results)


# What every rank's shared error must say when the last rank (b) differs in one way; W: world.
DISAGREEMENTS = {
    "dtype": (ValueError, ["disagree on dtype", "torch.float32 on rank {b}",
                           "torch.float64 on rank"]),
    "kv_heads": (ValueError, ["disagree on kv_heads", "1 on rank {b}"]),
    "head_dim": (ValueError, ["disagree on head_dim", "2 on rank {b}"]),
    "heads": (ValueError, ["disagree on heads", "2 on rank {b}"]),
    "strategy": (ValueError, ["disagree on strategy", "per-seq on rank {b}"]),
    "mask": (ValueError, ["disagree on mask", "window:4 on rank {b}"]),
    "micro_batch": (ValueError, ["disagree on micro_batch", "32 tokens on rank {b}"]),
    "plan": (ValueError, ["disagree on plan"]),
    "scale": (ValueError, ["disagree on scale", "0.25 on rank {b}", "default on rank"]),
    "cp_size": (ValueError, ["rank {b}: the plan is for cp_size {W1} but the process group has "
                             "{W} ranks"]),
    "mix": (ValueError, ["rank {b}: the plan's layer mix window:4x3,causalx1 has several masks"]),
    "meta": (ValueError, ["rank {b}: q, k, v are on device meta"]),
    "nan_scale": (ValueError, ["rank {b}: scale must be a finite number > 0", "nan"]),
    "not_a_plan": (TypeError, ["rank {b}: plan must be a wlb.ShardPlan, got str"]),
    "rows": (ValueError, ["rank {b}: q has", "rows but the plan gives rank {b}"]),
    "gqa": (ValueError, ["rank {b}: q's 3 heads must be a multiple of k/v's 2 heads"]),
    "backend": (ValueError, ["rank {b}: attention backend 'varlen' needs CUDA tensors"]),
}


def test_ranks_that_disagree_all_raise_the_same_error_naming_field_and_ranks():
    """One rank differs from the others in one field (dtype, heads, K/V heads, head dim, the
    plan's strategy, mask, micro-batch, documents or C, a mix plan, meta tensors, scale, not a
    plan, rows, heads not a multiple of the K/V heads, a backend it cannot run), in a gloo group
    of 4 and a subgroup of 2 of the same spawn: every rank raises the same exception, naming
    the field and the rank, and the group stays usable (each case ends with a valid call). The
    rank with a plan for another group size lingers after raising: the other ranks must have
    raised without waiting for it. The spawn's timeout is the watchdog: a rank left waiting in
    a collective fails the test."""
    cases = disagreement_cases()
    assert set(cases) == set(DISAGREEMENTS)
    linger = 2.0
    results = spawn(4, run_disagreements, {"cases": cases, "linger_s": linger}, timeout=150)
    for world in (4, 2):
        for c, name in enumerate(cases):
            outcomes = [results[r][world][c] for r in range(world)]
            kind, needles = DISAGREEMENTS[name]
            where = (world, name, outcomes)
            assert all(o[1] == kind.__name__ for o in outcomes), where
            assert len({o[2] for o in outcomes}) == 1, where  # the same message on every rank
            for needle in needles:
                assert needle.format(b=world - 1, W=world, W1=world + 1) in outcomes[0][2], where
            if name == "cp_size":
                assert all(o[3] < linger for o in outcomes[:-1]), where
    assert all(set(results[r]) == {4} for r in (2, 3))


def test_agreement_runs_once_per_signature_and_still_catches_a_lone_change():
    """The whole agreement (an all_gather of every rank's record) runs on a signature's first
    call only; repeated calls, and a module over the same plan, cost one all_reduce each. When
    the last rank alone changes its plan (same tokens and C) or its head dim on a later call,
    every rank runs the whole agreement again and raises the same error naming the field (the
    spawn's timeout catches a rank left waiting); a valid call afterwards is cached again."""
    results = spawn(3, run_agreement_cache, {"lengths": [9, 5, 14, 3]}, timeout=90)
    expected = [("first", 1, 1), ("repeat", 1, 0), ("module", 1, 0), ("module again", 1, 0),
                ("other plan", 1, 1), ("head dim", 1, 1), ("valid again", 1, 0)]
    for r, res in enumerate(results):
        assert [s[:3] for s in res["steps"]] == expected, (r, res["steps"])
        assert res["equal"], r
        assert all(s[3] is None for s in res["steps"] if s[0] not in ("other plan", "head dim"))
    for step, needle in (("other plan", "disagree on plan"), ("head dim", "disagree on head_dim")):
        errors = {next(s[3:] for s in res["steps"] if s[0] == step) for res in results}
        assert len(errors) == 1, (step, errors)  # the same error on every rank
        kind, message = errors.pop()
        assert kind == "ValueError" and needle in message and "rank 2" in message, message


def test_agreement_records_keep_every_failure_and_name_fields_and_ranks():
    """The exchanged records (no process group needed): a failure survives any message length,
    the verdict names every failing rank, or the first differing field and who holds what."""
    import importlib
    import json

    cpa = importlib.import_module("wlb.torch.cp_attention")  # the module, not the function

    fields = {"cp_size": 2, "strategy": "per-doc", "dtype": "torch.float64", "heads": 4}
    huge = "\u00e9\u4e2d" * 5000  # escapes to 6 bytes a character in JSON
    long_mix = dict(fields, mask="window:4x3,chunk:8x1," * 200)  # a layer mix of many masks
    entries = [json.loads(cpa._encode(fields, None, "value").rstrip(b"\0")),
               json.loads(cpa._encode(long_mix, huge, "value").rstrip(b"\0"))]
    assert len(cpa._encode(long_mix, huge, "value")) == cpa._RECORD_BYTES
    assert entries[1]["e"] is not None
    kind, message = cpa._verdict(entries)
    assert kind is ValueError and "rank 1 of 2 rejected its inputs" in message
    other = dict(fields, dtype="torch.float32")
    entries = [json.loads(cpa._encode(f, None, "value").rstrip(b"\0"))
               for f in (fields, other, fields)]
    kind, message = cpa._verdict(entries)
    assert message.startswith("cp_attention: the CP ranks disagree on dtype (torch.float64 on "
                              "ranks 0, 2; torch.float32 on rank 1)")
    assert cpa._verdict([entries[0], entries[2]]) is None
    typed = json.loads(cpa._encode({}, "plan must be a wlb.ShardPlan", "type").rstrip(b"\0"))
    assert cpa._verdict([entries[0], typed])[0] is TypeError


def test_scale_must_be_finite_and_positive():
    from wlb.torch import CPAttention
    from wlb.torch.attention import check_scale

    q = torch.zeros(3, 2, 4, dtype=torch.float64)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    for bad in (float("nan"), float("inf"), 0.0, -1.0, True, "0.5"):
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            varlen_causal_attention(q, q, q, cu, cu, 3, 3, scale=bad)
        with pytest.raises(ValueError, match=f"got {bad!r}".replace("(", r"\(")):
            CPAttention(wlb.plan_shards(np.array([3]), 1, "per-doc"), scale=bad)
    assert check_scale(None) is None and check_scale(np.float32(0.5)) == 0.5
    out, _ = varlen_causal_attention(q, q, q, cu, cu, 3, 3, scale=0.5)
    assert torch.isfinite(out).all()


def random_segments(rng, count):
    q_lens = rng.integers(0, 40, count)
    k_lens = q_lens + rng.integers(0, 30, count)
    k_lens = np.maximum(k_lens, 1)
    q_lens = np.minimum(q_lens, k_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    return cu_q, cu_k


def segment_reference(q, k, v, cu_q, cu_k):
    outs = []
    for i in range(len(cu_q) - 1):
        nq, nk = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        # Bottom-right causal: the queries are the last nq of the nk positions.
        qs = torch.zeros(nk, *q.shape[1:], dtype=q.dtype)
        qs = torch.cat([qs[: nk - nq], q[cu_q[i]:cu_q[i + 1]]])
        out, _ = dense_reference(qs, k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]], [nk])
        outs.append(out[nk - nq:])
    return torch.cat(outs)


def test_math_backend_bottom_right_causal_gqa_and_gradients():
    rng = np.random.default_rng(5)
    for trial in range(20):
        cu_q, cu_k = random_segments(rng, int(rng.integers(1, 6)))
        h_kv = int(rng.integers(1, 3))
        h_q = h_kv * int(rng.integers(1, 4))
        g = torch.Generator().manual_seed(trial)
        q = torch.randn(int(cu_q[-1]), h_q, 4, dtype=torch.float64, generator=g)
        k = torch.randn(int(cu_k[-1]), h_kv, 4, dtype=torch.float64, generator=g)
        v = torch.randn(int(cu_k[-1]), h_kv, 4, dtype=torch.float64, generator=g)
        args = (torch.from_numpy(cu_q), torch.from_numpy(cu_k), 40, 70)
        out, lse = varlen_causal_attention(q, k, v, *args)
        assert lse.shape == (h_q, q.shape[0]) and not lse.requires_grad
        assert torch.allclose(out, segment_reference(q, k, v, cu_q, cu_k), atol=1e-12, rtol=0)


def windowed_segment_reference(q, k, v, cu_q, cu_k, window):
    """Bottom-right causal segments, each query row limited to its last ``window`` keys."""
    outs = []
    for i in range(len(cu_q) - 1):
        nq, nk = int(cu_q[i + 1] - cu_q[i]), int(cu_k[i + 1] - cu_k[i])
        last = torch.arange(nq) + nk - nq
        key = torch.arange(nk)
        allowed = (key[None, :] <= last[:, None]) & (key[None, :] > last[:, None] - window)
        group = q.shape[1] // k.shape[1]
        kk = k[cu_k[i]:cu_k[i + 1]].repeat_interleave(group, dim=1)
        vv = v[cu_k[i]:cu_k[i + 1]].repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,mhd->hnm", q[cu_q[i]:cu_q[i + 1]], kk) / np.sqrt(q.shape[2])
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.einsum("hnm,mhd->nhd", torch.softmax(scores, dim=-1), vv))
    return torch.cat(outs)


def test_math_backend_sliding_window_blocks_and_gradients(monkeypatch):
    from wlb.torch import attention

    rng = np.random.default_rng(8)
    for trial in range(12):
        cu_q, cu_k = random_segments(rng, int(rng.integers(1, 5)))
        window = int(rng.integers(1, 30))
        g = torch.Generator().manual_seed(trial)
        q = torch.randn(int(cu_q[-1]), 4, 4, dtype=torch.float64, generator=g)
        k = torch.randn(int(cu_k[-1]), 2, 4, dtype=torch.float64, generator=g)
        v = torch.randn(int(cu_k[-1]), 2, 4, dtype=torch.float64, generator=g)
        args = (torch.from_numpy(cu_q), torch.from_numpy(cu_k), 40, 70)
        want = windowed_segment_reference(q, k, v, cu_q, cu_k, window)
        out, _ = varlen_causal_attention(q, k, v, *args, window=window)
        assert torch.allclose(out, want, atol=1e-12, rtol=0)
        monkeypatch.setattr(attention, "_MATH_BLOCK_ROWS", 3)  # blocks start mid-window
        blocked, _ = varlen_causal_attention(q, k, v, *args, window=window)
        monkeypatch.undo()
        assert torch.allclose(blocked, want, atol=1e-12, rtol=0)
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 12], dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(8, 4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(12, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(12, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: varlen_causal_attention(a, b, c, cu_q, cu_k, 5, 5, window=2)[0],
        (q, k, v))
    with pytest.raises(ValueError, match="window must be >= 0"):
        varlen_causal_attention(q, k, v, cu_q, cu_k, 5, 5, window=-1)


@pytest.mark.parametrize("block_rows", [512, 3])
def test_math_backend_keys_with_positions_under_window_and_causal(monkeypatch, block_rows):
    """math_forward / math_backward with key_offset (the overlapped path's split key sets): each
    segment keeps a random subset of its keys (its queries' own keys always), positioned by
    offset from the segment's first query; out, lse and dq/dk/dv equal a dense reference over
    that subset under the window (or causal), in blocks that start mid-window too."""
    from wlb.torch import attention

    monkeypatch.setattr(attention, "_MATH_BLOCK_ROWS", block_rows)
    rng = np.random.default_rng(21 + block_rows)
    for trial in range(10):
        n_q = rng.integers(1, 12, int(rng.integers(1, 4)))
        n_k = n_q + rng.integers(0, 15, len(n_q))
        window = int(rng.integers(0, 12))  # 0: causal
        keep, offsets = [], []
        for nq, nk in zip(n_q, n_k):
            off = np.arange(nk) - (nk - nq)
            kept = (off >= 0) | (rng.random(nk) < 0.5)
            keep.append(kept)
            offsets.append(off[kept])
        cu_q = torch.from_numpy(np.concatenate([[0], np.cumsum(n_q)])).to(torch.int32)
        counts = [int(k.sum()) for k in keep]
        cu_k = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)])).to(torch.int32)
        key_offset = torch.from_numpy(np.concatenate(offsets))
        g = torch.Generator().manual_seed(trial)
        q = torch.randn(int(cu_q[-1]), 4, 3, dtype=torch.float64, generator=g,
                        requires_grad=True)
        k = torch.randn(int(cu_k[-1]), 2, 3, dtype=torch.float64, generator=g,
                        requires_grad=True)
        v = torch.randn(int(cu_k[-1]), 2, 3, dtype=torch.float64, generator=g,
                        requires_grad=True)
        d_out = torch.randn(q.shape, dtype=torch.float64, generator=g)
        ref_out, ref_lse = [], []
        for i in range(len(n_q)):
            qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            row = torch.arange(int(n_q[i]))[:, None]
            pos = key_offset[ks][None, :]
            allowed = (pos <= row) & ((pos > row - window) if window else True)
            kk, vv = (t[ks].repeat_interleave(2, dim=1) for t in (k, v))
            scores = torch.einsum("nhd,mhd->hnm", q[qs], kk) * 0.5
            scores = scores.masked_fill(~allowed, float("-inf"))
            ref_lse.append(torch.logsumexp(scores, dim=-1))
            ref_out.append(torch.einsum("hnm,mhd->nhd", torch.softmax(scores, dim=-1), vv))
        ref_out, ref_lse = torch.cat(ref_out), torch.cat(ref_lse, dim=1)
        (ref_out * d_out).sum().backward()
        with torch.no_grad():
            out, lse = attention.math_forward(q, k, v, cu_q, cu_k, 0.5, window=window,
                                              key_offset=key_offset)
            grads = attention.math_backward(q, k, v, out, lse, d_out, cu_q, cu_k, 0.5,
                                            window=window, key_offset=key_offset)
        where = (trial, window, n_q.tolist(), n_k.tolist())
        assert torch.allclose(out, ref_out.detach(), atol=1e-12, rtol=0), where
        assert torch.allclose(lse, ref_lse.detach(), atol=1e-12, rtol=0), where
        for got, want in zip(grads, (q.grad, k.grad, v.grad)):
            assert torch.allclose(got, want, atol=1e-12, rtol=0), where


def test_math_backend_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(9)
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)  # an empty query segment in the middle
    cu_k = torch.tensor([0, 5, 7, 12], dtype=torch.int32)
    q = torch.randn(8, 4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(12, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(12, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: varlen_causal_attention(a, b, c, cu_q, cu_k, 5, 5)[0], (q, k, v))


def test_math_backend_blocks_long_segments_exactly(monkeypatch):
    from wlb.torch import attention

    g = torch.Generator().manual_seed(3)
    q = torch.randn(37, 2, 4, dtype=torch.float64, generator=g)
    k = torch.randn(50, 1, 4, dtype=torch.float64, generator=g)
    v = torch.randn(50, 1, 4, dtype=torch.float64, generator=g)
    args = (torch.tensor([0, 37], dtype=torch.int32), torch.tensor([0, 50], dtype=torch.int32),
            37, 50)
    whole, lse_whole = varlen_causal_attention(q, k, v, *args)
    monkeypatch.setattr(attention, "_MATH_BLOCK_ROWS", 8)
    blocked, lse_blocked = varlen_causal_attention(q, k, v, *args)
    assert torch.allclose(whole, blocked, atol=1e-13, rtol=0)
    assert torch.allclose(lse_whole, lse_blocked, atol=1e-13, rtol=0)


def test_backend_selection_and_comm_volume():
    from wlb.torch.attention import select_backend

    assert select_backend("cpu", torch.float64) == "math"
    assert select_backend("cpu", torch.bfloat16) == "math"
    with pytest.raises(ValueError, match="unknown attention backend 'flash3'"):
        select_backend("cpu", torch.float32, "flash3")
    row = 2 * 2 * 8 * 2
    # One document cut into 2C chunks: rank 0 holds the first and the last, whose keys are the
    # whole document: as many rows as the all-gather brings, so the all-gather.
    gather = wlb.plan_shards(np.array([128]), 4, "per-seq")
    vol = comm_volume(gather, kv_heads=2, head_dim=8, element_size=2)
    assert vol.exchange == gather.exchange(row)["kind"] == "all-gather"
    assert vol.gathered_bytes == 3 * gather.rank_capacity * row == vol.scattered_bytes
    assert vol.sent_bytes == vol.grad_received_bytes == vol.gathered_bytes
    assert vol.gather_buffer_bytes == 4 * gather.rank_capacity * row
    # Padding: rank 0 needs fewer rows than the all-gather brings.
    exact = wlb.plan_shards(np.array([100, 7, 30]), 4, "per-doc")
    x = exact.exchange(row)
    vol = comm_volume(exact, kv_heads=2, head_dim=8, element_size=2)
    assert vol.exchange == x["kind"] == "row-exact"
    assert x["row_exact_rows"] < x["allgather_rows"] == 3 * exact.rank_capacity
    assert x["row_exact_ms"] < x["allgather_ms"]
    assert vol.gathered_bytes == max(x["recv_rows"]) * row == vol.scattered_bytes
    assert vol.sent_bytes == max(x["send_rows"]) * row == vol.grad_received_bytes
    assert [comm_volume(exact, 2, 8, 2, rank=r).gathered_bytes for r in range(4)] == \
        [n * row for n in x["recv_rows"]]
    with pytest.raises(ValueError, match="kv_row_bytes must be in"):
        exact.exchange(0)
    with pytest.raises(ValueError, match="rank 4 is not in"):
        comm_volume(exact, 2, 8, 2, rank=4)


def test_cp_attention_needs_a_process_group_above_cp_1():
    plan = wlb.plan_shards(np.array([4, 6]), 2, "per-doc")  # cp = 1 runs without one
    q = torch.zeros(plan[0].tokens, 1, 2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="initialised torch.distributed process group for a "
                                           "plan of cp_size 2"):
        cp_attention(q, q, q, plan)


def test_train_cp_example_matches_one_process_training():
    import subprocess
    import sys

    from conftest import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "examples/python/train_cp.py"), "--ranks", "4", "--steps",
         "2", "--context", "256", "--documents", "150", "--timeout", "240"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for strategy in STRATEGIES:
        assert f"\n{strategy}: CP 4, 2 steps" in done.stdout
    worst = float(done.stdout.rsplit("(losses and gradients): ", 1)[1].split()[0])
    assert worst <= 1e-6
    assert done.stdout.count("| 3 |") == len(STRATEGIES)  # a row for the last rank per strategy


def test_train_cp_example_rejects_bad_arguments():
    import subprocess
    import sys

    from conftest import REPO

    done = subprocess.run([sys.executable, str(REPO / "examples/python/train_cp.py"),
                           "--strategies", "per-seq,zigzag"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "zigzag" in done.stderr
