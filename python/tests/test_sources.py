"""Corpus sources at the edges: empty documents (written by Megatron-core's own builder), JSON
lines longer than pyarrow's default block, compressed JSON lines, several files, a ``datasets``
``save_to_disk`` folder; every file-backed source pickles by path."""

import gzip
import json
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
import pyarrow.json  # noqa: E402,F401
import pyarrow.parquet  # noqa: E402,F401

import wlb  # noqa: E402
from wlb.formats import ArrowTokens, MegatronTokens, jsonl_lengths  # noqa: E402
from wlb.torch import PackedBatchSampler  # noqa: E402

CONTEXT = 64


def all_pieces(sampler):
    return sorted(p for batch in sampler for p in batch)


def test_sampler_skips_empty_documents_and_reports_them_once():
    rng = np.random.default_rng(2)
    for trial in range(5):
        lengths = rng.integers(0, 3 * CONTEXT, size=int(rng.integers(1, 40)))
        lengths[rng.random(lengths.size) < 0.3] = 0
        empty = int((lengths == 0).sum())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sampler = PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT, seed=trial)
            pieces = all_pieces(sampler) + all_pieces(sampler)  # two epochs: reported once
        reports = [w for w in caught if "have no token" in str(w.message)]
        assert len(reports) == (1 if empty else 0) and sampler.empty_documents == empty
        if empty:
            assert f"{empty} of {lengths.size} documents" in str(reports[0].message)
        covered = np.zeros(lengths.size, dtype=np.int64)
        for doc, offset, length in pieces:
            assert lengths[doc] > 0 and 0 < length <= CONTEXT
            covered[doc] += length
        np.testing.assert_array_equal(covered, 2 * lengths)  # every token once per epoch


def test_megatron_core_builder_empty_sequences_are_read_and_skipped(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    docs = [np.arange(5), np.zeros(0, np.int64), np.arange(100, 119), np.zeros(0, np.int64),
            np.arange(7, 15)]
    prefix = str(tmp_path / "corpus")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in docs:
        builder.add_document(torch.from_numpy(d), [len(d)])
    builder.finalize(prefix + ".idx")
    assert wlb.read_megatron_index(prefix + ".idx")["empty_sequences"] == 2
    source = MegatronTokens(prefix)
    assert source.lengths.tolist() == [5, 0, 19, 0, 8]
    assert source[1].size == 0 and source[2].tolist() == list(range(100, 119))
    with pytest.warns(UserWarning, match="2 of 5 documents have no token"):
        sampler = PackedBatchSampler(source.lengths, pp=1, dp=1, rank=0, context=CONTEXT)
    assert sorted(p[0] for p in all_pieces(sampler)) == [0, 2, 4]


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_long_and_compressed_json_lines(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    rng = np.random.default_rng(4)
    # One line of about 3 MiB (pyarrow's default 1 MiB block refuses it: "straddling object").
    docs = [rng.integers(0, 50000, size=n).tolist() for n in (3, 400_000, 1, 17)]
    rows = [{"input_ids": d, "length": len(d)} for d in docs]
    write_jsonl(tmp_path / "a.jsonl", rows)
    write_jsonl(tmp_path / "a.jsonl.gz", rows, opener=gzip.open)
    with open(tmp_path / "a.jsonl.zst", "wb") as raw:
        with zstandard.ZstdCompressor().stream_writer(raw) as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    with pytest.raises(pa.ArrowInvalid, match="straddling"):
        pa.json.read_json(str(tmp_path / "a.jsonl"))  # what the default block does
    for name in ("a.jsonl", "a.jsonl.gz", "a.jsonl.zst"):
        source = ArrowTokens(str(tmp_path / name))
        assert source.lengths.tolist() == [3, 400_000, 1, 17], name
        assert source[1].tolist() == docs[1] and source[3].tolist() == docs[3]
        np.testing.assert_array_equal(jsonl_lengths(tmp_path / name), [3, 400_000, 1, 17])
        again = pickle.loads(pickle.dumps(source))
        assert again._values is None and again[1].tolist() == docs[1]  # reopened by path


def test_several_files_and_save_to_disk_folders(tmp_path):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(6)
    docs = [rng.integers(0, 1000, size=int(n)).tolist() for n in rng.integers(0, 40, size=30)]
    for k in range(3):
        pa.parquet.write_table(pa.table({"input_ids": docs[10 * k:10 * k + 10]}),
                               tmp_path / f"part-{k}.parquet")
    by_glob = ArrowTokens(str(tmp_path / "part-*.parquet"))
    by_list = ArrowTokens([tmp_path / f"part-{k}.parquet" for k in range(3)])
    folder = tmp_path / "saved"
    # Dataset.from_dict's fingerprint pickles the table with dill, which fails under pyarrow 26
    # (MonthDayNano); an explicit fingerprint skips that.
    dataset = datasets.Dataset(pa.table({"input_ids": docs}), fingerprint="wlb-test")
    dataset.save_to_disk(str(folder), num_shards=3)
    saved = ArrowTokens(str(folder))
    for source in (by_glob, by_list, saved):
        assert source.lengths.tolist() == [len(d) for d in docs]
        for i in (0, 9, 10, 29):
            assert source[i].tolist() == docs[i]
        blob = pickle.dumps(source)
        assert len(blob) < 4096  # the paths travel, not the tokens
        assert pickle.loads(blob)[17].tolist() == docs[17]
    with pytest.raises(FileNotFoundError, match="no file matches"):
        ArrowTokens(str(tmp_path / "nothing-*.parquet"))
    with pytest.raises(ValueError, match="folder without state.json"):
        ArrowTokens(str(tmp_path))
    pa.parquet.write_table(pa.table({"input_ids": pa.array([[1.5]])}), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="do not share a schema"):
        ArrowTokens([tmp_path / "part-0.parquet", tmp_path / "x.parquet"])
