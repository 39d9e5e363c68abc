"""Hostile use of the Python package: shared packers across threads, forged or partial states,
inputs numpy would silently reinterpret."""

import threading

import numpy as np
import pytest

import wlb


def planned_pieces(steps):
    return [(int(i), int(p), int(n)) for s in steps for mb in s.micro_batches
            for i, p, n in zip(mb.ids, mb.pieces, mb.lengths)]


@pytest.mark.parametrize("name", wlb.packer_names())
def test_a_packer_shared_by_threads_plans_every_piece_exactly_once(name):
    packer = wlb.Packer(name, context=256, micro_batches=3)
    rng = np.random.default_rng(7)
    batches = [rng.integers(1, 700, size=int(rng.integers(1, 30))) for _ in range(160)]
    planned, errors = [], []
    lock = threading.Lock()

    def worker(part):
        try:
            for lengths in part:
                steps = packer.push(lengths)
                with lock:
                    planned.extend(planned_pieces(steps))
                packer.pending  # reads interleave with the pushes of other threads
                packer.state_dict()
        except Exception as e:  # reported below; a crash would end the test run instead
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(batches[t::4],)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a push never returned"
    assert not errors, errors
    planned.extend(planned_pieces(packer.flush()))
    total = sum(int(b.sum()) for b in batches)
    assert sum(n for _, _, n in planned) == total
    keys = [(i, p) for i, p, _ in planned]
    if name != "original":  # original renumbers the parts it cuts; its ids stay unique per part
        assert len(set(keys)) == len(keys), "a piece planned twice"
    assert {i for i, _, _ in planned} == set(range(packer.next_document_id))
    assert packer.next_document_id == sum(len(b) for b in batches)


def test_load_state_dict_needs_the_id_counter_and_restore_state_never_reuses_ids():
    packer = wlb.Packer("wlb", context=64, micro_batches=2)
    packer.push(np.array([40, 50, 3, 60, 2]))
    state = packer.state_dict()
    fresh = wlb.Packer("wlb", context=64, micro_batches=2)
    with pytest.raises(ValueError, match="no 'next_document_id'"):
        fresh.load_state_dict({"packer_state": state["packer_state"]})
    with pytest.raises(ValueError, match="next_document_id"):
        fresh.load_state_dict({"packer_state": state["packer_state"], "next_document_id": True})
    assert fresh.next_document_id == 0 and len(fresh.pending) == 0  # nothing changed
    fresh.restore_state(state["packer_state"])
    held = fresh.pending.ids
    assert held.size and fresh.next_document_id > held.max()


def test_a_packers_own_checkpoint_always_loads_back():
    packer = wlb.Packer("wlb-lookahead", context=64, micro_batches=2)
    packer.push(wlb.Documents([2**40, 7], [60, 5], [2**24, 0], [2**35, 0]))
    with pytest.raises(ValueError, match="outside"):
        packer.push(wlb.Documents([2**40 + 1], [5]))
    fresh = wlb.Packer("wlb-lookahead", context=64, micro_batches=2)
    fresh.load_state_dict(packer.state_dict())
    assert fresh.state_dict() == packer.state_dict()


@pytest.mark.parametrize("bad", [[True, 2], [3, np.True_], (1, False), b"\x05\x06", "12",
                                 bytearray(b"\x01"), memoryview(b"\x01")])
def test_bools_bytes_and_text_are_not_lengths(bad):
    packer = wlb.Packer("wlb", context=64, micro_batches=2)
    with pytest.raises(TypeError):
        packer.push(bad)
    with pytest.raises(TypeError):
        wlb.make_documents(bad, 64)
    assert packer.next_document_id == 0


@pytest.mark.parametrize("call", [
    lambda v: wlb.imbalance_degree(v),
    lambda v: wlb.CostModel.fit([1, 2, 3], v),
    lambda v: wlb.KernelModel.from_points([1, 2, 3], [1, 2, 3], v),
])
@pytest.mark.parametrize("bad", [[[1.0], [2.0, 3.0]], [[1.0, 2.0, 3.0]], [1.0, True, 2.0],
                                 b"abc", ["x", "y", "z"]])
def test_bad_float_arrays_are_type_errors(call, bad):
    with pytest.raises(TypeError):
        call(bad)


@pytest.mark.parametrize("field", ["attn_quadratic", "attn_linear", "linear_per_token",
                                   "per_document"])
def test_cost_models_that_overflow_are_rejected_naming_the_cost(field):
    with pytest.raises(ValueError, match="too large"):
        wlb.CostModel(**{field: 1e303})
    with pytest.raises(ValueError, match="finite"):
        wlb.CostModel(**{field: float("inf")})
    wlb.CostModel(**{field: 1.0})  # an ordinary coefficient is fine


def test_reading_a_fifo_or_device_fails_at_once(tmp_path):
    import os
    import subprocess
    import sys

    fifo = tmp_path / "lengths.fifo"
    os.mkfifo(fifo)
    code = ("import sys, wlb\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n"
            "        wlb.read_lengths(path)\n"
            "    except ValueError as e:\n"
            "        print(e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(fifo), "/dev/zero"],
                          capture_output=True, text=True, timeout=60)  # a hang fails here
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("is not a regular file") == 2


def test_plan_shards_of_one_long_document_at_a_large_cp_is_bounded():
    # The plan is O(C) segments; its index maps would hold about C x tokens = 2^36 key rows, so
    # they are built only when read, and then refused naming the limit.
    plan = wlb.plan_shards([2**24], 4096, "per-doc")
    assert len(plan.ranks) == 4096
    assert int(plan.ranks[0].cu_seqlens_q[-1]) == 2**24 // 8192 * 2
    with pytest.raises(ValueError, match="kMaxShardMapRows"):
        plan.ranks[0].key_rows
    with pytest.raises(ValueError, match="kMaxShardMapRows"):
        plan.packed_to_gathered
    # Maps within the limit are built on first use and match the plan.
    small = wlb.plan_shards([5, 19, 8], 2, "per-seq")
    assert small.ranks[0].token_indices.tolist() == list(range(8)) + list(range(24, 32))
