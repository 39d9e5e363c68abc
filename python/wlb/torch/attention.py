"""Varlen causal attention on one rank's segments: the backends ``wlb.torch.cp_attention`` runs.

A segment i of a rank holds queries ``[cu_q[i], cu_q[i+1])`` and keys ``[cu_k[i], cu_k[i+1])``;
the queries are the last ``n_q`` positions of the key range (bottom-right causal: query j of the
segment sees keys ``0 .. n_k - n_q + j``), which is what a CP shard of a document needs (its keys
are the document's prefix up to the shard's end). With ``window`` w > 0 query j sees only the last
w of those, keys ``max(0, n_k - n_q + j - w + 1) .. n_k - n_q + j`` (FlashAttention's
``window_size=(w - 1, 0)``): a sliding-window mask over segments whose keys start where the
window of their first query does (``ShardPlan.kernel_window``; a chunked-local mask needs no
window, its kernel segments end at chunk boundaries).

Backends (one interface: ``backend(q, k, v, cu_q, cu_k, max_q, max_k, scale) -> (out, lse)``,
and ``window=w`` as a keyword when w > 0; differentiable in q, k, v; ``lse`` is the natural-log
log-sum-exp, shape ``(H_q, T_q)``, float32 or the input's dtype when that is float64, and carries
no gradient):

- ``"varlen"``: PyTorch's ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention / cuDNN
  kernels; CUDA, float16 / bfloat16), on each of its signatures (torch 2.10's ``is_causal``,
  2.11's ``window_size`` / ``scale``, later ``enable_gqa``; see ``varlen_attention``). A sliding
  window needs ``window_size`` (torch 2.11 on); on 2.10 it is refused. wlb's tests hold it to
  ``"math"`` through CPU fakes of those signatures, not on a GPU.
- ``"math"``: explicit softmax attention per segment, in blocks of query rows, with its own
  backward (the FlashAttention recurrences over the saved lse); any device and float dtype,
  float64 included. The reference the CPU tests hold the CP path to.

``select_backend(device, dtype, window=w)`` picks ``"varlen"`` on CUDA for half types when
PyTorch has it (and, for a window, its ``window_size``), otherwise ``"math"``.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import math
from typing import Any, Callable, Dict, Optional, Tuple

from .._checks import describe, is_real
from ._common import require_torch, torch

# Query rows per block in the math path: bounds its score buffer to block x keys x heads.
_MATH_BLOCK_ROWS = 512


def _segments(cu_q: "torch.Tensor", cu_k: "torch.Tensor"):
    cq = cu_q.tolist()
    ck = cu_k.tolist()
    for i in range(len(cq) - 1):
        yield cq[i], cq[i + 1], ck[i], ck[i + 1]


def _blocks(q0: int, q1: int, k0: int, k1: int, window: int, causal: bool = True):
    """Query blocks of one segment with the key range each needs (bottom-right causal, the last
    ``window`` keys per row when ``window`` > 0; every key of the segment when not ``causal``)."""
    n_q, n_k = q1 - q0, k1 - k0
    for a in range(0, n_q, _MATH_BLOCK_ROWS):
        b = min(a + _MATH_BLOCK_ROWS, n_q)
        if not causal:  # row t's limit n_k + t lies past every key: none is masked
            yield q0 + a, q0 + b, k0, k1, n_k
            continue
        # Query row a + t sees keys [lo(a + t), n_k - n_q + a + t]; the block needs keys
        # [lo(a), n_k - n_q + b), lo(row) = 0 or, under a window, max(0, last key - window + 1).
        last = n_k - n_q + a
        lo = max(0, last - window + 1) if window > 0 else 0
        yield q0 + a, q0 + b, k0 + lo, k0 + n_k - n_q + b, last - lo


def _offset_blocks(q0: int, q1: int, k0: int, k1: int, offsets, window: int):
    """Query blocks of one segment whose keys carry explicit positions ``offsets`` (a list,
    ascending, relative to the segment's first query: query row t sees the keys of offset <= t,
    and > t - window when ``window`` > 0), with the key range each block needs and its first
    row's position (what the block's key positions are taken relative to)."""
    for a in range(0, q1 - q0, _MATH_BLOCK_ROWS):
        b = min(a + _MATH_BLOCK_ROWS, q1 - q0)
        lo = bisect.bisect_left(offsets, a - window + 1, k0, k1) if window > 0 else k0
        hi = bisect.bisect_right(offsets, b - 1, lo, k1)
        if hi > lo:
            yield q0 + a, q0 + b, lo, hi, a


def _block_scores(qb, kb, scale, first_key_limit, window, key=None):
    """Masked scores (H_kv, group, rows, keys) of a query block against its key range; row t sees
    keys up to first_key_limit + t, and only the last ``window`` of them when ``window`` > 0.
    ``key``: the keys' positions (default 0, 1, ...) in the frame of first_key_limit."""
    rows, h_q, d = qb.shape
    h_kv = kb.shape[1]
    qh = qb.reshape(rows, h_kv, h_q // h_kv, d)
    scores = torch.einsum("nhgd,mhd->hgnm", qh, kb) * scale
    keys = kb.shape[0]
    limit = first_key_limit + torch.arange(rows, device=qb.device)  # last key each row sees
    if key is None:
        key = torch.arange(keys, device=qb.device)
    key = key[None, :]
    masked = key > limit[:, None]
    if window > 0:
        masked |= key <= limit[:, None] - window
    return qh, scores.masked_fill(masked, float("-inf"))


def _key_blocks(cu_q, cu_k, window, causal, key_offset):
    """Every (query rows a:b, key rows ka:kb, first row's key limit, key positions or None) block
    of the segments: _blocks, or _offset_blocks where the keys carry explicit positions."""
    offsets = None if key_offset is None else key_offset.tolist()
    for q0, q1, k0, k1 in _segments(cu_q, cu_k):
        if k1 == k0:
            continue
        if offsets is None:
            for a, b, ka, kb_end, limit in _blocks(q0, q1, k0, k1, window, causal):
                yield a, b, ka, kb_end, limit, None
        else:
            for a, b, ka, kb_end, first in _offset_blocks(q0, q1, k0, k1, offsets, window):
                yield a, b, ka, kb_end, 0, key_offset[ka:kb_end] - first


def math_forward(q, k, v, cu_q, cu_k, scale, window=0, causal=True, key_offset=None):
    """The math backend's forward without autograd: ``(out, lse)`` of bottom-right causal (or,
    ``causal=False``, unmasked) attention per segment. ``key_offset`` (int64, one per key): the
    keys' positions relative to their segment's first query instead of bottom-right alignment
    (query row t of a segment sees the keys of offset <= t, the last ``window`` positions of them
    when ``window`` > 0; each segment's offsets ascending): a segment's keys need not be
    contiguous, e.g. the part of a split key set a rank holds. A query row that sees no key (a
    segment without keys) gets out 0 and lse -inf."""
    t_q, h_q, d = q.shape
    out = torch.zeros_like(q)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.full((h_q, t_q), float("-inf"), dtype=lse_dtype, device=q.device)
    for a, b, ka, kb_end, limit, key in _key_blocks(cu_q, cu_k, window, causal, key_offset):
        _, s = _block_scores(q[a:b], k[ka:kb_end], scale, limit, window, key)
        block_lse = torch.logsumexp(s.to(lse_dtype), dim=-1)  # (h_kv, g, rows)
        p = torch.exp(s.to(lse_dtype) - block_lse[..., None]).to(q.dtype)
        o = torch.einsum("hgnm,mhd->nhgd", p, v[ka:kb_end])
        out[a:b] = o.reshape(b - a, h_q, d)
        lse[:, a:b] = block_lse.reshape(h_q, b - a)
    return out, lse


def math_backward(q, k, v, out, lse, d_out, cu_q, cu_k, scale, window=0, causal=True,
                  key_offset=None):
    """dq, dk, dv of ``math_forward``'s attention given the output gradient, from the FlashAttention
    recurrences over ``out`` and ``lse``. When this is one part of an attention whose keys were
    split (merged by log-sum-exp), pass the merged out and lse: the result is this part's share of
    the gradients (dq summed over the parts is the whole dq)."""
    h_q, d = q.shape[1], q.shape[2]
    h_kv = k.shape[1]
    g = h_q // h_kv
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for a, b, ka, kb_end, limit, key in _key_blocks(cu_q, cu_k, window, causal, key_offset):
        rows = b - a
        qh, s = _block_scores(q[a:b], k[ka:kb_end], scale, limit, window, key)
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
    return dq, dk, dv


class _MathAttention(torch.autograd.Function if torch is not None else object):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, scale, window):
        out, lse = math_forward(q, k, v, cu_q, cu_k, scale, window)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.scale, ctx.window = scale, window
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = math_backward(q, k, v, out, lse, d_out, cu_q, cu_k, ctx.scale, ctx.window)
        return dq, dk, dv, None, None, None, None


def math_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale, window=0):
    """The ``"math"`` backend (see the module's docstring)."""
    del max_q, max_k  # the segments carry their own lengths
    return _MathAttention.apply(q, k, v, cu_q, cu_k, scale, int(window))


@functools.lru_cache(maxsize=8)
def _varlen_params(fn: Callable) -> frozenset:
    """Names of the keyword parameters ``fn`` (a ``varlen_attn``) accepts; cached per function."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as exc:  # pragma: no cover - a C builtin, say
        raise RuntimeError(f"cannot read the signature of torch.nn.attention.varlen.varlen_attn "
                           f"(torch {torch.__version__}): {exc}") from exc
    return frozenset(p.name for p in params
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


# Bottom-right causal on every varlen_attn signature wlb knows:
#   torch 2.10:   varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None)
#   torch 2.11:   ... *, return_aux=None, scale=None, window_size=(-1, -1)
#   later:        ... *, return_aux=None, scale=None, window_size=(-1, -1), enable_gqa=False, ...
# window_size=(-1, 0) is bottom-right causal (varlen_attn's docstring: "(-1, 0) for causal
# attention"; it sets is_causal = window_size == (-1, 0), a tuple comparison, so a list would not
# do). Where only is_causal exists (2.10), it is bottom-right too: 2.10's varlen_attn passes
# is_causal to torch.ops.aten._flash_attention_forward (its _should_use_cudnn returns False, so
# the cuDNN path is never taken), i.e. to PyTorch's vendored FlashAttention-2 mha_varlen_fwd,
# which turns is_causal into window_size_right = 0 (flash_api.cpp: "if (is_causal) {
# window_size_right = 0; }"), and whose mask (flash_attn/mask.h, built from each segment's own
# actual_seqlen_q / actual_seqlen_k in block_info.h) keeps key col of query row i iff
# col < i + 1 + len_k - len_q + window_size_right: query i sees keys [0, len_k - len_q + i],
# exactly the alignment wlb needs. This is FlashAttention's documented convention since
# flash-attn 2.1 (README: "If seqlen_q != seqlen_k and causal=True, the causal mask is aligned to
# the bottom right corner of the attention matrix"); mha_varlen_fwd's "max_seqlen_q == 1 =>
# is_causal = false" shortcut is only valid under that alignment.


def _torch_version() -> str:
    return getattr(torch, "__version__", "unknown")


def varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale, window=0):
    """The ``"varlen"`` backend: PyTorch's varlen_attn, bottom-right causal.

    Adapts to the signature of the installed ``varlen_attn`` (see the comment above):
    causality through ``window_size=(-1, 0)`` or ``is_causal=True``; a sliding window w through
    ``window_size=(w - 1, 0)`` (FlashAttention: query i of a segment sees keys
    ``[i + n_k - n_q - (w - 1), i + n_k - n_q]``), refused where only ``is_causal`` exists;
    ``scale`` passed when
    accepted, else folded into q (``q * scale * sqrt(D)`` against the kernel's default
    ``1 / sqrt(D)``); GQA through ``enable_gqa=True`` when accepted, else K and V heads expanded
    with ``repeat_interleave`` (autograd sums their gradients back over each group).
    """
    from torch.nn.attention import varlen as _varlen

    fn = _varlen.varlen_attn
    accepted = _varlen_params(fn)
    aux_request = getattr(_varlen, "AuxRequest", None)
    if "return_aux" not in accepted or aux_request is None:
        raise RuntimeError(
            f"the 'varlen' attention backend needs the log-sum-exp from "
            f"torch.nn.attention.varlen.varlen_attn(return_aux=AuxRequest(lse=True)), which torch "
            f"{_torch_version()} does not offer; use backend='math' or another PyTorch")
    kwargs = {"return_aux": aux_request(lse=True)}

    if window > 0 and "window_size" not in accepted:
        raise RuntimeError(
            f"torch {_torch_version()}'s varlen_attn takes no window_size; the 'varlen' backend "
            f"cannot apply a sliding window of {window} keys; use backend='math' or another "
            f"PyTorch")
    if "window_size" in accepted:
        # A tuple: varlen_attn tests window_size == (-1, 0) for causal.
        kwargs["window_size"] = (int(window) - 1, 0) if window > 0 else (-1, 0)
    elif "is_causal" in accepted:
        kwargs["is_causal"] = True  # bottom-right in FlashAttention (see the comment above)
    else:
        raise RuntimeError(
            f"torch {_torch_version()}'s varlen_attn takes neither window_size nor is_causal; "
            f"the 'varlen' backend cannot ask it for causal attention; use backend='math'")

    head_dim = q.shape[-1]
    if "scale" in accepted:
        kwargs["scale"] = scale
    elif not math.isclose(scale, default_scale(head_dim), rel_tol=1e-12, abs_tol=0.0):
        # The kernel uses 1 / sqrt(D); scores are linear in q, so q * (scale * sqrt(D)) gives
        # scale * q.k exactly up to rounding (and the same lse). Differentiable in q.
        q = q * (scale * math.sqrt(head_dim))

    h_q, h_kv = q.shape[1], k.shape[1]
    if h_q != h_kv:
        if h_q % h_kv != 0:
            raise ValueError(f"query heads ({h_q}) must be a multiple of key/value heads ({h_kv})")
        if "enable_gqa" in accepted:
            kwargs["enable_gqa"] = True
        else:
            # Query head h reads kv head h // group (as in the math backend and enable_gqa).
            group = h_q // h_kv
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)

    out, lse = fn(q, k, v, cu_q, cu_k, max(int(max_q), 1), max(int(max_k), 1), **kwargs)
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


def _varlen_has_window() -> bool:
    from torch.nn.attention import varlen as _varlen

    return "window_size" in _varlen_params(_varlen.varlen_attn)


def select_backend(device: "torch.device", dtype: "torch.dtype",
                   requested: Optional[str] = None, window: int = 0) -> str:
    """The backend for tensors on ``device`` of ``dtype``: ``requested`` if given (checked),
    else ``"varlen"`` on CUDA for float16/bfloat16 when available (for a sliding ``window`` > 0,
    when its varlen_attn takes ``window_size``), else ``"math"``."""
    require_torch()
    if requested is not None:
        if requested not in BACKENDS:
            raise ValueError(f"unknown attention backend {requested!r}; expected one of "
                             f"{sorted(BACKENDS)}")
        if requested == "varlen" and (torch.device(device).type != "cuda" or not has_varlen()):
            raise ValueError(f"attention backend 'varlen' needs CUDA tensors and "
                             f"torch.nn.attention.varlen (device {device}, torch "
                             f"{torch.__version__})")
        if requested == "varlen" and window > 0 and not _varlen_has_window():
            raise ValueError(f"attention backend 'varlen' cannot apply a sliding window of "
                             f"{window} keys: torch {torch.__version__}'s varlen_attn takes no "
                             f"window_size; use backend='math'")
        return requested
    if (torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and has_varlen() and (window == 0 or _varlen_has_window())):
        return "varlen"
    return "math"


def default_scale(head_dim: int) -> float:
    """Softmax scale 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


def check_scale(scale: Any) -> Optional[float]:
    """``scale`` as a float (None stays None: the default 1 / sqrt(head_dim)); ValueError naming
    the value unless it is a finite real number > 0 (a bool is not a number here)."""
    if scale is None:
        return None
    try:
        value = float(scale) if is_real(scale) else math.nan
    except OverflowError:  # an int beyond the double range
        value = math.inf
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"scale must be a finite number > 0 or None, got {describe(scale)}")
    return value


def varlen_causal_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                            max_seqlen_k: int, scale: Optional[float] = None,
                            backend: Optional[str] = None,
                            window: int = 0) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Bottom-right causal varlen attention over segments; returns ``(out, lse)``.

    q: (T_q, H_q, D); k, v: (T_k, H_kv, D) with H_q a multiple of H_kv; cu_seqlens int32.
    ``window`` > 0: every query row sees only the last ``window`` keys up to its own.
    """
    require_torch()
    window = int(window)
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: no window), got {window}")
    name = select_backend(q.device, q.dtype, backend, window)
    scale = check_scale(scale)
    scale = default_scale(q.shape[-1]) if scale is None else scale
    extra = {"window": window} if window > 0 else {}
    return BACKENDS[name](q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                          **extra)
