"""PyTorch integration of wlb (torch is imported here only, never by ``import wlb``).

- ``PackedDataset`` (``wlb.torch.dataset``): packed, resumable data loading, one item per step.
- ``cp_slice``, ``cp_pad``, ``cp_keys``, ``cp_varlen_args`` (``wlb.torch.cp``): a CP shard plan
  applied to packed tensors.
"""

from .cp import cp_keys, cp_pad, cp_slice, cp_varlen_args
from .dataset import PackedDataset

__all__ = ["PackedDataset", "cp_keys", "cp_pad", "cp_slice", "cp_varlen_args"]
