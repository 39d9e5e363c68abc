"""Packed, checkpointable PyTorch data loading with wlb.torch, and per-rank CP slices.

    pip install torch && python examples/python/torch_loader.py
"""

import numpy as np
import torch

import wlb
from wlb.torch import PackedDataset, cp_keys, cp_pad, cp_slice, cp_varlen_args

# A toy corpus: token sequences of the default length distribution, scaled to S = 8192.
rng = np.random.default_rng(0)
lengths = np.maximum(wlb.sample_default_lengths(40 * 4 * 131072, seed=1) // 16, 1)
corpus = [rng.integers(0, 32000, size=n) for n in lengths[:4000]]

dataset = PackedDataset(corpus, packer=wlb.Packer("wlb", context=8192, micro_batches=4))
loader = torch.utils.data.DataLoader(dataset, batch_size=None)
for i, step in enumerate(loader):
    mb = step["micro_batches"][0]
    print(f"step {step['step']}: imbalance {step['imbalance']:.3f}, micro-batch 0 has "
          f"{mb['input_ids'].numel()} tokens in {mb['cu_seqlens'].numel() - 1} pieces")
    if i == 2:
        checkpoint = dataset.state_dict()  # resume exactly here after a restart
        break

resumed = PackedDataset(corpus, packer=wlb.Packer("wlb", context=8192, micro_batches=4))
resumed.load_state_dict(checkpoint)
step = next(iter(resumed))
print(f"resumed at step {step['step']}")

# Context parallelism over 2 ranks: each rank's rows, the all-gather, each rank's keys.
mb = step["micro_batches"][0]
plan = wlb.plan_shards(wlb.MicroBatch(wlb.Documents(mb["document_ids"].numpy(),
                                                    mb["lengths"].numpy(), mb["pieces"].numpy(),
                                                    mb["offsets"].numpy())), 2, "adaptive")
hidden = torch.randn(mb["input_ids"].numel(), 8)  # stands in for a layer's K (tokens x dim)
local = [cp_slice(hidden, plan, r) for r in range(2)]
gathered = torch.cat([cp_pad(x, plan) for x in local])  # what all_gather_into_tensor gives
for r in range(2):
    keys = cp_keys(gathered, plan, r)
    args = cp_varlen_args(plan, r)
    print(f"rank {r}: {local[r].shape[0]} query rows, {keys.shape[0]} key rows, "
          f"max_seqlen_q {args.max_seqlen_q}, plan {plan.strategy}")
