"""Context-parallel attention that executes a ``wlb.plan_shards`` plan over ``torch.distributed``.

Every CP rank holds the rows ``plan[rank].token_indices`` of a packed micro-batch (``cp_slice``)
as q, k, v of shape (tokens, heads, head_dim), GQA allowed. ``cp_attention`` then

1. all-gathers the ranks' K and V rows, each padded to ``plan.rank_capacity``
   (``all_gather_into_tensor``, one call for K and V together),
2. picks this rank's key rows (``plan[rank].key_rows``: every segment's document prefix), and
3. runs varlen causal attention per segment, bottom-right aligned (``wlb.torch.attention``),

returning this rank's output rows and log-sum-exp. Backward computes the local dQ, dK, dV, adds
the key gradients into the gathered layout and reduce-scatters them
(``reduce_scatter_tensor``), so every rank receives the gradients of its own K/V rows. The result
equals single-process attention over the whole packed micro-batch, for every strategy.

    plan = wlb.plan_shards(micro_batch, cp=world, strategy="adaptive")
    q, k, v = (cp_slice(t, plan, rank) for t in (q_full, k_full, v_full))
    out, lse = cp_attention(q, k, v, plan, group=None)          # None: the default group
    layer = CPAttention(plan)                                     # the same as a module

Every check runs before the first collective. Checks that only this rank can fail (its tensors)
are agreed over the group with one small all-reduce first (``agree_on_errors=True``), so a rank
with bad inputs makes every rank raise instead of leaving the others waiting in the all-gather.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import wlb

from ._common import require_torch, torch
from .attention import select_backend, varlen_causal_attention

if torch is not None:
    import torch.distributed as dist


@dataclass(frozen=True)
class CommVolume:
    """Bytes one rank exchanges per call (ring collectives: each rank receives, and in the
    reduce-scatter sends, the other ranks' (C - 1) x rank_capacity rows of K and V)."""

    gathered_bytes: int  # forward all-gather: bytes received from the other ranks
    scattered_bytes: int  # backward reduce-scatter: bytes sent to the other ranks
    gather_buffer_bytes: int  # size of the all-gathered K/V buffer (C x rank_capacity rows)


def comm_volume(plan: wlb.ShardPlan, kv_heads: int, head_dim: int, element_size: int) -> CommVolume:
    """What ``cp_attention`` moves per rank for this plan and K/V shape."""
    row = 2 * kv_heads * head_dim * element_size  # K and V of one token
    others = (plan.cp_size - 1) * plan.rank_capacity * row
    return CommVolume(gathered_bytes=others, scattered_bytes=others,
                      gather_buffer_bytes=plan.cp_size * plan.rank_capacity * row)


@dataclass
class _RankPlan:
    """The parts of a plan one rank's forward and backward read, as tensors on its device."""

    cp_size: int
    capacity: int
    local_rows: int
    key_rows: "torch.Tensor"
    cu_q: "torch.Tensor"
    cu_k: "torch.Tensor"
    max_q: int
    max_k: int


def _rank_plan(plan: wlb.ShardPlan, rank: int, device) -> _RankPlan:
    r = plan[rank]
    return _RankPlan(cp_size=plan.cp_size, capacity=plan.rank_capacity, local_rows=r.tokens,
                     key_rows=torch.from_numpy(r.key_rows).to(device),
                     cu_q=torch.from_numpy(r.cu_seqlens_q).to(device),
                     cu_k=torch.from_numpy(r.cu_seqlens_k).to(device),
                     max_q=int(r.max_seqlen_q), max_k=int(r.max_seqlen_k))


class _GatherKeys(torch.autograd.Function if torch is not None else object):
    """Forward: all-gather padded K/V, select this rank's key rows. Backward: scatter-add the
    key gradients into the gathered layout and reduce-scatter them back to their owners."""

    @staticmethod
    def forward(ctx, k, v, rp: _RankPlan, group):
        h_kv = k.shape[1]
        kv = torch.cat([k, v], dim=1)
        padded = kv.new_zeros((rp.capacity,) + tuple(kv.shape[1:]))
        padded[: rp.local_rows] = kv
        gathered = kv.new_empty((rp.cp_size * rp.capacity,) + tuple(kv.shape[1:]))
        dist.all_gather_into_tensor(gathered, padded, group=group)
        keys = gathered.index_select(0, rp.key_rows)
        ctx.rp, ctx.group, ctx.h_kv = rp, group, h_kv
        ctx.shape = tuple(gathered.shape)
        return keys[:, :h_kv].contiguous(), keys[:, h_kv:].contiguous()

    @staticmethod
    def backward(ctx, d_keys_k, d_keys_v):
        rp = ctx.rp
        d_keys = torch.cat([d_keys_k, d_keys_v], dim=1)
        full = d_keys.new_zeros(ctx.shape)
        full.index_add_(0, rp.key_rows, d_keys)
        mine = d_keys.new_empty((rp.capacity,) + ctx.shape[1:])
        dist.reduce_scatter_tensor(mine, full, op=dist.ReduceOp.SUM, group=ctx.group)
        mine = mine[: rp.local_rows]
        return mine[:, : ctx.h_kv], mine[:, ctx.h_kv:], None, None


def _check_inputs(q, k, v, plan, rank: int) -> Optional[str]:
    """Why this rank's tensors do not fit the plan, or None."""
    r = plan[rank]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.dim() != 3:
            return f"{name} must be (tokens, heads, head_dim), got shape {tuple(t.shape)}"
        if t.shape[0] != r.tokens:
            return (f"{name} has {t.shape[0]} rows but the plan gives rank {rank} {r.tokens} "
                    f"tokens (plan[rank].token_indices)")
        if not t.is_floating_point():
            return f"{name} must be a floating-point tensor, got {t.dtype}"
    if k.shape != v.shape:
        return f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
    if q.shape[2] != k.shape[2]:
        return f"q and k must have the same head_dim, got {q.shape[2]} and {k.shape[2]}"
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        return (f"q's {q.shape[1]} heads must be a multiple of k/v's {k.shape[1]} heads "
                f"(grouped-query attention)")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        return f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.device != k.device or q.device != v.device:
        return f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}"
    return None


def cp_attention(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", plan: wlb.ShardPlan,
                 group: Any = None, *, scale: Optional[float] = None,
                 backend: Optional[str] = None, agree_on_errors: bool = True,
                 timings: Optional[Dict[str, float]] = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """This rank's attention output (T_q, H_q, D) and log-sum-exp (H_q, T_q) under ``plan``.

    ``group``: the CP process group (None: the default group); its size must be
    ``plan.cp_size`` and this process's rank in it selects ``plan[rank]``. ``backend``: None picks
    by device and dtype (``wlb.torch.attention.select_backend``), or "math" / "varlen".
    ``timings``: if a dict, the forward's wall seconds are added to its "gather_s" (all-gather and
    key selection) and "attention_s" (this rank's varlen attention) keys (CUDA is synchronised
    for it). Differentiable in q, k, v.
    """
    require_torch()
    if not isinstance(plan, wlb.ShardPlan):
        raise TypeError(f"plan must be a wlb.ShardPlan, got {type(plan).__name__}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("cp_attention needs an initialised torch.distributed process group")
    world = dist.get_world_size(group)
    if world != plan.cp_size:
        raise ValueError(f"the plan is for cp_size {plan.cp_size} but the process group has "
                         f"{world} ranks")
    rank = dist.get_rank(group)
    problem = _check_inputs(q, k, v, plan, rank)
    if problem is None:
        try:
            chosen = select_backend(q.device, q.dtype, backend)
        except ValueError as e:
            problem = str(e)
    if agree_on_errors:
        flag = torch.tensor([0 if problem is None else 1], dtype=torch.int32,
                            device=q.device if isinstance(q, torch.Tensor) else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if problem is None and int(flag.item()) != 0:
            problem = "another CP rank rejected its inputs (see its error)"
    if problem is not None:
        raise ValueError(f"cp_attention on rank {rank}: {problem}")
    rp = _rank_plan(plan, rank, q.device)
    clock = _Clock(timings, q.device)
    k_keys, v_keys = _GatherKeys.apply(k, v, rp, group)
    clock.lap("gather_s")
    out, lse = varlen_causal_attention(q, k_keys, v_keys, rp.cu_q, rp.cu_k, rp.max_q, rp.max_k,
                                       scale=scale, backend=chosen)
    clock.lap("attention_s")
    return out, lse


class _Clock:
    """Adds wall seconds between laps to a dict (nothing when the dict is None)."""

    def __init__(self, timings: Optional[Dict[str, float]], device):
        self.timings, self.cuda = timings, torch.device(device).type == "cuda"
        self.last = self._now() if timings is not None else 0.0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, key: str) -> None:
        if self.timings is None:
            return
        now = self._now()
        self.timings[key] = self.timings.get(key, 0.0) + now - self.last
        self.last = now


class CPAttention(torch.nn.Module if torch is not None else object):
    """``cp_attention`` as a module over a fixed plan (one per micro-batch; build it per step)."""

    def __init__(self, plan: wlb.ShardPlan, group: Any = None, *, scale: Optional[float] = None,
                 backend: Optional[str] = None, agree_on_errors: bool = True):
        require_torch()
        super().__init__()
        self.plan, self.group, self.scale = plan, group, scale
        self.backend, self.agree_on_errors = backend, agree_on_errors

    def forward(self, q, k, v):
        out, _ = cp_attention(q, k, v, self.plan, self.group, scale=self.scale,
                              backend=self.backend, agree_on_errors=self.agree_on_errors)
        return out

    def comm_volume(self, kv_heads: int, head_dim: int, element_size: int) -> CommVolume:
        return comm_volume(self.plan, kv_heads, head_dim, element_size)

    def extra_repr(self) -> str:
        return f"strategy={self.plan.strategy}, cp_size={self.plan.cp_size}"


def describe_backend(device, dtype, backend: Optional[str] = None) -> Dict[str, str]:
    """Which attention backend ``cp_attention`` would use, for logs and reports."""
    return {"backend": select_backend(device, dtype, backend), "device": str(device),
            "dtype": str(dtype)}
