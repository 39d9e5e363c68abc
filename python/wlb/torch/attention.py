"""Varlen causal attention on one rank's segments: the backends ``wlb.torch.cp_attention`` runs.

A segment i of a rank holds queries ``[cu_q[i], cu_q[i+1])`` and keys ``[cu_k[i], cu_k[i+1])``;
the queries are the last ``n_q`` positions of the key range (bottom-right causal: query j of the
segment sees keys ``0 .. n_k - n_q + j``), which is what a CP shard of a document needs (its keys
are the document's prefix up to the shard's end).

Backends (one interface: ``backend(q, k, v, cu_q, cu_k, max_q, max_k, scale) -> (out, lse)``,
differentiable in q, k, v; ``lse`` is the natural-log log-sum-exp, shape ``(H_q, T_q)``, float32
or the input's dtype when that is float64, and carries no gradient):

- ``"varlen"``: PyTorch's ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention / cuDNN
  kernels; CUDA, float16 / bfloat16). Not yet run on a GPU by wlb's tests (no GPU here).
- ``"math"``: explicit softmax attention per segment, in blocks of query rows, with its own
  backward (the FlashAttention recurrences over the saved lse); any device and float dtype,
  float64 included. The reference the CPU tests hold the CP path to.

``select_backend(device, dtype)`` picks ``"varlen"`` on CUDA for half types when PyTorch has it,
otherwise ``"math"``.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

from ._common import require_torch, torch

# Query rows per block in the math path: bounds its score buffer to block x keys x heads.
_MATH_BLOCK_ROWS = 512


def _segments(cu_q: "torch.Tensor", cu_k: "torch.Tensor"):
    cq = cu_q.tolist()
    ck = cu_k.tolist()
    for i in range(len(cq) - 1):
        yield cq[i], cq[i + 1], ck[i], ck[i + 1]


def _blocks(q0: int, q1: int, k0: int, k1: int):
    """Query blocks of one segment with the key prefix each needs (bottom-right causal)."""
    n_q, n_k = q1 - q0, k1 - k0
    for a in range(0, n_q, _MATH_BLOCK_ROWS):
        b = min(a + _MATH_BLOCK_ROWS, n_q)
        # Query row a + t sees keys [0, n_k - n_q + a + t]; the block needs keys [0, n_k - n_q + b).
        yield q0 + a, q0 + b, k0, k0 + n_k - n_q + b, n_k - n_q + a


def _block_scores(qb, kb, scale, first_key_limit):
    """Masked scores (H_kv, group, rows, keys) of a query block against its key prefix."""
    rows, h_q, d = qb.shape
    h_kv = kb.shape[1]
    qh = qb.reshape(rows, h_kv, h_q // h_kv, d)
    scores = torch.einsum("nhgd,mhd->hgnm", qh, kb) * scale
    keys = kb.shape[0]
    limit = first_key_limit + torch.arange(rows, device=qb.device)  # last key each row sees
    masked = torch.arange(keys, device=qb.device)[None, :] > limit[:, None]
    return qh, scores.masked_fill(masked, float("-inf"))


class _MathAttention(torch.autograd.Function if torch is not None else object):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, scale):
        t_q, h_q, d = q.shape
        h_kv = k.shape[1]
        out = torch.zeros_like(q)
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        lse = torch.zeros(h_q, t_q, dtype=lse_dtype, device=q.device)
        for q0, q1, k0, k1 in _segments(cu_q, cu_k):
            for a, b, ka, kb_end, limit in _blocks(q0, q1, k0, k1):
                _, s = _block_scores(q[a:b], k[ka:kb_end], scale, limit)
                block_lse = torch.logsumexp(s.to(lse_dtype), dim=-1)  # (h_kv, g, rows)
                p = torch.exp(s.to(lse_dtype) - block_lse[..., None]).to(q.dtype)
                o = torch.einsum("hgnm,mhd->nhgd", p, v[ka:kb_end])
                out[a:b] = o.reshape(b - a, h_q, d)
                lse[:, a:b] = block_lse.reshape(h_q, b - a)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.scale = scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        scale = ctx.scale
        h_q, d = q.shape[1], q.shape[2]
        h_kv = k.shape[1]
        g = h_q // h_kv
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for q0, q1, k0, k1 in _segments(cu_q, cu_k):
            for a, b, ka, kb_end, limit in _blocks(q0, q1, k0, k1):
                rows = b - a
                qh, s = _block_scores(q[a:b], k[ka:kb_end], scale, limit)
                block_lse = lse[:, a:b].reshape(h_kv, g, rows)
                p = torch.exp(s.to(block_lse.dtype) - block_lse[..., None]).to(q.dtype)
                do = d_out[a:b].reshape(rows, h_kv, g, d)
                o = out[a:b].reshape(rows, h_kv, g, d)
                dv[ka:kb_end] += torch.einsum("hgnm,nhgd->mhd", p, do)
                dp = torch.einsum("nhgd,mhd->hgnm", do, v[ka:kb_end])
                delta = (do * o).sum(-1).permute(1, 2, 0)  # (h_kv, g, rows)
                ds = p * (dp - delta[..., None])
                dq[a:b] = (torch.einsum("hgnm,mhd->nhgd", ds, k[ka:kb_end]) * scale).reshape(
                    rows, h_q, d)
                dk[ka:kb_end] += torch.einsum("hgnm,nhgd->mhd", ds, qh) * scale
        return dq, dk, dv, None, None, None


def math_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale):
    """The ``"math"`` backend (see the module's docstring)."""
    del max_q, max_k  # the segments carry their own lengths
    return _MathAttention.apply(q, k, v, cu_q, cu_k, scale)


def varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale):
    """The ``"varlen"`` backend: PyTorch's varlen_attn, bottom-right causal (window (-1, 0))."""
    from torch.nn.attention.varlen import AuxRequest, varlen_attn

    out, lse = varlen_attn(q, k, v, cu_q, cu_k, max(int(max_q), 1), max(int(max_k), 1),
                           return_aux=AuxRequest(lse=True), scale=scale, window_size=(-1, 0),
                           enable_gqa=q.shape[1] != k.shape[1])
    return out, lse.detach()


BACKENDS: Dict[str, Callable] = {"math": math_attention, "varlen": varlen_attention}


def has_varlen() -> bool:
    """Whether this PyTorch has ``torch.nn.attention.varlen.varlen_attn``."""
    require_torch()
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def select_backend(device: "torch.device", dtype: "torch.dtype",
                   requested: Optional[str] = None) -> str:
    """The backend for tensors on ``device`` of ``dtype``: ``requested`` if given (checked),
    else ``"varlen"`` on CUDA for float16/bfloat16 when available, else ``"math"``."""
    require_torch()
    if requested is not None:
        if requested not in BACKENDS:
            raise ValueError(f"unknown attention backend {requested!r}; expected one of "
                             f"{sorted(BACKENDS)}")
        if requested == "varlen" and (torch.device(device).type != "cuda" or not has_varlen()):
            raise ValueError(f"attention backend 'varlen' needs CUDA tensors and "
                             f"torch.nn.attention.varlen (device {device}, torch "
                             f"{torch.__version__})")
        return requested
    if (torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and has_varlen()):
        return "varlen"
    return "math"


def default_scale(head_dim: int) -> float:
    """Softmax scale 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


def varlen_causal_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                            max_seqlen_k: int, scale: Optional[float] = None,
                            backend: Optional[str] = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Bottom-right causal varlen attention over segments; returns ``(out, lse)``.

    q: (T_q, H_q, D); k, v: (T_k, H_kv, D) with H_q a multiple of H_kv; cu_seqlens int32.
    """
    require_torch()
    name = select_backend(q.device, q.dtype, backend)
    scale = default_scale(q.shape[-1]) if scale is None else float(scale)
    return BACKENDS[name](q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale)
