"""wlb.torch: packed, resumable data loading and CP slicing (needs PyTorch; skipped without)."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import wlb

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed (pip install torch)")


def test_without_torch_the_module_imports_and_explains():
    # A fresh interpreter in which `import torch` fails, whether or not PyTorch is installed.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import wlb, wlb.torch as wt\n"
        "try:\n"
        "    wt.PackedDataset([[1, 2, 3]], packer=wlb.Packer('wlb', context=8))\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wlb.torch needs PyTorch" in done.stdout


def corpus(seed, count=400, context=512):
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(count) < 0.08, rng.integers(context // 4, 3 * context, count),
                       rng.integers(1, context // 6, count))
    return [rng.integers(0, 50000, size=int(n)) for n in lengths]


def make(docs, name="wlb", **kwargs):
    from wlb.torch import PackedDataset
    return PackedDataset(docs, packer=wlb.Packer(name, context=512, micro_batches=3, **kwargs))


def flat(items):
    return [(item["step"], [mb["input_ids"].tolist() for mb in item["micro_batches"]])
            for item in items]


@needs_torch
@pytest.mark.parametrize("name", wlb.packer_names())
def test_every_token_once_and_layout(name):
    import torch
    docs = corpus(1)
    items = list(torch.utils.data.DataLoader(make(docs, name), batch_size=None))
    seen = {}
    for item in items:
        assert len(item["micro_batches"]) == 3
        for mb in item["micro_batches"]:
            cu = mb["cu_seqlens"]
            assert cu.dtype == torch.int32 and mb["input_ids"].dtype == torch.int64
            assert torch.equal(cu[1:] - cu[:-1], mb["lengths"].to(torch.int32))
            assert mb["input_ids"].numel() == cu[-1].item() == mb["position_ids"].numel()
            for i, (doc, off, length) in enumerate(zip(mb["document_ids"].tolist(),
                                                       mb["offsets"].tolist(),
                                                       mb["lengths"].tolist())):
                rows = slice(cu[i].item(), cu[i + 1].item())
                assert mb["input_ids"][rows].tolist() == docs[doc][off:off + length].tolist()
                assert mb["position_ids"][rows].tolist() == list(range(length))
                seen.setdefault(doc, []).append((off, length))
    assert sorted(seen) == list(range(len(docs)))
    for doc, parts in seen.items():
        parts.sort()
        assert [p[0] for p in parts] == list(np.cumsum([0] + [p[1] for p in parts[:-1]]))
        assert sum(p[1] for p in parts) == len(docs[doc])


@needs_torch
def test_same_plan_as_the_packer():
    docs = corpus(2)
    items = list(make(docs))
    lengths = [len(d) for d in docs]
    packer = wlb.Packer("wlb", context=512, micro_batches=3)
    steps = []
    for arrivals in wlb.split_into_steps(wlb.make_documents(lengths, 512), 3 * 512):
        steps += packer.push(arrivals)
    steps += packer.flush()
    assert [i["step"] for i in items] == [s.step for s in steps]
    for item, step in zip(items, steps):
        for got, mb in zip(item["micro_batches"], step.micro_batches):
            assert got["document_ids"].tolist() == mb.ids.tolist()
            assert got["offsets"].tolist() == mb.offsets.tolist()


@needs_torch
@pytest.mark.parametrize("name, kwargs", [("wlb", {}), ("wlb-refine", {}),
                                          ("fixed-greedy", {"window": 3}), ("original", {})])
def test_state_dict_resumes_exactly(name, kwargs):
    docs = corpus(3)
    expected = flat(make(docs, name, **kwargs))
    for stop in range(0, len(expected) + 1, max(1, len(expected) // 7)):
        first = make(docs, name, **kwargs)
        it = iter(first)
        got = flat([next(it) for _ in range(stop)])
        state = first.state_dict()
        second = make(docs, name, **kwargs)
        second.load_state_dict(state)
        assert got + flat(second) == expected, f"resumed after {stop} items"


@needs_torch
def test_bad_inputs():
    import torch
    from wlb.torch import PackedDataset
    with pytest.raises(TypeError, match="integer token ids"):
        list(make([np.array([1.5, 2.5])]))
    with pytest.raises(ValueError, match="document 1: document length must be > 0, got 0"):
        list(make([np.array([1, 2]), np.array([], dtype=np.int64)]))
    ds = make(corpus(4))
    with pytest.raises(ValueError, match="version"):
        ds.load_state_dict({"document": 3})
    state = ds.state_dict()
    state["packer"]["packer_state"] = b"garbage"
    with pytest.raises(ValueError, match="missing the 'wlb-packer-state v1' header"):
        ds.load_state_dict(state)
    with pytest.raises(TypeError, match="not both"):
        PackedDataset([], packer=wlb.Packer("wlb"), context=8)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    with pytest.raises(RuntimeError, match="num_workers <= 1"):
        list(loader)


@needs_torch
def test_cp_helpers_apply_the_plan():
    import torch
    from wlb.torch import cp_keys, cp_pad, cp_slice, cp_varlen_args
    rng = np.random.default_rng(5)
    for trial in range(40):
        lengths = rng.integers(1, 3000, size=int(rng.integers(1, 12)))
        cp = int(rng.integers(1, 6))
        plan = wlb.plan_shards(lengths, cp, ["per-seq", "per-doc", "adaptive", "hybrid"][trial % 4],
                               layer_mix=["causal", "window:300", "chunk:700"][trial % 3])
        packed = torch.arange(int(lengths.sum()) * 2).reshape(-1, 2)
        local = [cp_slice(packed, plan, r) for r in range(cp)]
        gathered = torch.cat([cp_pad(x, plan) for x in local])
        for r in range(cp):
            assert torch.equal(local[r], packed[torch.from_numpy(plan[r].token_indices)])
            keys = cp_keys(gathered, plan, r)
            assert torch.equal(keys, packed[torch.from_numpy(plan[r].key_indices)])
            args = cp_varlen_args(plan, r)
            assert args.cu_seqlens_kv[-1].item() == keys.shape[0]
            assert args.cu_seqlens_q[-1].item() == local[r].shape[0]
            assert (args.cp_size, args.cp_rank, args.shard_plan) == (cp, r, plan)
            assert args.max_seqlen_q == plan[r].max_seqlen_q
    with pytest.raises(ValueError, match="needs 10 rows"):
        cp_slice(torch.zeros(9), wlb.plan_shards([10], 2), 0)
