"""Numbers that slip through and readers that trust their input (issue 48, items 2 and 4): bools
where a number is expected (bindings and Python), unsigned and float arrays checked before any
conversion, finite inputs whose results would overflow, null token ids in Arrow columns, and a
Megatron index whose counts do not fit its size, refused before its arrays are read."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import wlb
from wlb.formats import ArrowTokens, MegatronTokens

# ---- bools are not numbers -------------------------------------------------------------------

BOOL_CALLS = {
    "Packer context": lambda b: wlb.Packer("wlb", context=b, micro_batches=2),
    "Packer micro_batches": lambda b: wlb.Packer("wlb", context=64, micro_batches=b),
    "Packer window": lambda b: wlb.Packer("fixed-greedy", context=64, micro_batches=2, window=b),
    "Packer delay_budget": lambda b: wlb.Packer("wlb", context=64, micro_batches=2,
                                                delay_budget=b),
    "plan_shards cp": lambda b: wlb.plan_shards(np.array([5, 9]), b, "per-doc"),
    "plan_shards cp_link_gbps": lambda b: wlb.plan_shards(np.array([5, 9]), 2, "adaptive",
                                                          cp_link_gbps=b),
    "make_documents context": lambda b: wlb.make_documents([5, 9], b),
    "make_documents first_id": lambda b: wlb.make_documents([5, 9], 4, first_id=b),
    "assign_dp_ranks pp": lambda b: wlb.assign_dp_ranks([1.0, 2.0], [1.0, 2.0], b, 2),
    "assign_dp_ranks times": lambda b: wlb.assign_dp_ranks([1.0, b], [1.0, 2.0], 1, 2),
    "micro_batch_stage_times gemm_tflops": lambda b: wlb.micro_batch_stage_times(
        [[5, 9]], gemm_tflops=b),
    "micro_batch_stage_times tp": lambda b: wlb.micro_batch_stage_times([[5, 9]], tp=b),
    "KernelModel.analytic heads": lambda b: wlb.KernelModel.analytic(heads=b),
    "KernelModel.analytic peak_tflops": lambda b: wlb.KernelModel.analytic(peak_tflops=b),
    "CostModel length": lambda b: wlb.CostModel.from_preset("llama2-7b")(b),
    "sample_default_lengths seed": lambda b: wlb.sample_default_lengths(1000, b),
}


@pytest.mark.parametrize("name", sorted(BOOL_CALLS))
@pytest.mark.parametrize("value", [True, False, np.True_])
def test_bindings_refuse_bools_where_numbers_are_expected(name, value):
    # nanobind's TypeError lists the signatures (an overload taking arrays names its own);
    # Packer's keywords (read through kPlanSettings) name the keyword and the value.
    with pytest.raises(TypeError, match="incompatible function arguments|integer array|"
                                        r"Packer\(\): \w+ must be (an int|a number), got"):
        BOOL_CALLS[name](value)


def test_numbers_of_other_types_still_convert():
    assert wlb.Packer("wlb", context=np.int64(64), micro_batches=np.int32(2)).context == 64
    plan = wlb.plan_shards(np.array([5, 9]), np.int64(2), "adaptive", cp_link_gbps=100)
    assert plan.cp_size == 2
    assert wlb.make_documents([5], np.uint8(4)).lengths.tolist() == [4, 1]
    with pytest.raises(TypeError):  # beyond int: refused, not wrapped
        wlb.make_documents([5], 1 << 64)
    out = wlb.assign_dp_ranks(np.array([1.0, 2.0]), [np.float32(1.0), 2], 1, 2)
    assert sorted(k for r in out["ranks"] for k in r) == [0, 1]


def test_bool_and_unsigned_arrays_are_checked_before_conversion():
    with pytest.raises(TypeError, match="ms must be an array of numbers, got a bool array"):
        wlb.KernelModel.from_points([128, 256], [128, 256], np.array([True, False]))
    with pytest.raises(TypeError, match="values must be an array of numbers, got a bool array"):
        wlb.imbalance_degree(np.array([True, True]))
    with pytest.raises(TypeError, match="bool"):
        wlb.make_documents(np.array([True, False]), 8)
    big = np.array([3, (1 << 63) + 5], dtype=np.uint64)
    with pytest.raises(ValueError, match=r"lengths\[1\] = 9223372036854775813 does not fit"):
        wlb.make_documents(big, 8)
    with pytest.raises(TypeError, match="float64"):
        wlb.make_documents(np.array([3.0, 4.0]), 8)


def test_finite_inputs_whose_results_overflow_are_refused():
    huge = [1e308, 1e308]
    with pytest.raises(ValueError, match=r"micro-batch 0: forward time 1e\+308 brings"):
        wlb.assign_dp_ranks(huge, huge, 1, 2)
    with pytest.raises(ValueError, match=r"values\[1\] = 1e\+308 brings the sum"):
        wlb.imbalance_degree(np.array(huge))
    assert wlb.imbalance_degree(np.array([1e300, 3e300])) == pytest.approx(1.5)
    out = wlb.assign_dp_ranks([1e290] * 4, [1e290] * 4, 4, 2)
    assert np.isfinite(out["step_seconds"]) and np.isfinite(out["round_robin_seconds"])


def test_unsigned_token_ids_above_int64_are_named_not_wrapped(tmp_path):
    import torch

    from wlb.formats import jsonl_lengths
    from wlb.torch import PackedDataset, PackedPieces

    docs = [np.array([1, 2, 3], dtype=np.uint64), np.array([4, (1 << 63) + 9], dtype=np.uint64)]
    with pytest.raises(ValueError, match=r"dataset\[1\] token ids from offset 0\[1\] = "
                                         r"9223372036854775817 does not fit int64"):
        PackedPieces(docs)[(1, 0, 2)]
    assert PackedPieces(docs)[(0, 1, 2)][2].tolist() == [2, 3]
    dataset = PackedDataset(docs, packer=wlb.Packer("original", context=8, micro_batches=1))
    with pytest.raises(ValueError, match=r"dataset\[1\] token ids\[1\] = 9223372036854775817"):
        list(torch.utils.data.DataLoader(dataset, batch_size=None))
    path = tmp_path / "lengths.jsonl"  # pyarrow reads it as double: refused, not wrapped
    path.write_text('{"length": 3}\n{"length": 9223372036854775818}\n')
    with pytest.raises(TypeError, match="must be an integer length, got double"):
        jsonl_lengths(str(path))


# ---- Arrow readers: null token ids -----------------------------------------------------------

def lists(rows, value_type=pa.int64()):
    return pa.array(rows, type=pa.list_(value_type))


def test_null_token_ids_are_refused_naming_the_row(tmp_path):
    table = pa.table({"input_ids": lists([[1, 2], [3, None, 5], [6]])})
    with pytest.raises(ValueError, match="document 1 has a null token id at position 1"):
        ArrowTokens(table)
    # Chunked: the row is counted over the chunks; a slice leaves out what it cuts off.
    chunked = pa.Table.from_batches([
        pa.record_batch({"input_ids": lists([[1], [2, 3]])}),
        pa.record_batch({"input_ids": lists([[4, 5, 6], [None]])})])
    with pytest.raises(ValueError, match="document 3 has a null token id at position 0"):
        ArrowTokens(chunked)
    sliced = pa.table({"input_ids": lists([[None], [7, 8], [9]])}).slice(1)
    assert [ArrowTokens(sliced)[i].tolist() for i in range(2)] == [[7, 8], [9]]
    path = tmp_path / "nulls.parquet"
    pq.write_table(table, path)
    with pytest.raises(ValueError, match="document 1 has a null token id"):
        ArrowTokens(str(path))
    filled = ArrowTokens(str(path), fill=0)
    assert [filled[i].tolist() for i in range(3)] == [[1, 2], [3, 0, 5], [6]]
    assert filled.lengths.tolist() == [2, 3, 1]
    assert ArrowTokens(chunked, fill=-1)[3].tolist() == [-1]


def test_fill_must_be_a_token_id_of_the_column():
    table = pa.table({"input_ids": lists([[1, None]], pa.int8())})
    with pytest.raises(TypeError, match="fill must be None or an integer token id, got True"):
        ArrowTokens(table, fill=True)
    with pytest.raises(TypeError, match="got 0.5"):
        ArrowTokens(table, fill=0.5)
    with pytest.raises(ValueError, match="fill 300 is not a int8 token id"):
        ArrowTokens(table, fill=300)
    assert ArrowTokens(table, fill=7)[0].tolist() == [1, 7]


# ---- Megatron index: counts against the file size first --------------------------------------

def test_megatron_index_counts_are_checked_against_the_size_before_reading(tmp_path):
    prefix = str(tmp_path / "corpus")
    header = (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]) +
              ((1 << 40) + 1).to_bytes(8, "little") + (2).to_bytes(8, "little"))
    with open(prefix + ".idx", "wb") as f:
        f.write(header)
        f.truncate((1 << 31) + 4096)  # sparse: larger than any index may be, and never read
    open(prefix + ".bin", "wb").close()
    with pytest.raises(ValueError, match="1099511627777 sequences, more than the limit of "
                                         "1099511627776"):
        MegatronTokens(prefix)
    with pytest.raises(ValueError, match="1099511627777 sequences, more than the limit"):
        wlb.scan_megatron_index(prefix + ".idx")
    with open(prefix + ".idx", "r+b") as f:
        f.seek(18)
        f.write((1000).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="1000 sequences and 2 documents need 12050"):
        wlb.read_megatron_index(prefix + ".idx")
    os.remove(prefix + ".idx")
