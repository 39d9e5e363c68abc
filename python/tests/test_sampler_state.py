"""PackedBatchSampler states that lie: every field of random states, taken at random save points,
is tampered with, one at a time; loading must either refuse with a ValueError naming the field
or resume exactly (every token of the epoch trained once). Also: the corpus fingerprint, the
numbers the constructor refuses, and an untampered resume continuing the very same states."""

import copy
import os

import numpy as np
import pytest

import wlb

torch = pytest.importorskip("torch")

from wlb.torch import PackedBatchSampler  # noqa: E402
from wlb.torch.sampler import corpus_fingerprint  # noqa: E402

CONTEXT = 48
CASES = 10 if os.environ.get("CI") == "true" else 24


def small_corpus(rng):
    count = int(rng.integers(8, 40))
    return np.where(rng.random(count) < 0.2, rng.integers(CONTEXT // 2, 3 * CONTEXT, count),
                    rng.integers(1, CONTEXT // 3, count)).astype(np.int64)


def make(lengths, job, dp=None, rank=0):
    return PackedBatchSampler(lengths, pp=job["pp"], dp=job["dp"] if dp is None else dp,
                              rank=rank, context=CONTEXT, seed=job["seed"],
                              packer=job["packer"], assign=job["assign"])


def lockstep(samplers, limit=None):
    """Every rank's micro-batches, rank by rank per step (ranks give PP each per step); the
    pieces given, and the state after each round of one micro-batch per rank."""
    pieces, states = [], []
    iters = [iter(s) for s in samplers]
    while limit is None or len(states) < limit:
        batches = [next(it, None) for it in iters]
        if all(b is None for b in batches):
            break
        assert all(b is not None for b in batches), "ranks ran out of micro-batches unevenly"
        pieces.extend(p for b in batches for p in b)
        states.append(samplers[0].state_dict())
        assert all(_same_state(states[-1], s.state_dict()) for s in samplers[1:])
    return pieces, states


def _same_state(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            _same_state(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def tokens_once(lengths, pieces):
    """Whether the pieces cover every token of every document exactly once."""
    covered = [np.zeros(int(n), dtype=np.int64) for n in lengths]
    for doc, offset, length in pieces:
        covered[doc][offset:offset + length] += 1
    return all(np.all(c == 1) for c in covered)


def tamperings(state, rng):
    """(field, description, tampered state) for every field of ``state``: one random change
    each (a wrong type, a bool, out of range, off by one, a missing key, a changed queue row)."""
    out = []
    for field in sorted(state):
        value = state[field]
        options = [("missing", lambda s, f=field: s.pop(f))]
        if isinstance(value, int) and not isinstance(value, bool):
            for name, new in (("+1", value + 1), ("-1", value - 1), ("negative", -3),
                              ("huge", 1 << 41), ("bool", True), ("float", float(value)),
                              ("None", None), ("str", str(value)), ("zero", 0)):
                options.append((name, lambda s, f=field, v=new: s.__setitem__(f, v)))
        elif field in ("queued", "elastic_queued"):
            options += _queue_tamperings(field, value, rng)
        elif field == "corpus":
            for key in value:
                options.append((f"corpus.{key}", lambda s, k=key: s["corpus"].__setitem__(
                    k, s["corpus"][k] + 1 if isinstance(s["corpus"][k], int) and
                    not isinstance(s["corpus"][k], bool) else not s["corpus"][k]
                    if isinstance(s["corpus"][k], bool) else str(s["corpus"][k])[::-1] + "0")))
        elif field == "packer":
            options.append(("None", lambda s: s.__setitem__("packer", None)))
            options.append(("empty", lambda s: s.__setitem__("packer", {})))
            if value is not None:
                options.append(("flipped byte", lambda s: s["packer"].__setitem__(
                    "packer_state", _flip(s["packer"]["packer_state"], rng))))
                options.append(("next id", lambda s: s["packer"].__setitem__(
                    "next_document_id", s["packer"]["next_document_id"] + 1)))
        options.append(("extra key", lambda s: s.__setitem__("extra", 1)))
        name, change = options[int(rng.integers(len(options)))]
        tampered = copy.deepcopy(state)
        change(tampered)
        out.append((field, name, tampered))
    return out


def _flip(blob, rng):
    data = bytearray(blob)
    if data:
        data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    return bytes(data)


def _queue_tamperings(field, queue, rng):
    rows = len(queue["ids"])
    options = [("float column", lambda s: s[field].__setitem__(
        "ids", np.asarray(s[field]["ids"], dtype=np.float64))),
        ("missing column", lambda s: s[field].pop("offsets")),
        ("extra row", lambda s: _set_rows(s, field, lambda a: np.append(a, a[:1] if len(a) else
                                                                            [0])))]
    if rows:
        r = int(rng.integers(rows))
        c = ("ids", "lengths", "pieces", "offsets")[int(rng.integers(4))]
        options += [
            ("dropped row", lambda s: _set_rows(s, field, lambda a: np.delete(a, r))),
            ("duplicated row", lambda s: _set_rows(s, field, lambda a: np.insert(a, r, a[r]))),
            (f"{c}[{r}] + 1", lambda s: _add(s[field], c, r, 1)),
            (f"{c}[{r}] - 1", lambda s: _add(s[field], c, r, -1)),
            ("uint64 above int64", lambda s: s[field].__setitem__(
                c, np.full(rows, 1 << 63, dtype=np.uint64))),
        ]
    return options


def _set_rows(state, field, fn):
    for c in ("ids", "lengths", "pieces", "offsets"):
        state[field][c] = fn(np.asarray(state[field][c], dtype=np.int64))


def _add(queue, column, row, delta):
    a = np.array(queue[column], dtype=np.int64)
    a[row] += delta
    queue[column] = a


def load_all(lengths, job, state, dp):
    """Every rank of a sampler at ``dp``, each loaded with ``state`` (ValueError if refused)."""
    samplers = [make(lengths, job, dp=dp, rank=r) for r in range(dp)]
    for s in samplers:
        s.load_state_dict(copy.deepcopy(state))
    return samplers


def random_job(rng):
    return {"pp": int(rng.integers(1, 3)), "dp": int(rng.integers(1, 4)),
            "seed": int(rng.integers(1 << 20)),
            "packer": ["wlb", "original", "fixed-greedy"][int(rng.integers(3))],
            "assign": "model" if rng.random() < 0.3 else "round_robin"}


def test_tampered_states_are_refused_or_resume_exactly():
    rng = np.random.default_rng(2026)
    refused, resumed = {}, {}
    for case in range(CASES):
        lengths = small_corpus(rng)
        job = random_job(rng)
        samplers = [make(lengths, job, rank=r) for r in range(job["dp"])]
        given_all, states = lockstep(samplers)
        assert tokens_once(lengths, given_all)
        point = int(rng.integers(len(states)))  # save after point + 1 rounds
        state = states[point]
        given = _given_pieces(lengths, job, point + 1)
        new_dp = job["dp"] if rng.random() < 0.6 else int(rng.integers(1, 4))
        trained = given if new_dp == job["dp"] else _finished(lengths, job, state["steps"])
        for field, how, tampered in tamperings(state, rng):
            where = f"case {case}, {job}, round {point}, DP {new_dp}: {field} {how}"
            try:
                samplers = load_all(lengths, job, tampered, new_dp)
            except ValueError as e:  # refused at load, naming the state's field
                refused[field] = refused.get(field, 0) + 1
                assert "state" in str(e), (where, str(e))
                continue
            resumed[field] = resumed.get(field, 0) + 1
            after = lockstep(samplers)[0]  # a loaded state never fails later
            assert tokens_once(lengths, trained + after), where
    # Each field was refused somewhere (none is trusted blindly).
    for field in ("consumed", "queued", "packer", "step_in_push", "micro_batch", "corpus",
                  "elastic_consumed", "elastic_queued", "dp", "epoch", "version"):
        assert refused.get(field, 0) > 0, (field, refused, resumed)


def _given_pieces(lengths, job, rounds):
    samplers = [make(lengths, job, rank=r) for r in range(job["dp"])]
    return lockstep(samplers, limit=rounds)[0]


def _finished(lengths, job, steps):
    """Pieces of the first ``steps`` global steps of an uninterrupted run."""
    sampler = make(lengths, job)
    out = []
    for i, (step, _) in enumerate(sampler.steps()):
        if i == steps:
            break
        out += [p for mb in step.micro_batches
                for p in zip(mb.ids.tolist(), mb.offsets.tolist(), mb.lengths.tolist())]
    return out


def test_untampered_resume_continues_with_the_same_states():
    """Resumed at every save point (same DP), the samplers give the rest of the uninterrupted
    run's micro-batches, and their states after each are the uninterrupted run's states."""
    rng = np.random.default_rng(7)
    for _ in range(6):
        lengths = small_corpus(rng)
        job = random_job(rng)
        whole, states = lockstep([make(lengths, job, rank=r) for r in range(job["dp"])])
        for point in range(len(states)):
            _, later = lockstep(load_all(lengths, job, states[point], job["dp"]))
            assert len(later) == len(states) - point - 1
            for k, got in enumerate(later):
                assert _same_state(got, states[point + 1 + k]), (job, point, k)


def test_corpus_fingerprint_sees_lengths_with_the_same_count_and_sum():
    lengths = np.array([5, 9, 3, 40, 7], dtype=np.int64)
    swapped = np.array([9, 5, 3, 40, 7], dtype=np.int64)  # same count, same sum
    moved = np.array([6, 8, 3, 40, 7], dtype=np.int64)
    prints = {corpus_fingerprint(x) for x in (lengths, swapped, moved)}
    assert len(prints) == 3
    assert corpus_fingerprint(lengths) == corpus_fingerprint(lengths.astype(np.int32))
    job = {"pp": 1, "dp": 1, "seed": 0, "packer": "wlb", "assign": "round_robin"}
    sampler = make(lengths, job)
    next(iter(sampler))
    state = sampler.state_dict()
    for other in (swapped, moved):
        with pytest.raises(ValueError, match="state 'corpus'.*lengths_sha256"):
            make(other, job).load_state_dict(state)
    # Chunked hashing (several chunks on the thread pool) gives one digest for one array.
    from wlb.torch import sampler as sampler_module

    big = np.arange(1, 100001, dtype=np.int64)
    whole = corpus_fingerprint(big)
    old = sampler_module._FINGERPRINT_CHUNK
    try:
        sampler_module._FINGERPRINT_CHUNK = 4096
        chunked = corpus_fingerprint(big)
        big[77777] += 1
        assert corpus_fingerprint(big) != chunked
    finally:
        sampler_module._FINGERPRINT_CHUNK = old
    assert len(whole) == len(chunked) == 32


def test_constructor_refuses_bools_and_lengths_that_do_not_fit_int64():
    lengths = np.array([5, 9, 3], dtype=np.int64)
    for name in ("pp", "dp"):
        args = {"pp": 1, "dp": 1, name: True}
        with pytest.raises(ValueError, match=f"{name} must be an integer.*got True"):
            PackedBatchSampler(lengths, rank=0, context=CONTEXT, **args)
    with pytest.raises(ValueError, match="rank must be in.*got False"):
        PackedBatchSampler(lengths, pp=1, dp=1, rank=False, context=CONTEXT)
    with pytest.raises(ValueError, match="seed must be an integer"):
        PackedBatchSampler(lengths, pp=1, dp=1, rank=0, context=CONTEXT, seed=True)
    with pytest.raises(TypeError, match="context"):
        PackedBatchSampler(lengths, pp=1, dp=1, rank=0, context=True)
    huge = np.array([5, (1 << 63) + 6, 3], dtype=np.uint64)
    with pytest.raises(ValueError, match="document 1 has length 9223372036854775814"):
        PackedBatchSampler(huge, pp=1, dp=1, rank=0, context=CONTEXT)
    with pytest.raises(TypeError, match="1-D integer array"):
        PackedBatchSampler(np.array([True, False]), pp=1, dp=1, rank=0, context=CONTEXT)
    with pytest.raises(ValueError, match="add up to more than"):
        PackedBatchSampler(np.array([1 << 62, 1 << 62], dtype=np.int64), pp=1, dp=1, rank=0,
                           context=CONTEXT)
