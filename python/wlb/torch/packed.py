"""A typed packed-sequence record and a loss that survives empty micro-batches.

``PackedSeqParams`` is what a varlen ("thd") attention call needs about a packed micro-batch, in
the fields of Megatron-core's record of the same name: ``cu_seqlens_q`` / ``cu_seqlens_kv``
(int32 prefix sums of the segment lengths, from 0), ``max_seqlen_q`` / ``max_seqlen_kv`` and, for
a context-parallel rank, the CP fields (``cp_size``, ``cp_rank``, ``cp_group``, ``shard_plan``).
``PackedCollate`` returns one per micro-batch (``mb["packed_seq_params"]``), ``cp_varlen_args``
one per CP rank. ``to_megatron()`` converts a whole micro-batch's record to
``megatron.core.packed_seq_params.PackedSeqParams`` (imported only then) and ``hf_kwargs()`` to
the keyword arguments a Hugging Face model takes (``cu_seq_lens_q``, ``cu_seq_lens_k``,
``max_length_q``, ``max_length_k``).

    mb = PackedCollate()(pieces)
    p = mb["packed_seq_params"]
    flash_attn_varlen_func(q, k, v, p.cu_seqlens_q, p.cu_seqlens_kv, p.max_seqlen_q,
                           p.max_seqlen_kv, causal=True)
    megatron_model(..., packed_seq_params=p.to_megatron())

``packed_cross_entropy(logits, labels)`` is cross-entropy over a packed micro-batch as a
``(sum, count)`` pair: token-weighted averaging across micro-batches and ranks is
``all_reduce(sum) / all_reduce(count)``, and an empty micro-batch (a rank at the end of an epoch;
see ``PackedBatchSampler``) gives a zero sum that still has a gradient, never NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, NamedTuple, Optional

from .._checks import integer
from ._common import require_torch, torch


@dataclass(eq=False)
class PackedSeqParams:
    """One packed micro-batch's (or one CP rank's) varlen attention arguments."""

    cu_seqlens_q: "torch.Tensor"  # int32, segments' query prefix sums from 0
    cu_seqlens_kv: "torch.Tensor"  # int32, segments' key prefix sums from 0
    max_seqlen_q: int
    max_seqlen_kv: int
    qkv_format: str = "thd"
    cu_seqlens_q_padded: Optional["torch.Tensor"] = None
    cu_seqlens_kv_padded: Optional["torch.Tensor"] = None
    # Context parallelism: the rank's share of a wlb.ShardPlan (cp_size 1: no CP).
    cp_size: int = 1
    cp_rank: int = 0
    cp_group: Any = None
    shard_plan: Any = None  # the wlb.ShardPlan this rank's fields come from

    def __post_init__(self):
        require_torch()
        if self.qkv_format != "thd":
            raise ValueError(f"qkv_format must be 'thd' (packed), got {self.qkv_format!r}")
        for name in ("cu_seqlens_q", "cu_seqlens_kv"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() < 1:
                raise ValueError(f"{name} must be a 1-D tensor of prefix sums from 0, got "
                                 f"{type(t).__name__} {tuple(getattr(t, 'shape', ()))}")
        for name in ("max_seqlen_q", "max_seqlen_kv"):
            setattr(self, name, integer(name, getattr(self, name), 0))
        self.cp_size = integer("cp_size", self.cp_size, 1)
        self.cp_rank = integer("cp_rank", self.cp_rank, 0)
        if not self.cp_rank < self.cp_size:
            raise ValueError(f"cp_rank {self.cp_rank} is not in [0, cp_size = {self.cp_size})")

    @property
    def is_cp(self) -> bool:
        return self.cp_size > 1

    def to(self, device: Any) -> "PackedSeqParams":
        """The same record with its tensors on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return PackedSeqParams(**moved)

    def _whole(self, what: str) -> None:
        if self.is_cp:
            raise ValueError(
                f"{what}: this record is CP rank {self.cp_rank}'s share of a {self.cp_size}-rank "
                "wlb shard plan (its cu_seqlens index keys this rank gathers), which that code "
                "cannot execute; convert the whole micro-batch's record (PackedCollate's) and run "
                "wlb's CP attention (wlb.torch.cp_attention, or wlb.torch.hf for HF models)")

    def to_megatron(self) -> Any:
        """Megatron-core's ``PackedSeqParams`` with the same fields (``megatron-core`` installed;
        whole micro-batches only: Transformer Engine's CP partitions a micro-batch itself)."""
        self._whole("to_megatron")
        try:
            from megatron.core.packed_seq_params import PackedSeqParams as MegatronParams
        except ImportError as e:
            raise ImportError("to_megatron needs megatron-core (pip install megatron-core)") from e
        return MegatronParams(qkv_format=self.qkv_format, cu_seqlens_q=self.cu_seqlens_q,
                              cu_seqlens_kv=self.cu_seqlens_kv,
                              cu_seqlens_q_padded=self.cu_seqlens_q_padded,
                              cu_seqlens_kv_padded=self.cu_seqlens_kv_padded,
                              max_seqlen_q=self.max_seqlen_q, max_seqlen_kv=self.max_seqlen_kv)

    def hf_kwargs(self) -> Dict[str, Any]:
        """The packed-sequence keyword arguments of a Hugging Face model's forward (its
        FlashAttention paths read them; whole micro-batches only)."""
        self._whole("hf_kwargs")
        return {"cu_seq_lens_q": self.cu_seqlens_q, "cu_seq_lens_k": self.cu_seqlens_kv,
                "max_length_q": int(self.max_seqlen_q), "max_length_k": int(self.max_seqlen_kv)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedSeqParams):
            return NotImplemented
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                        and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())):
                    return False
            elif a is not b and a != b:
                return False
        return True

    __hash__ = None  # mutable, compared by value


class PackedLoss(NamedTuple):
    """A packed micro-batch's cross-entropy: the sum over its labelled tokens and their count."""

    sum: "torch.Tensor"  # 0-d, differentiable (zero for an empty micro-batch)
    count: "torch.Tensor"  # 0-d int64

    def mean(self) -> "torch.Tensor":
        """This micro-batch's own mean (zero, with a gradient, when it has no labelled token)."""
        return self.sum / self.count.clamp_min(1).to(self.sum.dtype)


def packed_cross_entropy(logits: "torch.Tensor", labels: "torch.Tensor", *,
                         ignore_index: int = -100, shift: bool = False) -> PackedLoss:
    """Cross-entropy of ``logits`` (..., vocab) against ``labels`` (...) as a ``PackedLoss``.

    ``shift=False``: ``labels[t]`` is token t's target (``PackedCollate()``'s labels);
    ``shift=True``: the target of token t is ``labels[..., t + 1]`` (``PackedCollate(format="hf")``,
    whose labels are unshifted as transformers expects). Float16/bfloat16 logits are summed in
    float32. Token-weighted mean over ranks: ``all_reduce`` the sum and the count, divide.
    """
    require_torch()
    if not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError(f"logits and labels must be tensors, got {type(logits).__name__} and "
                        f"{type(labels).__name__}")
    if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ValueError(f"logits must be labels' shape plus a vocabulary dimension, got "
                         f"{tuple(logits.shape)} and {tuple(labels.shape)}")
    if shift:
        labels = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=ignore_index)
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    targets = labels.reshape(-1).to(flat.device)
    count = (targets != ignore_index).sum()
    if flat.shape[0] == 0:
        total = flat.sum()  # zero, and the graph still reaches the model's parameters
    else:
        total = torch.nn.functional.cross_entropy(flat, targets, ignore_index=ignore_index,
                                                  reduction="sum")
    return PackedLoss(total, count)
