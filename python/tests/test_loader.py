"""Data loading for training jobs: PackedBatchSampler + PackedPieces + PackedCollate, DP
assignment, exact and elastic resume (through torchdata's StatefulDataLoader, with workers) and
the corpus formats of wlb.formats (Megatron .idx/.bin, Arrow, Parquet, JSON lines) written here.
PyTorch, torchdata and pyarrow are test dependencies (scripts/python_env.sh): nothing skips."""

import json
import os
import struct
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import binary
from torchdata.stateful_dataloader import StatefulDataLoader

import wlb
from wlb.formats import ArrowTokens, MegatronTokens, jsonl_lengths
from wlb.torch import PackedBatchSampler, PackedCollate, PackedPieces

CONTEXT = 512
ROUNDS = 8 if os.environ.get("CI") == "true" else 40  # random save points per elastic case


def corpus(seed, count=240):
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(count) < 0.1, rng.integers(CONTEXT // 4, 3 * CONTEXT, count),
                       rng.integers(1, CONTEXT // 6, count))
    return lengths, [rng.integers(0, 50000, size=int(n)) for n in lengths]


def loader(docs, sampler, workers, cls=torch.utils.data.DataLoader):
    return cls(PackedPieces(docs), batch_sampler=sampler, collate_fn=PackedCollate(),
               num_workers=workers, timeout=120 if workers else 0)


def same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def epoch_pieces(lengths, seed, context=CONTEXT):
    """Every (document, offset, length) piece of the epoch, sorted."""
    order = np.random.default_rng([seed, 0]).permutation(len(lengths))
    p = wlb.make_documents(np.asarray(lengths)[order], context)
    return sorted(zip(order[p.ids].tolist(), p.offsets.tolist(), p.lengths.tolist()))


def step_pieces(step):
    return [piece for mb in step.micro_batches
            for piece in zip(mb.ids.tolist(), mb.offsets.tolist(), mb.lengths.tolist())]


# ---- collate ---------------------------------------------------------------------------------

def test_collate_packs_pieces_in_varlen_layout():
    docs = [np.arange(10, 20), np.arange(100, 103)]
    pieces = PackedPieces(docs)
    mb = PackedCollate()([pieces[(0, 4, 3)], pieces[(1, 0, 3)]])
    assert mb["input_ids"].tolist() == [14, 15, 16, 100, 101, 102]
    assert mb["labels"].tolist() == [15, 16, -100, 101, 102, -100]
    assert mb["position_ids"].tolist() == [0, 1, 2, 0, 1, 2]
    assert mb["cu_seqlens"].dtype == torch.int32 and mb["cu_seqlens"].tolist() == [0, 3, 6]
    assert mb["max_seqlen"] == 3
    assert mb["document_ids"].tolist() == [0, 1] and mb["offsets"].tolist() == [4, 0]
    empty = PackedCollate()([])
    assert empty["input_ids"].numel() == 0 and empty["cu_seqlens"].tolist() == [0]
    with pytest.raises(ValueError, match="offset 8, length 3.* document 0 .* 10 tokens"):
        pieces[(0, 8, 3)]


# ---- sampler: plans, DP ranks, workers -------------------------------------------------------

@pytest.mark.parametrize("pp,dp", [(2, 2), (1, 3)])
def test_ranks_split_every_step_and_every_piece_is_planned_once(pp, dp):
    lengths, _ = corpus(1)
    samplers = [PackedBatchSampler(lengths, pp=pp, dp=dp, rank=r, context=CONTEXT, seed=5)
                for r in range(dp)]
    steps = list(samplers[0].steps())
    planned = []
    for step, ranks in steps:
        assert len(step.micro_batches) == pp * dp
        assert sorted(k for r in ranks for k in r) == list(range(pp * dp))
        assert all(len(r) == pp for r in ranks)
        times = wlb.micro_batch_stage_times([mb.lengths for mb in step.micro_batches], pp=pp,
                                            dp=dp)
        a = wlb.assign_dp_ranks(*times, pp, dp)
        assert a["ranks"] == ranks and a["step_seconds"] <= a["round_robin_seconds"]
        planned += step_pieces(step)
    assert sorted(planned) == epoch_pieces(lengths, 5)
    for r, sampler in enumerate(samplers):  # each rank yields its share, in run order
        expected = [list(zip(step.micro_batches[k].ids.tolist(),
                             step.micro_batches[k].offsets.tolist(),
                             step.micro_batches[k].lengths.tolist()))
                    for step, ranks in steps for k in ranks[r]]
        assert list(sampler) == expected


@pytest.mark.filterwarnings("ignore:This DataLoader will create 8 worker processes")
def test_same_batches_for_every_worker_count():
    lengths, docs = corpus(2)
    reference = None
    for workers in (0, 1, 3, 8):
        got = [list(loader(docs, PackedBatchSampler(lengths, pp=2, dp=2, rank=r, context=CONTEXT),
                           workers)) for r in range(2)]
        if reference is None:
            reference = got
            assert all(len(g) > 10 for g in got)
            continue
        for mine, ref in zip(got, reference):
            assert len(mine) == len(ref)
            for a, b in zip(mine, ref):
                same(a, b)
    for batch, pieces in zip(reference[0], PackedBatchSampler(lengths, pp=2, dp=2, rank=0,
                                                              context=CONTEXT)):
        tokens = np.concatenate([docs[d][o:o + n] for d, o, n in pieces])
        assert batch["input_ids"].tolist() == tokens.tolist()


def test_round_robin_assignment_and_bad_arguments():
    lengths, _ = corpus(3)
    s = PackedBatchSampler(lengths, pp=2, dp=2, rank=1, context=CONTEXT, assign="round_robin")
    for _, ranks in s.steps():
        assert ranks == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match=r"rank must be in \[0, dp = 2\), got 2"):
        PackedBatchSampler(lengths, pp=2, dp=2, rank=2, context=CONTEXT)
    with pytest.raises(ValueError, match="document 1 has length -2; lengths must be >= 0"):
        PackedBatchSampler([3, -2], pp=1, dp=1, rank=0, context=CONTEXT)
    with pytest.raises(ValueError, match="assign must be"):
        PackedBatchSampler(lengths, pp=1, dp=1, rank=0, context=CONTEXT, assign="rr")
    with pytest.raises(ValueError, match="PP 4; this sampler has context 512 and PP 2"):
        PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT).load_state_dict(
            PackedBatchSampler(lengths, pp=4, dp=1, rank=0, context=CONTEXT).state_dict())
    with pytest.raises(ValueError, match="'seed': 3.*'seed': 0"):
        PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT).load_state_dict(
            PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT, seed=3).state_dict())
    with pytest.raises(ValueError, match="'documents': 239"):
        PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT).load_state_dict(
            PackedBatchSampler(lengths[1:], pp=2, dp=1, rank=0, context=CONTEXT).state_dict())
    with pytest.raises(ValueError, match="version 1"):
        PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT).load_state_dict({})


def test_dp_assignment_bindings():
    a = wlb.assign_dp_ranks([10, 1, 10, 1], [20, 2, 20, 2], 2, 2)
    assert a["round_robin_seconds"] == 90.0  # both heavy micro-batches on rank 0
    assert a["step_seconds"] < 90.0 and sorted(map(len, a["ranks"])) == [2, 2]
    assert [sorted(k % 2 for k in r) for r in a["ranks"]] == [[0, 1], [0, 1]]
    with pytest.raises(ValueError, match="forward has 1 micro-batches but backward has 2"):
        wlb.assign_dp_ranks([1.0], [1.0, 2.0], 1, 1)
    with pytest.raises(ValueError, match="3 micro-batches cannot be split evenly over DP = 2"):
        wlb.assign_dp_ranks([1.0] * 3, [1.0] * 3, 1, 2)
    with pytest.raises(ValueError, match="micro-batch 1: document length 0"):
        wlb.micro_batch_stage_times([[5], [0]])
    with pytest.raises(ValueError, match="unknown cost preset 'gpt-9'"):
        wlb.micro_batch_stage_times([[5]], model="gpt-9")
    forward, backward = wlb.micro_batch_stage_times([[4096], [4096, 4096], []], pp=2)
    assert forward[1] > forward[0] > 0 and forward[2] == 0.0 and backward[0] > forward[0]


# ---- resume ----------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_through_stateful_dataloader(workers):
    lengths, docs = corpus(4)
    make = lambda: PackedBatchSampler(lengths, pp=2, dp=2, rank=1, context=CONTEXT, seed=9)
    full = list(loader(docs, make(), workers, StatefulDataLoader))
    rng = np.random.default_rng(workers)
    for stop in sorted(rng.choice(np.arange(1, len(full)), size=3, replace=False).tolist()):
        first = loader(docs, make(), workers, StatefulDataLoader)
        it = iter(first)
        head = [next(it) for _ in range(stop)]
        state = first.state_dict()
        del it, first
        second = loader(docs, make(), workers, StatefulDataLoader)
        second.load_state_dict(state)
        rest = list(second)
        assert len(head) + len(rest) == len(full), stop
        for a, b in zip(head + rest, full):
            same(a, b)


@pytest.mark.parametrize("new_dp", [2, 8])
def test_elastic_resume_loses_and_repeats_nothing(new_dp):
    rng = np.random.default_rng(new_dp)
    for _ in range(ROUNDS):
        seed = int(rng.integers(1 << 30))
        lengths, _ = corpus(seed, count=int(rng.integers(60, 200)))
        old = PackedBatchSampler(lengths, pp=2, dp=4, rank=int(rng.integers(4)), context=CONTEXT,
                                 seed=seed)
        steps = [step for step, _ in old.steps()]
        given = int(rng.integers(0, 2 * len(steps) + 1))  # micro-batches this rank gave
        it = iter(old)
        for _ in range(given):
            next(it)
        state = old.state_dict()
        trained = [p for step in steps[:state["steps"]] for p in step_pieces(step)]
        new = PackedBatchSampler(lengths, pp=2, dp=new_dp, rank=0, context=CONTEXT, seed=seed)
        new.load_state_dict(state)
        after = [p for step, ranks in new.steps() for p in step_pieces(step)]
        assert sorted(trained + after) == epoch_pieces(lengths, seed), (seed, given)
        # Back at the saved DP the same state resumes exactly.
        exact = PackedBatchSampler(lengths, pp=2, dp=4, rank=old.rank, context=CONTEXT, seed=seed)
        exact.load_state_dict(state)
        rest = list(exact)
        whole = list(PackedBatchSampler(lengths, pp=2, dp=4, rank=old.rank, context=CONTEXT,
                                        seed=seed))
        assert whole[given:] == rest


# ---- formats ---------------------------------------------------------------------------------

def write_megatron(prefix, docs, dtype=np.uint16, code=8, version=1, magic=b"MMIDIDX\x00\x00"):
    """An indexed dataset as Megatron-LM's _IndexWriter lays it out (one sequence per doc)."""
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * np.dtype(
        dtype).itemsize
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(magic)
        f.write(struct.pack("<Q", version))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(docs) + 1))
        f.write(lengths.tobytes() + pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def test_megatron_indexed_dataset(tmp_path):
    lengths, docs = corpus(6, count=80)
    prefix = str(tmp_path / "corpus_text_document")
    write_megatron(prefix, docs)
    source = MegatronTokens(prefix)
    assert source.lengths.tolist() == lengths.tolist()
    assert wlb.read_lengths(prefix + ".idx").tolist() == lengths.tolist()
    assert all(source[i].tolist() == docs[i].tolist() for i in range(len(docs)))
    sampler = PackedBatchSampler(source.lengths, pp=2, dp=1, rank=0, context=CONTEXT)
    planned = list(PackedBatchSampler(source.lengths, pp=2, dp=1, rank=0, context=CONTEXT))
    # The default packer (wlb-lookahead) leaves this epoch's last step one micro-batch empty.
    assert [i for i, pieces in enumerate(planned) if not pieces] == [len(planned) - 1]
    batches = list(loader(source, sampler, 2))
    assert len(batches) == len(planned)
    for batch, pieces in zip(batches, planned):
        tokens = [t for d, o, n in pieces for t in docs[d][o:o + n].tolist()]
        assert batch["input_ids"].tolist() == tokens

    with pytest.raises(FileNotFoundError, match="cannot open Megatron index"):
        MegatronTokens(str(tmp_path / "missing"))
    write_megatron(prefix, docs, dtype=np.int32, code=4)
    assert MegatronTokens(prefix)[3].tolist() == docs[3].tolist()
    for kwargs, message in (({"magic": b"MMIDIDX\x00\x01"}, "wrong magic"),
                            ({"version": 2}, "unsupported version 2"),
                            ({"code": 11}, "unknown dtype code 11")):
        write_megatron(prefix, docs, **kwargs)
        with pytest.raises(ValueError, match=message):
            MegatronTokens(prefix)
    write_megatron(prefix, docs)
    data = open(prefix + ".idx", "rb").read()
    open(prefix + ".idx", "wb").write(data[:-5])
    with pytest.raises(ValueError, match="truncated"):
        wlb.read_lengths(prefix + ".idx")
    write_megatron(prefix, docs)
    open(prefix + ".bin", "ab").write(b"\0\0")
    with pytest.raises(ValueError, match=r"\.bin has \d+ bytes, its index describes"):
        MegatronTokens(prefix)


def test_wlb_plan_reads_megatron_index(tmp_path):
    exe = binary("tools/wlb-plan")
    lengths, docs = corpus(8, count=120)
    write_megatron(str(tmp_path / "c"), docs)
    out = subprocess.run([str(exe), f"--docs={tmp_path / 'c.idx'}", f"--context={CONTEXT}",
                          "--micro-batches=4", "--format=json", "--timing=false"],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    summary = json.loads(out)["summary"]
    assert summary["documents"] == 120 and summary["tokens"] == int(lengths.sum())
    (tmp_path / "bad.idx").write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<Q", 3) + bytes(17))
    done = subprocess.run([str(exe), f"--docs={tmp_path / 'bad.idx'}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "unsupported version 3" in done.stderr


def test_arrow_parquet_jsonl_and_dataset_like(tmp_path):
    lengths, docs = corpus(7, count=50)
    table = pa.table({"input_ids": pa.array([d.tolist() for d in docs], pa.list_(pa.int32())),
                      "length": pa.array(lengths.tolist(), pa.int64())})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=16)
    with pa.OSFile(str(tmp_path / "stream.arrow"), "wb") as f:  # as Hugging Face caches
        with pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table, max_chunksize=7)
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as f:
        with pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    with open(tmp_path / "c.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"input_ids": d.tolist(), "length": len(d)}) + "\n")

    class DatasetLike:  # what a datasets.Dataset exposes: .data.table
        data = type("Table", (), {"table": table})()

    for source in (table, DatasetLike(), tmp_path / "c.parquet", tmp_path / "stream.arrow",
                   str(tmp_path / "file.arrow"), str(tmp_path / "c.jsonl")):
        tokens = ArrowTokens(source)
        assert tokens.lengths.tolist() == lengths.tolist(), source
        assert all(tokens[i].tolist() == docs[i].tolist() for i in (0, 17, 49)), source
    assert jsonl_lengths(tmp_path / "c.jsonl").tolist() == lengths.tolist()
    rechunked = pa.concat_tables([table.slice(3, 10), table.slice(20, 15)])  # sliced chunks
    tokens = ArrowTokens(rechunked)
    expected = docs[3:13] + docs[20:35]
    assert tokens.lengths.tolist() == [len(d) for d in expected]
    assert all(tokens[i].tolist() == expected[i].tolist() for i in range(len(expected)))

    parquet = ArrowTokens(tmp_path / "c.parquet")  # reopened in the workers
    batches = list(loader(parquet, PackedBatchSampler(parquet.lengths, pp=1, dp=1, rank=0,
                                                      context=CONTEXT), 2))
    assert sum(b["input_ids"].numel() for b in batches) == int(lengths.sum())

    with pytest.raises(TypeError, match="must hold lists of integer token ids"):
        ArrowTokens(table, column="length")
    with pytest.raises(KeyError, match="no column 'tokens'"):
        ArrowTokens(table, column="tokens")
    with pytest.raises(ValueError, match="document 1 is null"):
        ArrowTokens(pa.table({"input_ids": pa.array([[1], None], pa.list_(pa.int64()))}))
    with open(tmp_path / "bad.jsonl", "w") as f:
        f.write('{"length": 3}\n{"length": -1}\n')
    with pytest.raises(ValueError, match="line 2 has length -1"):
        jsonl_lengths(tmp_path / "bad.jsonl")
    shuffled = DatasetLike()
    shuffled._indices = pa.table({"indices": pa.array([1, 0], pa.uint64())})
    with pytest.raises(ValueError, match="indices mapping"):
        ArrowTokens(shuffled)
    with pytest.raises(ValueError, match="cannot tell the format"):
        ArrowTokens(str(tmp_path / "c.txt"))
