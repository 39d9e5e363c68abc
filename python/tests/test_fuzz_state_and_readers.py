"""Fuzz targets (hypothesis) for PackedBatchSampler.load_state_dict and the corpus readers: any
state, any Arrow column and any index bytes either load, and then behave (an exact resume, tokens
as written), or are refused with ValueError / TypeError; nothing else escapes (no IndexError,
KeyError, OverflowError, crash or hang). The @example rows are the corpus: inputs that broke
earlier versions, replayed on every run; derandomize makes the random part the same in CI."""

import copy
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import wlb
from wlb.formats import ArrowTokens, MegatronTokens

torch = pytest.importorskip("torch")

from wlb.torch import PackedBatchSampler  # noqa: E402

EXAMPLES = 60 if os.environ.get("CI") == "true" else 200
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

# ---- load_state_dict ---------------------------------------------------------------------------

LENGTHS = np.array([30, 5, 70, 12, 3, 44, 9, 100, 17, 2, 26, 8], dtype=np.int64)
JOB = {"pp": 2, "dp": 2, "context": 32, "seed": 3, "assign": "round_robin"}


def sampler(rank=0, dp=2):
    return PackedBatchSampler(LENGTHS, pp=JOB["pp"], dp=dp, rank=rank, context=JOB["context"],
                              seed=JOB["seed"], assign=JOB["assign"])


def _states():
    """The states of both ranks' uninterrupted run after each round of micro-batches, and the
    pieces given up to each."""
    ranks = [iter(sampler(r)) for r in range(2)]
    first = sampler(0)
    out, given = [first.state_dict()], [[]]
    it0 = iter(first)
    while True:
        b0, b1 = next(it0, None), next(ranks[1], None)
        if b0 is None:
            return out, given
        given.append(given[-1] + b0 + b1)
        out.append(first.state_dict())


STATES, GIVEN = _states()
FIELDS = sorted(STATES[-1])
NUMBERS = st.one_of(st.integers(-(1 << 65), 1 << 65), st.booleans(), st.none(),
                    st.floats(allow_nan=True), st.text(max_size=4), st.binary(max_size=8))
COLUMNS = ("ids", "lengths", "pieces", "offsets")


@st.composite
def mutations(draw):
    """A list of (field, how, value) changes to a saved state."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(FIELDS + ["extra"]))
        how = draw(st.sampled_from(["set", "delete", "row", "column"]))
        value = draw(st.one_of(NUMBERS, st.lists(st.integers(-5, 200), max_size=6)))
        out.append((field, how, value, draw(st.sampled_from(COLUMNS)), draw(st.integers(0, 8))))
    return out


def apply(state, changes):
    state = copy.deepcopy(state)
    for field, how, value, column, row in changes:
        if how == "delete":
            state.pop(field, None)
        elif how in ("row", "column") and isinstance(state.get(field), dict):
            target = state[field]
            key = column if field != "packer" else "next_document_id"
            if how == "column" or key not in target:
                target[key] = value
            else:
                array = np.array(target[key], copy=True)
                if array.ndim == 1 and array.size and isinstance(value, int) and \
                        not isinstance(value, bool) and -(1 << 62) < value < (1 << 62):
                    array[row % array.size] = value
                    target[key] = array
                else:
                    target[key] = value
        else:
            state[field] = value
    return state


def resume_both(state):
    got = []
    ranks = [sampler(r) for r in range(2)]
    for s in ranks:
        s.load_state_dict(copy.deepcopy(state))
    for a, b in zip(*map(iter, ranks)):
        got += a + b
    return got


def exact(pieces):
    covered = [np.zeros(int(n), dtype=np.int64) for n in LENGTHS]
    for doc, offset, length in pieces:
        covered[doc][offset:offset + length] += 1
    return all(np.all(c == 1) for c in covered)


@SETTINGS
@given(point=st.integers(0, len(STATES) - 1), changes=mutations())
@example(point=3, changes=[("consumed", "set", -1, "ids", 0)])
@example(point=3, changes=[("consumed", "set", 1 << 64, "ids", 0)])
@example(point=2, changes=[("steps", "set", True, "ids", 0)])
@example(point=2, changes=[("micro_batch", "set", 7, "ids", 0)])
@example(point=4, changes=[("step_in_push", "set", 99, "ids", 0)])
@example(point=4, changes=[("queued", "row", 99, "ids", 0)])
@example(point=4, changes=[("elastic_queued", "row", 99, "ids", 0)])
@example(point=4, changes=[("elastic_queued", "row", 1, "offsets", 0)])
@example(point=4, changes=[("elastic_queued", "column", [1.5], "lengths", 0)])
@example(point=5, changes=[("packer", "row", 1 << 45, "ids", 0)])
@example(point=5, changes=[("packer", "set", {"packer_state": b"x"}, "ids", 0)])
@example(point=1, changes=[("corpus", "column", 13, "documents", 0)])
@example(point=1, changes=[("elastic_consumed", "delete", None, "ids", 0)])
@example(point=0, changes=[("consumed", "set", 3, "ids", 0)])
def test_fuzz_load_state_dict(point, changes):
    state = apply(STATES[point], changes)
    try:
        after = resume_both(state)
    except (ValueError, TypeError):
        return  # refused: fine (TypeError only for a state that is not a dict at all)
    assert exact(GIVEN[point] + after), changes


def test_fuzz_states_load_untampered():
    for point, state in enumerate(STATES):
        assert exact(GIVEN[point] + resume_both(state)), point


# ---- Arrow readers -----------------------------------------------------------------------------

VALUE_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
               pa.uint32(), pa.uint64()]


@st.composite
def token_columns(draw):
    kind = draw(st.sampled_from(VALUE_TYPES))
    low, high = value_range(kind)
    token = st.one_of(st.integers(low, high), st.none()) if draw(st.booleans()) else \
        st.integers(low, high)
    rows = draw(st.lists(st.one_of(st.lists(token, max_size=6), st.none()), max_size=8))
    splits = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=2)))
    fill = draw(st.one_of(st.none(), st.integers(low, high), st.integers(-(1 << 64), 1 << 64)))
    return kind, rows, splits, fill


def value_range(kind):
    bits = kind.bit_width
    if pa.types.is_unsigned_integer(kind):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


@SETTINGS
@given(column=token_columns())
@example(column=(pa.int64(), [[1, None, 3]], [], None))
@example(column=(pa.int64(), [[1, None, 3]], [], 0))
@example(column=(pa.uint64(), [[(1 << 64) - 1]], [], None))  # wrapped to -1 before
@example(column=(pa.uint64(), [[(1 << 63) - 1, 0]], [], None))
@example(column=(pa.int8(), [[None]], [], 1000))
@example(column=(pa.int32(), [[1], None, [2]], [1], None))
@example(column=(pa.int16(), [[5], [6, None]], [1, 1], -3))
def test_fuzz_arrow_tokens(column):
    kind, rows, splits, fill = column
    bounds = [0] + splits + [len(rows)]
    batches = [pa.record_batch({"input_ids": pa.array(rows[a:b], type=pa.list_(kind))})
               for a, b in zip(bounds, bounds[1:])]
    table = pa.Table.from_batches(batches, schema=batches[0].schema)
    low, high = value_range(kind)
    tokens = [t for r in rows if r is not None for t in r]
    reasons = {"null row": any(r is None for r in rows),
               "null token": None in tokens and fill is None,
               "fill outside the column's type": fill is not None and not low <= fill <= high,
               "token above int64": any(t is not None and t >= 1 << 63 for t in tokens)}
    try:
        source = ArrowTokens(table, fill=fill)
    except (ValueError, TypeError) as e:
        assert any(reasons.values()), e
        return
    assert not any(reasons.values()), reasons
    assert source.lengths.tolist() == [len(r) for r in rows]
    for i, r in enumerate(rows):
        assert source[i].tolist() == [fill if t is None else t for t in r], (i, r)


# ---- Megatron index bytes ----------------------------------------------------------------------

def index_bytes(lengths, starts, code=8):
    out = b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([code])
    out += len(lengths).to_bytes(8, "little") + len(starts).to_bytes(8, "little")
    out += b"".join(int(n).to_bytes(4, "little") for n in lengths)
    pointer = 0
    for n in lengths:
        out += pointer.to_bytes(8, "little")
        pointer += int(n) * 2
    return out + b"".join(int(s).to_bytes(8, "little") for s in starts)


GOOD_INDEX = index_bytes([5, 19, 8], [0, 2, 3])


@SETTINGS
@given(edits=st.lists(st.tuples(st.integers(0, len(GOOD_INDEX) + 8), st.integers(0, 255)),
                      max_size=4),
       cut=st.integers(0, len(GOOD_INDEX) + 16))
@example(edits=[(18, 255), (25, 127)], cut=len(GOOD_INDEX))  # ~2^63 sequences
@example(edits=[(26, 0)], cut=len(GOOD_INDEX))  # 0 documents
@example(edits=[], cut=40)
def test_fuzz_megatron_index(tmp_path_factory, edits, cut):
    data = bytearray(GOOD_INDEX + bytes(16))[:cut]
    for at, byte in edits:
        if at < len(data):
            data[at] = byte
    prefix = str(tmp_path_factory.mktemp("idx") / "c")
    with open(prefix + ".idx", "wb") as f:
        f.write(bytes(data))
    with open(prefix + ".bin", "wb") as f:
        f.write(bytes(2 * 32))
    try:
        source = MegatronTokens(prefix)
    except ValueError:
        return
    # Loaded: a consistent index (an edit may leave one, e.g. another 2-byte dtype code).
    assert (source.lengths >= 1).all()
    assert int(source.lengths.sum()) * source.dtype.itemsize == 64
    assert [len(source[i]) for i in range(len(source))] == source.lengths.tolist()
    indices = wlb.read_megatron_index(prefix + ".idx")["document_indices"]
    assert indices[0] == 0 and indices[-1] == len(source)
