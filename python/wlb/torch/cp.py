"""Apply a ``wlb.plan_shards`` plan to packed tensors: ``cp_slice`` gives a CP rank its rows,
``cp_pad`` pads them to the plan's ``rank_capacity`` for an all-gather, ``cp_keys`` picks the
rank's key rows from the all-gathered K/V (in the order of its ``cu_seqlens_k``) and
``cp_varlen_args`` gives its varlen attention arguments (a ``wlb.torch.PackedSeqParams`` with the
CP fields set).

Key rows and varlen arguments follow ``plan.mask``: under ``"window:W"`` a rank's kernel segments
hold only the keys its queries' windows reach, and each query row must keep only the last
``plan.kernel_window`` keys up to its own (``window_size=(W - 1, 0)`` in FlashAttention terms);
under ``"chunk:C"`` the kernel segments end at chunk boundaries and plain bottom-right causal
attention is exact (``wlb.torch.cp_attention`` does all of this).
"""

from __future__ import annotations

from typing import Any

import wlb

from .._checks import integer
from ._common import require_torch, torch
from .packed import PackedSeqParams


def cp_slice(packed: "torch.Tensor", plan: wlb.ShardPlan, rank: int, dim: int = 0) -> "torch.Tensor":
    """The rows of a packed micro-batch tensor that CP rank ``rank`` holds, in its local order."""
    require_torch()
    _check_rows(packed, plan.tokens, dim, "packed")
    index = torch.from_numpy(plan[rank].token_indices).to(packed.device)
    return packed.index_select(dim, index)


def cp_pad(local: "torch.Tensor", plan: wlb.ShardPlan, dim: int = 0) -> "torch.Tensor":
    """Pads a rank's rows with zeros to ``plan.rank_capacity`` (equal sizes for all_gather)."""
    require_torch()
    missing = plan.rank_capacity - local.shape[dim]
    if missing < 0:
        raise ValueError(
            f"local tensor has {local.shape[dim]} rows along dim {dim}, more than rank_capacity "
            f"{plan.rank_capacity}"
        )
    shape = list(local.shape)
    shape[dim] = missing
    return torch.cat([local, local.new_zeros(shape)], dim=dim)


def cp_keys(gathered: "torch.Tensor", plan: wlb.ShardPlan, rank: int, dim: int = 0) -> "torch.Tensor":
    """Rank ``rank``'s key rows from the all-gathered tensor (cp_size x rank_capacity rows,
    rank-major), in the order of its ``cu_seqlens_k``."""
    require_torch()
    _check_rows(gathered, plan.cp_size * plan.rank_capacity, dim, "gathered")
    index = torch.from_numpy(plan[rank].key_rows).to(gathered.device)
    return gathered.index_select(dim, index)


def cp_varlen_args(plan: wlb.ShardPlan, rank: int, device: Any = "cpu",
                   group: Any = None) -> PackedSeqParams:
    """Rank ``rank``'s varlen attention arguments: ``cu_seqlens_q`` / ``cu_seqlens_kv`` (int32
    tensors over its query rows and its key rows, ``cp_keys``' order), ``max_seqlen_q`` /
    ``max_seqlen_kv``, and the CP fields (``cp_size``, ``cp_rank``, ``cp_group``: ``group``,
    ``shard_plan``: ``plan``)."""
    require_torch()
    rank = integer("rank", rank, 0, plan.cp_size - 1)
    r = plan[rank]
    return PackedSeqParams(cu_seqlens_q=torch.from_numpy(r.cu_seqlens_q).to(device),
                           cu_seqlens_kv=torch.from_numpy(r.cu_seqlens_k).to(device),
                           max_seqlen_q=int(r.max_seqlen_q), max_seqlen_kv=int(r.max_seqlen_k),
                           cp_size=plan.cp_size, cp_rank=rank, cp_group=group, shard_plan=plan)


def _check_rows(t: "torch.Tensor", rows: int, dim: int, what: str) -> None:
    if t.dim() == 0 or t.shape[dim] != rows:
        raise ValueError(
            f"{what} tensor needs {rows} rows along dim {dim}, got shape {tuple(t.shape)}"
        )
