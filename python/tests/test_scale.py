"""Pretraining scale: PackedBatchSampler plans corpora of more than 2^24 documents from a stream,
holding at most 8 bytes per document besides the lengths, and resumes exactly past the old
2^24 limit (issue 46 item 4). Cheap constructions only: a memory-mapped lengths array of tiny
documents and the first few steps."""

import tracemalloc
import warnings

import numpy as np
import pytest

pytest.importorskip("torch")

import wlb.torch.epoch_pieces as epoch_pieces  # noqa: E402
import wlb.torch.sampler as sampler_module  # noqa: E402
from wlb.torch import PackedBatchSampler  # noqa: E402

CONTEXT = 4096


def _memmapped(tmp_path, n, dtype=np.int32):
    """n tiny documents (1..8 tokens, one of 300 tokens every 1000) in a file-backed array."""
    lengths = np.lib.format.open_memmap(tmp_path / "lengths.npy", mode="w+", dtype=dtype,
                                        shape=(n,))
    block = (np.arange(1 << 20) % 8 + 1).astype(dtype)
    block[::1000] = 300
    for start in range(0, n, len(block)):
        lengths[start:start + len(block)] = block[:n - start]
    lengths.flush()
    return lengths


def _first(sampler, count):
    it = iter(sampler)
    return [next(it) for _ in range(count)], it


def test_more_than_2_pow_24_documents_plan_and_resume_exactly(tmp_path):
    n = (1 << 24) + 5
    lengths = _memmapped(tmp_path, n)
    lengths[n - 3] = 0  # an empty document past 2^24: skipped and counted, never fatal
    with pytest.warns(UserWarning, match=r"1 of 16777221 documents have no token \(the first: "
                                         r"document 16777218\)"):
        sampler = PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT, seed=3)
    assert sampler.empty_documents == 1
    batches, it = _first(sampler, 4)
    pieces = [p for b in batches for p in b]
    assert pieces and all(0 < length <= CONTEXT for _, _, length in pieces)
    assert all(0 <= doc < n and doc != n - 3 for doc, _, _ in pieces)
    order = sampler._epoch_pieces(0).order  # the shuffled order spans the whole corpus
    assert len(order) == n - 1 and int(order.max()) == n - 1 and order.itemsize == 4
    state = sampler.state_dict()
    expected = [next(it) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT, seed=3)
    resumed.load_state_dict(state)
    got, _ = _first(resumed, 3)
    assert got == expected


def test_cursor_past_2_pow_24_pieces(tmp_path):
    """A save point whose 'consumed' piece count is past 2^24 (a resume seeks it by a scan of
    the order): the cursor and the pieces taken from it match a whole-array computation."""
    n = (1 << 24) + 40000
    lengths = _memmapped(tmp_path, n, dtype=np.uint16)
    lengths[(1 << 24) + 100::997] = CONTEXT + 5  # documents of two pieces past 2^24
    sampler = PackedBatchSampler(lengths, pp=1, dp=1, rank=0, context=CONTEXT, shuffle=False)
    pieces = sampler._epoch_pieces(0)
    counts = np.cumsum(-(-np.asarray(lengths, dtype=np.int64) // CONTEXT))
    tokens = np.cumsum(np.asarray(lengths, dtype=np.int64))
    for consumed in ((1 << 24) + 30001, (1 << 24) + 30002, int(counts[-1])):
        cursor = pieces.seek(consumed)
        doc = int(np.searchsorted(counts, consumed, side="right"))
        part = consumed - (int(counts[doc - 1]) if doc else 0)
        assert (cursor.doc, cursor.part) == (doc, part)
        assert cursor.token == (int(tokens[doc - 1]) if doc else 0) + part * CONTEXT
        taken, after = pieces.take(cursor, 3 * CONTEXT)
        if doc == n:
            assert len(taken["ids"]) == 0 and after == cursor
            continue
        expected = sampler_module.wlb.make_documents(
            np.asarray(lengths[doc:doc + 3 * CONTEXT + 1], dtype=np.int64), CONTEXT)
        starts = np.cumsum(np.asarray(expected.lengths))[part:] - np.asarray(expected.lengths)[part:]
        k = int(np.searchsorted(starts - starts[0], 3 * CONTEXT, side="left"))
        assert taken["ids"].tolist() == (np.asarray(expected.ids)[part:part + k] + doc).tolist()
        assert taken["offsets"].tolist() == np.asarray(expected.offsets)[part:part + k].tolist()
        assert after.piece == consumed + k
    state = sampler.state_dict()
    total = int(counts[-1])
    state["consumed"] = total + 1
    with pytest.raises(ValueError, match=rf"state 'consumed' must be an integer \[0, {total}\], "
                                         rf"got {total + 1}"):
        sampler.load_state_dict(state)


def test_at_most_8_bytes_per_document_besides_the_lengths(tmp_path, monkeypatch):
    """Python-heap growth while building the sampler and planning its first steps, over 2^22
    documents (one empty: the worst case holds the non-empty indices and the order, 4 bytes
    each), with the scan chunk made small so that chunk temporaries are a small constant."""
    monkeypatch.setattr(epoch_pieces, "_SCAN_CHUNK", 1 << 16)
    n = 1 << 22
    lengths = _memmapped(tmp_path, n, dtype=np.int64)
    lengths[7] = 0
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = PackedBatchSampler(lengths, pp=2, dp=2, rank=0, context=CONTEXT)
        _first(sampler, 6)
        sampler.state_dict()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 8 * n + (4 << 20), f"{peak / n:.2f} bytes per document"


@pytest.mark.parametrize("bad, message", [
    (np.array([3, -2, 5], dtype=np.int64), r"document 1 has length -2; lengths must be >= 0"),
    (np.array([3, 2**63 + 4], dtype=np.uint64),
     r"document 1 has length 9223372036854775812, above the int64 limit"),
    (np.array([2**62, 2**62, 2**62], dtype=np.int64), r"the lengths add up to more than"),
])
def test_bad_lengths_name_the_value(bad, message):
    with pytest.raises(ValueError, match=message):
        PackedBatchSampler(bad, pp=1, dp=1, rank=0, context=CONTEXT)


def test_bad_lengths_past_the_first_chunk_name_the_document(monkeypatch):
    monkeypatch.setattr(epoch_pieces, "_SCAN_CHUNK", 8)
    lengths = np.ones(50, dtype=np.int64)
    lengths[37] = -1
    with pytest.raises(ValueError, match=r"document 37 has length -1"):
        PackedBatchSampler(lengths, pp=1, dp=1, rank=0, context=CONTEXT)


@pytest.mark.parametrize("chunk", [1, 3, 1 << 22])
def test_plans_do_not_depend_on_the_scan_chunk(monkeypatch, chunk):
    """Chunked scans (validation, order, seek, arrival checks) give the plans and states of one
    whole-array pass: seeded corpora with empty and long documents, every yield and a resume."""
    rng = np.random.default_rng(chunk)
    lengths = rng.integers(0, 3 * CONTEXT, size=300)
    lengths[rng.integers(0, 300, size=20)] = rng.integers(1, 8, size=20)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = PackedBatchSampler(lengths, pp=2, dp=2, rank=1, context=CONTEXT, seed=5)
        out, states = [], []
        for b in s:
            out.append(b)
            states.append(s.state_dict())
        return s, out, states

    _, reference, _ = run()
    monkeypatch.setattr(epoch_pieces, "_SCAN_CHUNK", chunk)
    s, got, states = run()
    assert got == reference
    for k in (0, len(states) // 2, len(states) - 2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = PackedBatchSampler(lengths, pp=2, dp=2, rank=1, context=CONTEXT, seed=5)
        r.load_state_dict(states[k])
        assert list(r) == reference[k + 1:]


def test_megatron_index_past_2_pow_24_sequences_is_memory_mapped(tmp_path):
    """A sparse Megatron index of 2^24 + 5 sequences, all empty but the last: MegatronTokens
    checks it chunk by chunk and maps its arrays (no copy), pickles by path, and the sampler
    plans its one non-empty sequence."""
    import pickle

    from wlb.formats import MegatronTokens

    n = (1 << 24) + 5
    prefix = str(tmp_path / "corpus")
    size = 34 + 12 * n + 16
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]) +
                n.to_bytes(8, "little") + (2).to_bytes(8, "little"))
        f.truncate(size)
        f.seek(34 + 4 * (n - 1))
        f.write((7).to_bytes(4, "little"))  # the last sequence: 7 tokens at byte 0
        f.seek(size - 8)
        f.write(n.to_bytes(8, "little"))  # document indices [0, n]
    with open(prefix + ".bin", "wb") as f:
        f.write(np.arange(7, dtype=np.uint16).tobytes())
    source = MegatronTokens(prefix)
    assert isinstance(source.lengths, np.memmap) and source.lengths.dtype == np.dtype("<i4")
    assert len(source) == n and source.empty_sequences == n - 1
    assert source[n - 1].tolist() == list(range(7))
    assert len(pickle.dumps(source)) < 1000  # the path travels, not the arrays
    with pytest.warns(UserWarning, match=rf"{n - 1} of {n} documents have no token"):
        sampler = PackedBatchSampler(source.lengths, pp=1, dp=1, rank=0, context=CONTEXT)
    assert list(sampler) == [[(n - 1, 0, 7)]]
