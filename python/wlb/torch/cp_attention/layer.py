"""``cp_attention`` and its module ``CPAttention``: the agreement, this rank's plan, then the
overlapped or the sequential path; the clock that records their laps."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

import wlb

from .._common import require_torch, torch
from ..attention import check_scale, default_scale, select_backend, varlen_causal_attention
from .agreement import _agree, _check_inputs
from .autograd import _GatherKeys, _OverlappedAttention
from .kernels import _overlap_parts
from .rank_plan import CommVolume, _rank_plan, _RankPlan, comm_volume

if torch is not None:
    import torch.distributed as dist


def cp_attention(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", plan: wlb.ShardPlan,
                 group: Any = None, *, scale: Optional[float] = None,
                 backend: Optional[str] = None, agree_on_errors: bool = True,
                 timings: Optional[Dict[str, float]] = None,
                 _rank_plans: Optional[Dict[Any, _RankPlan]] = None,
                 overlap: Optional[bool] = None, _problem: Optional[str] = None
                 ) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """This rank's attention output (T_q, H_q, D) and log-sum-exp (H_q, T_q) under ``plan``.

    ``group``: the CP process group (None: the default group); its size must be
    ``plan.cp_size`` and this process's rank in it selects ``plan[rank]``. ``backend``: None picks
    by device and dtype (``wlb.torch.attention.select_backend``), or "math" / "varlen".
    The mask is ``plan.mask`` (see the package's docstring); a plan whose layer mix has several
    masks must be narrowed with ``plan.for_mask(mask)`` first. ``backend="varlen"`` applies a
    sliding window through ``varlen_attn``'s ``window_size`` (torch 2.11 on); chunked masks run on
    every backend.
    ``timings``: if a dict, the forward's wall seconds are added to its "gather_s" (K/V exchange and
    key selection) and "attention_s" (this rank's varlen attention) keys (CUDA is synchronised
    for it). Differentiable in q, k, v. ``_rank_plans``: CPAttention's cache of this rank's index
    tensors and exchange (and the plan's digest), so that calling it for every layer builds them
    once. ``_problem``: a check of the caller's that failed on this rank (wlb.torch.hf's): it
    joins the agreement, so every rank raises it.
    ``overlap``: run attention over the keys this rank holds while the exchange (row-exact or
    all-gather) is in flight and merge the fetched keys' part by log-sum-exp, backward likewise
    (None: on the "math" backend, under every mask and exchange; True: also on "varlen" under
    causal and chunked masks, through FlashAttention's varlen forward and backward ops, which
    has not yet run on a GPU (CPU tests drive it through fakes of the ops); the sequential path
    elsewhere; False: always the sequential path; results equal to rounding). Its forward laps
    in ``timings``: "local_attention_s", "exchange_wait_s", "remote_attention_s" (and their sums
    in "attention_s" and "gather_s", the exchange time not hidden); its backward laps:
    "backward_remote_s" (the fetched keys' gradients), "backward_local_s" (the own keys' part
    while those travel back), "backward_wait_s" (the gradients' exchange left after it). The
    sequential path's backward adds "backward_exchange_s" (the gradients' exchange, blocking).
    """
    require_torch()
    if group is None and (not dist.is_available() or not dist.is_initialized()):
        # No process group: one rank, nothing to exchange or agree on (cp_size 1 only).
        if not isinstance(plan, wlb.ShardPlan):
            raise TypeError(f"plan must be a wlb.ShardPlan, got {type(plan).__name__}")
        if plan.mask is None:
            raise ValueError(f"cp_attention: the plan's layer mix {plan.layer_mix} has several "
                             f"masks; pass plan.for_mask(mask) for this layer's")
        if plan.cp_size != 1:
            raise RuntimeError(f"cp_attention needs an initialised torch.distributed process "
                               f"group for a plan of cp_size {plan.cp_size} (cp_size 1 runs "
                               f"without one)")
        return _one_rank(q, k, v, plan, scale, backend, timings)
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("cp_attention: this process is not a member of the given group")
    chosen, scale = _agree(q, k, v, plan, group, rank, scale, backend, agree_on_errors,
                           _rank_plans, _problem)
    row_bytes = 2 * k.shape[1] * k.shape[2] * k.element_size()  # K and V of one token
    if _rank_plans is None:
        rp = _rank_plan(plan, rank, q.device, row_bytes)
    else:
        key = (rank, str(q.device), row_bytes)
        if key not in _rank_plans:
            _rank_plans[key] = _rank_plan(plan, rank, q.device, row_bytes)
        rp = _rank_plans[key]
    clock = _Clock(timings, q.device)
    parts = _overlap_parts(chosen, rp, overlap)
    if parts is not None:
        scale = default_scale(q.shape[-1]) if scale is None else float(scale)
        return _OverlappedAttention.apply(q, k, v, rp, group, scale, clock, parts)
    k_keys, v_keys = _GatherKeys.apply(k, v, rp, group, clock)
    clock.lap("gather_s")
    window = {"window": rp.window} if rp.window else {}  # causal calls stay as they were
    out, lse = varlen_causal_attention(q, k_keys, v_keys, rp.cu_q, rp.cu_k, rp.max_q, rp.max_k,
                                       scale=scale, backend=chosen, **window)
    clock.lap("attention_s")
    return out, lse


def _one_rank(q, k, v, plan: wlb.ShardPlan, scale, backend, timings):
    """cp_attention of a cp_size-1 plan in a process without a group: this rank's checks, then
    its kernel segments over its own rows (every key row is one of them)."""
    problem = _check_inputs(q, k, v, plan, 0)
    if problem is not None:
        raise (TypeError if "must be a torch.Tensor" in problem else ValueError)(
            f"cp_attention: {problem}")
    scale = check_scale(scale)
    window = int(plan.kernel_window)
    chosen = select_backend(q.device, q.dtype, backend, window)
    r = plan[0]
    clock = _Clock(timings, q.device)
    rows = torch.from_numpy(np.asarray(r.key_rows, dtype=np.int64)).to(q.device)
    k_keys, v_keys = k.index_select(0, rows), v.index_select(0, rows)
    clock.lap("gather_s")
    out, lse = varlen_causal_attention(
        q, k_keys, v_keys, torch.from_numpy(r.cu_seqlens_q).to(q.device),
        torch.from_numpy(r.cu_seqlens_k).to(q.device), int(r.max_seqlen_q), int(r.max_seqlen_k),
        scale=scale, backend=chosen, **({"window": window} if window else {}))
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

    def restart(self) -> None:
        """Starts the next lap now (backward's first lap starts when backward does)."""
        if self.timings is not None:
            self.last = self._now()

    def lap(self, key: str) -> float:
        """Adds the seconds since the last lap to ``key`` and returns them (0 without a dict)."""
        if self.timings is None:
            return 0.0
        now = self._now()
        seconds = now - self.last
        self.add(key, seconds)
        self.last = now
        return seconds

    def add(self, key: str, seconds: float) -> None:
        if self.timings is not None:
            self.timings[key] = self.timings.get(key, 0.0) + seconds


class CPAttention(torch.nn.Module if torch is not None else object):
    """``cp_attention`` as a module over a fixed plan (one per micro-batch; build it per step),
    under ``plan.mask`` (one layer's: ``CPAttention(plan.for_mask("window:4096"))``)."""

    def __init__(self, plan: wlb.ShardPlan, group: Any = None, *, scale: Optional[float] = None,
                 backend: Optional[str] = None, agree_on_errors: bool = True):
        require_torch()
        super().__init__()
        self.plan, self.group, self.scale = plan, group, check_scale(scale)
        self.backend, self.agree_on_errors = backend, agree_on_errors
        # This rank's index tensors and exchange, per (rank, device): built at the first forward,
        # reused by every later one (one module serves every layer of a micro-batch).
        self._rank_plans: Dict[Any, _RankPlan] = {}

    def forward(self, q, k, v, _problem: Optional[str] = None):
        out, _ = cp_attention(q, k, v, self.plan, self.group, scale=self.scale,
                              backend=self.backend, agree_on_errors=self.agree_on_errors,
                              _rank_plans=self._rank_plans, _problem=_problem)
        return out

    def comm_volume(self, kv_heads: int, head_dim: int, element_size: int,
                    rank: Optional[int] = None) -> CommVolume:
        return comm_volume(self.plan, kv_heads, head_dim, element_size, rank)

    def extra_repr(self) -> str:
        return (f"strategy={self.plan.strategy}, cp_size={self.plan.cp_size}, "
                f"mask={self.plan.mask}")


def describe_backend(device, dtype, backend: Optional[str] = None,
                     window: int = 0) -> Dict[str, str]:
    """Which attention backend ``cp_attention`` would use, for logs and reports."""
    return {"backend": select_backend(device, dtype, backend, window), "device": str(device),
            "dtype": str(dtype)}
