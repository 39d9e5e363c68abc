"""wlb.predict_cp_of_placement, and PyTorch's own context-parallel load balancers (run from the
installed torch) priced by it against wlb's default CP plan (bench/torch_balancers.py)."""
import importlib.util
import pathlib

import numpy as np
import pytest

import wlb

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("torch_balancers", ROOT / "bench" / "torch_balancers.py")
tb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tb)


def owners_of_plan(plan):
    # The all-gathered layout is rank-major, rank_capacity rows a rank.
    return plan.packed_to_gathered // plan.rank_capacity


def some_micro_batches(count, seed=3):
    return tb.micro_batches(wlb.sample_default_lengths(count * tb.TOKENS * 2, seed), count)


def test_micro_batches_fill_exactly_with_lengths_of_the_multiple():
    mbs = tb.micro_batches([1, 17, 40, 100000, 70000, 5], 2, tokens=1024, multiple=16)
    assert [m.tolist() for m in mbs] == [[16, 32, 48, 928], [1024]]
    for mb in some_micro_batches(3):
        assert mb.sum() == tb.TOKENS and (mb % tb.MULTIPLE == 0).all() and (mb > 0).all()


@pytest.mark.parametrize("lengths,block", [([48, 80, 16, 112], 16), ([5, 3, 300, 1, 203], 32)])
def test_block_counts_are_flex_attentions(lengths, block):
    from torch.nn.attention.flex_attention import create_block_mask
    doc = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths))

    def document_causal(b, h, q, kv):
        return (doc[q] == doc[kv]) & (kv <= q)

    total = int(sum(lengths))
    mask = create_block_mask(document_causal, None, None, total, total, device="cpu",
                             BLOCK_SIZE=block, _compile=False)
    counts = mask.kv_num_blocks + (mask.full_kv_num_blocks if mask.full_kv_num_blocks is not None
                                   else 0)
    expected = tb.key_blocks_per_query_block(np.array(lengths), block)
    assert counts.reshape(-1).tolist() == expected.tolist()
    built = tb.document_causal_block_mask(np.array(lengths), block)
    assert built.kv_num_blocks.reshape(-1).tolist() == expected.tolist()


@pytest.mark.parametrize("world", [2, 4, 8])
def test_torchs_head_tail_balancers_are_wlbs_per_seq_and_per_doc_placements(world):
    # PyTorch's head-tail is wlb's per-seq (rank r: chunks r and 2C-1-r of the micro-batch), its
    # per-document head-tail is per-doc on documents of a multiple of 2C tokens.
    for lengths in some_micro_batches(2):
        per_seq = wlb.plan_shards(lengths, world, "per-seq")
        per_doc = wlb.plan_shards(lengths, world, "per-doc")
        assert (tb.head_tail(lengths, world) == owners_of_plan(per_seq)).all()
        assert (tb.per_document_head_tail(lengths, world) == owners_of_plan(per_doc)).all()


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ptrr_gives_every_rank_the_same_blocks_by_processing_time(world):
    lengths = some_micro_batches(1)[0]
    owner = tb.ptrr(lengths, world)
    assert np.bincount(owner, minlength=world).tolist() == [tb.TOKENS // world] * world
    # Blocks stay whole, and the ranks' summed block counts are within one largest block.
    blocks = owner.reshape(-1, tb.BLOCK)
    assert (blocks == blocks[:, :1]).all()
    work = np.bincount(blocks[:, 0], weights=tb.key_blocks_per_query_block(lengths),
                       minlength=world)
    assert work.max() - work.min() <= tb.key_blocks_per_query_block(lengths).max()


@pytest.mark.parametrize("strategy", ["balanced-chunks", "contiguous"])
def test_a_plans_own_placement_prices_as_the_plan(strategy):
    # These plans' segments are a rank's maximal runs of a document, so the placement is the plan.
    for lengths in some_micro_batches(2, seed=5):
        for world, link in ((2, 450.0), (8, 25.0)):
            plan = wlb.plan_shards(lengths, world, strategy, cp_link_gbps=link)
            owner = owners_of_plan(plan)
            got = wlb.predict_cp_of_placement(lengths, world, owner, cp_link_gbps=link)
            assert got == plan.cp_prediction


def test_adaptive_beats_torchs_balancers():
    # The committed table (docs/results/cp/torch_balancers.md) over 20 micro-batches; here 3.
    for lengths in some_micro_batches(3, seed=7):
        for world in (2, 4, 8):
            owners = tb.placements(lengths, world)
            for link in (450.0, 25.0):
                adaptive, tokens, peers = tb.compare(lengths, world, link, owners)
                assert tokens <= 1.01
                for name, ms in peers.items():
                    assert adaptive <= ms, (name, world, link, adaptive, ms)


def test_bad_placements_raise_naming_the_problem():
    lengths = np.array([3, 2])
    with pytest.raises(ValueError, match="4 owners for a micro-batch of 5 tokens"):
        wlb.predict_cp_of_placement(lengths, 2, [0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"token 2 is on rank -1, outside \[0, 2\)"):
        wlb.predict_cp_of_placement(lengths, 2, [0, 1, -1, 1, 0])
    with pytest.raises(ValueError, match=r"token 4 is on rank 2, outside \[0, 2\)"):
        wlb.predict_cp_of_placement(lengths, 2, np.array([0, 1, 0, 1, 2], dtype=np.int8))
    with pytest.raises(TypeError, match="owner must be an integer array, got a float64"):
        wlb.predict_cp_of_placement(lengths, 2, np.zeros(5))
    with pytest.raises(TypeError, match="owner"):
        wlb.predict_cp_of_placement(lengths, 2, [True, False, True, False, True])
    with pytest.raises(ValueError, match="cp_link_gbps|link"):
        wlb.predict_cp_of_placement(lengths, 2, [0, 1, 0, 1, 0], cp_link_gbps=0.0)
