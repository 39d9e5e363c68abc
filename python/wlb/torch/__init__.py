"""PyTorch integration of wlb (torch is imported here only, never by ``import wlb``).

- ``PackedDataset`` (``wlb.torch.dataset``): packed, resumable data loading, one item per step.
- ``PackedBatchSampler`` (``wlb.torch.sampler``): plans steps from lengths in the main process and
  yields this DP rank's micro-batches (DP assignment by the 1F1B step-time model); resumable,
  elastic across DP sizes. ``PackedPieces`` and ``PackedCollate`` (``wlb.torch.collate``) fetch
  and pack its micro-batches in DataLoader workers.
- ``cp_slice``, ``cp_pad``, ``cp_keys``, ``cp_varlen_args`` (``wlb.torch.cp``): a CP shard plan
  applied to packed tensors.
- ``PackedSeqParams`` (``wlb.torch.packed``): a micro-batch's or a CP rank's varlen attention
  arguments, typed (converts to Megatron-core's record and to Hugging Face kwargs);
  ``packed_cross_entropy``: a loss as a (sum, count) pair, safe on empty micro-batches.
- ``wlb.torch.hf`` (imported on its own; needs transformers): Hugging Face models under wlb's
  context parallelism (``attn_implementation="wlb_cp"``).
- ``cp_attention``, ``CPAttention`` (``wlb.torch.cp_attention``): differentiable context-parallel
  attention that executes a shard plan over ``torch.distributed`` under its attention mask
  (causal, sliding window or chunked local: ``plan.mask``); ``varlen_causal_attention``
  (``wlb.torch.attention``): its per-rank varlen attention backends.
- ``OnlineCalibration`` (``wlb.torch.calibration``): times each micro-batch's forward + backward in
  the training loop, refits the cost every K steps and hands it to ``PackedBatchSampler``
  (resumable with it).
"""

from .attention import varlen_causal_attention
from .calibration import OnlineCalibration
from .collate import PackedCollate, PackedPieces
from .cp import cp_keys, cp_pad, cp_slice, cp_varlen_args
from .cp_attention import CommVolume, CPAttention, comm_volume, cp_attention
from .dataset import PackedDataset
from .packed import PackedLoss, PackedSeqParams, packed_cross_entropy
from .sampler import PackedBatchSampler

__all__ = [
    "CPAttention",
    "CommVolume",
    "OnlineCalibration",
    "PackedBatchSampler",
    "PackedCollate",
    "PackedDataset",
    "PackedLoss",
    "PackedPieces",
    "PackedSeqParams",
    "comm_volume",
    "cp_attention",
    "cp_keys",
    "cp_pad",
    "cp_slice",
    "cp_varlen_args",
    "packed_cross_entropy",
    "varlen_causal_attention",
]
