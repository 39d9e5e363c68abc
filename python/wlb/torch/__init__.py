"""PyTorch integration of wlb (torch is imported here only, never by ``import wlb``).

- ``PackedDataset`` (``wlb.torch.dataset``): packed, resumable data loading, one item per step.
- ``PackedBatchSampler`` (``wlb.torch.sampler``): plans steps from lengths in the main process and
  yields this DP rank's micro-batches (DP assignment by the 1F1B step-time model); resumable,
  elastic across DP sizes. ``PackedPieces`` and ``PackedCollate`` (``wlb.torch.collate``) fetch
  and pack its micro-batches in DataLoader workers.
- ``cp_slice``, ``cp_pad``, ``cp_keys``, ``cp_varlen_args`` (``wlb.torch.cp``): a CP shard plan
  applied to packed tensors.
"""

from .collate import PackedCollate, PackedPieces
from .cp import cp_keys, cp_pad, cp_slice, cp_varlen_args
from .dataset import PackedDataset
from .sampler import PackedBatchSampler

__all__ = ["PackedBatchSampler", "PackedCollate", "PackedDataset", "PackedPieces", "cp_keys",
           "cp_pad", "cp_slice", "cp_varlen_args"]
