"""The overlapped path's attention parts (the own keys, the fetched keys) on each backend, and
which of them a call runs."""

from __future__ import annotations

from typing import Optional

from .._common import torch
from ..attention import math_backward, math_forward
from .rank_plan import _RankPlan


class _MathParts:
    """The overlapped path's two attention parts on the "math" backend (any device and float
    dtype): forward -> (out, lse, state), backward from the merged out and lse -> (dq, dk, dv).
    The own keys: bottom-right causal, or positioned (key_offset) under a window; the fetched
    keys: unmasked, or positioned under a window."""

    @staticmethod
    def local_forward(q, k, v, rp: _RankPlan, scale):
        out, lse = math_forward(q, k, v, rp.cu_q, rp.cu_k_local, scale, window=rp.window,
                                key_offset=rp.local_key_offset)
        return out, lse, None

    @staticmethod
    def local_backward(q, k, v, out, lse, d_out, rp: _RankPlan, scale, state):
        return math_backward(q, k, v, out, lse, d_out, rp.cu_q, rp.cu_k_local, scale,
                             window=rp.window, key_offset=rp.local_key_offset)

    @staticmethod
    def remote_forward(q, k, v, rp: _RankPlan, scale):
        if rp.window:
            out, lse = math_forward(q, k, v, rp.cu_q_remote, rp.cu_k_remote, scale,
                                    window=rp.window, key_offset=rp.remote_key_offset)
        else:
            out, lse = math_forward(q, k, v, rp.cu_q_remote, rp.cu_k_remote, scale, causal=False)
        return out, lse, None

    @staticmethod
    def remote_backward(q, k, v, out, lse, d_out, rp: _RankPlan, scale, state):
        if rp.window:
            return math_backward(q, k, v, out, lse, d_out, rp.cu_q_remote, rp.cu_k_remote, scale,
                                 window=rp.window, key_offset=rp.remote_key_offset)
        return math_backward(q, k, v, out, lse, d_out, rp.cu_q_remote, rp.cu_k_remote, scale,
                             causal=False)


def _flash_ops():
    """PyTorch's FlashAttention varlen forward and backward (the ops varlen_attn calls)."""
    return torch.ops.aten._flash_attention_forward, torch.ops.aten._flash_attention_backward


class _VarlenParts:
    """The two parts on FlashAttention's varlen kernels (CUDA, float16 / bfloat16; causal and
    chunked masks only: a window's positioned keys have no FlashAttention form). The forward op
    returns the LSE as (H_q, T_q) float32 (varlen_attn's layout); its backward takes any out and
    lse, so each part's gradients come from the merged ones. GQA is the kernels' own (K/V heads
    dividing the query heads). NOT YET RUN ON A GPU: the CPU tests drive this class through
    math-backed fakes of the two ops (the plumbing), not the kernels' conventions."""

    @staticmethod
    def _forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        forward, _ = _flash_ops()
        out, lse, rng_state, _, _ = forward(q, k, v, cu_q, cu_k, max(max_q, 1), max(max_k, 1),
                                            0.0, causal, False, scale=scale)
        return out, lse, rng_state

    @staticmethod
    def _backward(q, k, v, out, lse, d_out, cu_q, cu_k, max_q, max_k, scale, causal, rng_state):
        _, backward = _flash_ops()
        return backward(d_out.contiguous(), q, k, v, out.contiguous(), lse.contiguous(), cu_q,
                        cu_k, max(max_q, 1), max(max_k, 1), 0.0, causal, rng_state,
                        torch.empty(0, device=q.device), scale=scale)

    @staticmethod
    def local_forward(q, k, v, rp: _RankPlan, scale):
        return _VarlenParts._forward(q, k, v, rp.cu_q, rp.cu_k_local, rp.max_q, rp.max_k_local,
                                     scale, True)

    @staticmethod
    def local_backward(q, k, v, out, lse, d_out, rp: _RankPlan, scale, state):
        return _VarlenParts._backward(q, k, v, out, lse, d_out, rp.cu_q, rp.cu_k_local, rp.max_q,
                                      rp.max_k_local, scale, True, state)

    @staticmethod
    def remote_forward(q, k, v, rp: _RankPlan, scale):
        return _VarlenParts._forward(q, k, v, rp.cu_q_remote, rp.cu_k_remote, rp.max_q_remote,
                                     rp.max_k_remote, scale, False)

    @staticmethod
    def remote_backward(q, k, v, out, lse, d_out, rp: _RankPlan, scale, state):
        return _VarlenParts._backward(q, k, v, out, lse, d_out, rp.cu_q_remote, rp.cu_k_remote,
                                      rp.max_q_remote, rp.max_k_remote, scale, False, state)


def _overlap_parts(chosen: str, rp: _RankPlan, overlap: Optional[bool]):
    """The part kernels of the overlapped path for this call, or None for the sequential path:
    "math" unless overlap is False; "varlen" only when asked for (overlap=True: not yet run on
    a GPU) and without a window."""
    if overlap is False or rp.local_key_rows is None:
        return None
    if chosen == "math":
        return _MathParts
    if chosen == "varlen" and overlap is True and not rp.window:
        return _VarlenParts
    return None
