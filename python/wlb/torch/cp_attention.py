"""Context-parallel attention that executes a ``wlb.plan_shards`` plan over ``torch.distributed``.

Every CP rank holds the rows ``plan[rank].token_indices`` of a packed micro-batch (``cp_slice``)
as q, k, v of shape (tokens, heads, head_dim), GQA allowed. ``cp_attention`` applies the plan's
attention mask, ``plan.mask`` (the ``layer_mix`` of ``wlb.plan_shards`` when it has one mask; for
a mix of several, ``plan.for_mask(mask)`` gives the plan for one layer's): ``"causal"``,
``"window:W"`` (query p of a document sees its keys ``[max(0, p - W + 1), p]``) or
``"chunk:C"`` (its keys ``[floor(p / C) * C, p]``). It

1. exchanges K/V rows by the rule the planner prices plans with (``plan.exchange(row_bytes)``,
   ``wlb::ChooseExchange``): **row-exact**, every rank receives exactly the other ranks' rows its
   keys need (``plan[rank].key_rows``) and sends every other rank exactly the rows that rank
   needs, in one ``all_to_all_single`` (none when no rank needs another's rows), or the
   **all-gather** of every rank's rows padded to ``plan.rank_capacity``
   (``all_gather_into_tensor``) when that is not predicted strictly faster (the slowest rank
   would move as many rows: e.g. a causal per-seq or per-doc plan, whose rank holding a
   document's last chunk needs all of it); K and V travel together,
2. picks this rank's key rows from its own rows and what it received, and
3. runs varlen causal attention per kernel segment, bottom-right aligned
   (``wlb.torch.attention``; a chunked mask cuts segments at chunk boundaries), keeping the last
   ``plan.kernel_window`` keys per query row under a window.

On the ``"math"`` backend (``overlap``, on by default; on ``"varlen"`` when asked for) step 3
runs over this rank's own keys while the exchange of step 1 is in flight, and over the fetched
keys after it, merged by log-sum-exp (``_OverlappedAttention``); backward likewise.

It returns this rank's output rows and log-sum-exp. Backward computes the local dQ, dK, dV and
sends the key gradients of the rows it received back to their owners (the reverse
``all_to_all_single``, or ``reduce_scatter_tensor`` after an all-gather), so every rank receives
the gradients of its own K/V rows. The result equals single-process attention under the mask over
the whole packed micro-batch, for every strategy; ``comm_volume`` says what each rank passes to
the collectives, which is what ``plan.cp_prediction`` prices.

    plan = wlb.plan_shards(micro_batch, cp=world, strategy="adaptive")
    q, k, v = (cp_slice(t, plan, rank) for t in (q_full, k_full, v_full))
    out, lse = cp_attention(q, k, v, plan, group=None)          # None: the default group
    layer = CPAttention(plan)                                     # the same as a module

Every check runs before the first collective, and the ranks agree before any of them moves a
row (``agree_on_errors=True``, the default): on the first call of a signature (the plan's
digest, shapes, dtypes, devices, scale, backend, group) each rank all-gathers a small
fingerprint of what it is about to do (the plan's digest: strategy, mask, micro-batch and C;
dtype, device type, heads, K/V heads, head dim, scale) together with its own checks' verdict
(tensors that do not fit the plan, a plan for another group size, a mix plan not narrowed with
``for_mask``, tensors on a device the group cannot move, ``meta`` included, a bad ``scale`` or
backend). The exchange uses a
tensor on a device every rank of the group can use (CPU under gloo, the current CUDA device under
NCCL), never the inputs' device. Any rank's failure or any disagreement raises the same
``ValueError`` on every rank, naming the field and the ranks (``TypeError`` where every failing
rank was given a wrong type), so no rank waits in a collective that another rank never enters.
Later calls with a signature every rank has agreed on before cost one all-reduce of 40 bytes
(a hash of the signature and whether each rank has seen its call before); any difference sends
every rank through the whole agreement again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import wlb

from ._common import require_torch, torch
from .attention import (check_scale, default_scale, math_backward, math_forward,
                        select_backend, varlen_causal_attention)

if torch is not None:
    import torch.distributed as dist


@dataclass(frozen=True)
class CommVolume:
    """Bytes one rank passes to the exchange collectives per call, for the exchange the plan picks
    (``exchange``, ``plan.exchange``: ``wlb::ChooseExchange``). ``"row-exact"``: the rank
    receives exactly the other ranks' K/V rows its keys need and sends each other rank exactly
    the rows that rank needs (one ``all_to_all_single``; none when no rank needs another's rows),
    and backward moves those rows' gradients the other way. ``"all-gather"``: the ring
    collectives, each rank receives and sends (C - 1) x rank_capacity rows of K and V, and the
    reduce-scatter moves as many gradient rows each way."""

    gathered_bytes: int  # forward: bytes received from the other ranks
    scattered_bytes: int  # backward: gradient bytes sent to the other ranks
    gather_buffer_bytes: int  # the K/V buffer the keys are picked from (C x rank_capacity rows
    #                           gathered, or the rank's own rows and the rows it received)
    sent_bytes: int = 0  # forward: bytes sent to the other ranks
    grad_received_bytes: int = 0  # backward: gradient bytes received from the other ranks
    exchange: str = ""  # "row-exact" or "all-gather"


def comm_volume(plan: wlb.ShardPlan, kv_heads: int, head_dim: int, element_size: int,
                rank: Optional[int] = None) -> CommVolume:
    """What ``cp_attention`` moves for this plan and K/V shape: on ``rank``, or (None) the most
    any rank moves, field by field."""
    row = 2 * kv_heads * head_dim * element_size  # K and V of one token
    choice = plan.exchange(row)
    kind = choice["kind"]
    ranks = range(plan.cp_size) if rank is None else [_check_rank(plan, rank)]
    if kind == "all-gather":
        others = (plan.cp_size - 1) * plan.rank_capacity * row
        return CommVolume(gathered_bytes=others, scattered_bytes=others,
                          gather_buffer_bytes=plan.cp_size * plan.rank_capacity * row,
                          sent_bytes=others, grad_received_bytes=others, exchange=kind)
    received = [int(n) for n in choice["recv_rows"]]
    sent = max(int(choice["send_rows"][r]) for r in ranks)
    recv = max(received[r] for r in ranks)
    return CommVolume(gathered_bytes=recv * row, scattered_bytes=recv * row,
                      gather_buffer_bytes=max(plan[r].tokens + received[r] for r in ranks) * row,
                      sent_bytes=sent * row, grad_received_bytes=sent * row, exchange=kind)


def _check_rank(plan: wlb.ShardPlan, rank: int) -> int:
    if not 0 <= rank < plan.cp_size:
        raise ValueError(f"rank {rank} is not in [0, {plan.cp_size})")
    return rank


@dataclass
class _RankPlan:
    """The parts of a plan one rank's forward and backward read, as tensors on its device."""

    cp_size: int
    capacity: int
    local_rows: int
    key_rows: "torch.Tensor"  # all-gather: into the gathered rows; row-exact: into the buffer of
    #                           the local rows followed by the received rows
    cu_q: "torch.Tensor"
    cu_k: "torch.Tensor"
    max_q: int
    max_k: int
    window: int  # keys per query row (0: all up to its own)
    exchange: str  # "row-exact" or "all-gather"
    # The row-exact exchange (None under the all-gather).
    send_index: Optional["torch.Tensor"] = None  # local rows sent, grouped by destination
    send_splits: Optional[List[int]] = None
    recv_splits: Optional[List[int]] = None
    moves: bool = True  # whether any rank of the plan sends rows (else no collective at all)
    # The overlapped path (both exchanges, every mask): every kernel segment's keys split into
    # this rank's own (local_key_rows into its rows, cu_k_local) and the fetched ones
    # (remote_key_rows into the received rows under the row-exact exchange, into the gathered
    # rows under the all-gather). The segment's queries are this rank's own rows, the last of its
    # keys, so every fetched key lies before the segment's first query. Causal and chunked masks:
    # bottom-right causal over the own keys stays exact and every query sees every fetched key
    # (unmasked). A window: both parts carry their keys' positions relative to the segment's
    # first query (local_key_offset, remote_key_offset), and the fetched part holds only the
    # segment's first queries whose windows reach a fetched key. The segments with fetched keys
    # and those queries: remote_q_rows, cu_q_remote, cu_k_remote.
    local_key_rows: Optional["torch.Tensor"] = None
    cu_k_local: Optional["torch.Tensor"] = None
    remote_key_rows: Optional["torch.Tensor"] = None
    remote_q_rows: Optional["torch.Tensor"] = None
    cu_q_remote: Optional["torch.Tensor"] = None
    cu_k_remote: Optional["torch.Tensor"] = None
    local_key_offset: Optional["torch.Tensor"] = None
    remote_key_offset: Optional["torch.Tensor"] = None
    fetched_rows: int = 0  # rows of the received (row-exact) or gathered (all-gather) buffer
    max_k_local: int = 0  # the longest segment of each part (what varlen kernels are told)
    max_q_remote: int = 0
    max_k_remote: int = 0


def _rank_plan(plan: wlb.ShardPlan, rank: int, device, row_bytes: int) -> _RankPlan:
    r = plan[rank]
    choice = plan.exchange(row_bytes)
    rp = _RankPlan(cp_size=plan.cp_size, capacity=plan.rank_capacity, local_rows=r.tokens,
                   key_rows=torch.from_numpy(r.key_rows).to(device),
                   cu_q=torch.from_numpy(r.cu_seqlens_q).to(device),
                   cu_k=torch.from_numpy(r.cu_seqlens_k).to(device),
                   max_q=int(r.max_seqlen_q), max_k=int(r.max_seqlen_k),
                   window=int(plan.kernel_window), exchange=choice["kind"])
    cu_q, cu_k = r.cu_seqlens_q.astype(np.int64), r.cu_seqlens_k.astype(np.int64)
    if rp.exchange == "row-exact":
        # The planning library's schedule (wlb::BuildRowExchange), which the CUDA executor runs
        # too: the rows sent grouped by destination, arriving grouped by source behind the
        # rank's own rows, and the key rows into that buffer.
        x = r.row_exchange
        rp.send_index = torch.from_numpy(x["send_rows"]).to(device)
        rp.send_splits = x["send_counts"].tolist()
        rp.recv_splits = x["recv_counts"].tolist()
        rp.moves = int(choice["row_exact_rows"]) > 0
        rows = x["key_rows"]
        rp.key_rows = torch.from_numpy(rows).to(device)
        rp.fetched_rows = sum(rp.recv_splits)
        local = rows < r.tokens
        _split_keys(rp, local, rows[local], rows[~local] - r.tokens, cu_q, cu_k, device)
    else:
        rows = np.asarray(r.key_rows, dtype=np.int64)
        own = rank * plan.rank_capacity
        local = (rows >= own) & (rows < own + plan.rank_capacity)
        rp.fetched_rows = plan.cp_size * plan.rank_capacity
        _split_keys(rp, local, rows[local] - own, rows[~local], cu_q, cu_k, device)
    return rp


def _split_keys(rp: _RankPlan, local: np.ndarray, local_rows: np.ndarray,
                remote_rows: np.ndarray, cu_q: np.ndarray, cu_k: np.ndarray, device) -> None:
    """Fills the overlapped path's key split (see _RankPlan): ``local``, whether each key is one
    of this rank's rows; ``local_rows`` / ``remote_rows``, where the own / fetched keys are."""
    n_q, n_k = np.diff(cu_q), np.diff(cu_k)
    seg = np.repeat(np.arange(len(n_k)), n_k)  # kernel segment of every key
    n_local = np.bincount(seg[local], minlength=len(n_k))
    n_remote = n_k - n_local
    with_remote = np.flatnonzero(n_remote)
    queries = n_q[with_remote]  # the fetched part's queries per segment: all of them, or ...
    as_tensor = lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64)).to(device)
    # Key positions relative to the segment's first query (its keys are contiguous positions
    # ending at its last query): the queries' own keys have offsets >= 0 and must be this rank's.
    offset = np.arange(len(seg)) - np.repeat(cu_k[:-1] + n_k - n_q, n_k)
    if not np.all(local[offset >= 0]):
        raise RuntimeError("internal error: a kernel segment's query rows are not this rank's own "
                           "rows; the overlapped path cannot split its keys")
    if rp.window:
        # Query t sees offsets (t - window, t]: the fetched part holds the queries
        # t <= (last fetched key's offset) + window - 1, each of which sees that key.
        last_remote = np.full(len(n_k), np.iinfo(np.int64).min)
        np.maximum.at(last_remote, seg[~local], offset[~local])
        queries = np.minimum(queries, last_remote[with_remote] + rp.window)
        rp.local_key_offset = as_tensor(offset[local])
        rp.remote_key_offset = as_tensor(offset[~local])
    q_rows = [np.arange(cu_q[i], cu_q[i] + m) for i, m in zip(with_remote, queries)]
    rp.local_key_rows = as_tensor(local_rows)
    rp.cu_k_local = as_tensor(np.concatenate([[0], np.cumsum(n_local)])).to(torch.int32)
    rp.remote_key_rows = as_tensor(remote_rows)
    rp.remote_q_rows = as_tensor(np.concatenate(q_rows) if q_rows else [])
    rp.cu_q_remote = as_tensor(np.concatenate([[0], np.cumsum(queries)])).to(torch.int32)
    rp.cu_k_remote = as_tensor(np.concatenate([[0], np.cumsum(n_remote[with_remote])])).to(
        torch.int32)
    rp.max_k_local = int(n_local.max(initial=0))
    rp.max_q_remote = int(queries.max(initial=0))
    rp.max_k_remote = int(n_remote.max(initial=0))


def _fetch_rows(kv, rp: _RankPlan, group):
    """The K/V rows this rank's key_rows index: every rank's padded buffer (all-gather) or this
    rank's rows followed by exactly the other ranks' rows it needs (all_to_all_single)."""
    if rp.exchange == "all-gather":
        padded = kv.new_zeros((rp.capacity,) + tuple(kv.shape[1:]))
        padded[: rp.local_rows] = kv
        rows = kv.new_empty((rp.cp_size * rp.capacity,) + tuple(kv.shape[1:]))
        dist.all_gather_into_tensor(rows, padded, group=group)
        return rows
    received = kv.new_empty((sum(rp.recv_splits),) + tuple(kv.shape[1:]))
    if rp.moves:
        send = kv.index_select(0, rp.send_index)
        dist.all_to_all_single(received, send, rp.recv_splits, rp.send_splits, group=group)
    return torch.cat([kv, received])


def _return_grads(d_rows, rp: _RankPlan, group):
    """_fetch_rows' adjoint: every fetched row's gradient summed into its owner's local row."""
    if rp.exchange == "all-gather":
        mine = d_rows.new_empty((rp.capacity,) + tuple(d_rows.shape[1:]))
        dist.reduce_scatter_tensor(mine, d_rows, op=dist.ReduceOp.SUM, group=group)
        return mine[: rp.local_rows]
    mine = d_rows[: rp.local_rows].clone()
    if rp.moves:
        d_send = d_rows.new_empty((len(rp.send_index),) + tuple(d_rows.shape[1:]))
        dist.all_to_all_single(d_send, d_rows[rp.local_rows:].contiguous(), rp.send_splits,
                               rp.recv_splits, group=group)
        mine.index_add_(0, rp.send_index, d_send)  # a row may go to several ranks
    return mine


class _GatherKeys(torch.autograd.Function if torch is not None else object):
    """Forward: fetch the K/V rows (_fetch_rows), select this rank's key rows. Backward: add the
    key gradients per fetched row and send them back to their owners (_return_grads)."""

    @staticmethod
    def forward(ctx, k, v, rp: _RankPlan, group, clock=None):
        h_kv = k.shape[1]
        rows = _fetch_rows(torch.cat([k, v], dim=1), rp, group)
        keys = rows.index_select(0, rp.key_rows)
        ctx.rp, ctx.group, ctx.h_kv, ctx.clock = rp, group, h_kv, clock
        ctx.shape = tuple(rows.shape)
        return keys[:, :h_kv].contiguous(), keys[:, h_kv:].contiguous()

    @staticmethod
    def backward(ctx, d_keys_k, d_keys_v):
        if ctx.clock is not None:
            ctx.clock.restart()  # the attention's backward ran before this
        d_keys = torch.cat([d_keys_k, d_keys_v], dim=1)
        d_rows = d_keys.new_zeros(ctx.shape)
        d_rows.index_add_(0, ctx.rp.key_rows, d_keys)
        mine = _return_grads(d_rows, ctx.rp, ctx.group)
        if ctx.clock is not None:
            ctx.clock.lap("backward_exchange_s")
        return mine[:, : ctx.h_kv], mine[:, ctx.h_kv:], None, None, None


def _merge(out_a, lse_a, out_b, lse_b):
    """Attention over two disjoint key sets merged by log-sum-exp: (out, lse) over their union.
    lse is (H, T), out (T, H, D); a row without keys in one part has lse -inf there."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse).transpose(0, 1)[..., None]  # lse's dtype: float32 or float64
    w_b = torch.exp(lse_b - lse).transpose(0, 1)[..., None]
    return (out_a.to(w_a.dtype) * w_a + out_b.to(w_b.dtype) * w_b).to(out_a.dtype), lse


class _OverlappedAttention(torch.autograd.Function if torch is not None else object):
    """The exchange overlapped with attention (math backend; both exchanges, every mask).

    Forward: starts the exchange of the K/V rows asynchronously (the row-exact
    all_to_all_single, or the all_gather_into_tensor of every rank's padded rows), runs attention
    over the keys this rank holds, waits, runs attention over the fetched keys and merges the two
    by log-sum-exp. Backward: the fetched keys' part first (with the merged out and lse), starts
    sending their dK/dV back asynchronously (the reverse all_to_all_single, or the
    reduce_scatter_tensor of the gathered rows' gradients), runs the own keys' part, waits and adds
    the gradients that came back. ``clock`` (a _Clock) records the laps: forward
    "local_attention_s" (overlapping the exchange), "exchange_wait_s" (the exchange left once it
    was done), "remote_attention_s"; backward "backward_remote_s", "backward_local_s"
    (overlapping the gradients' exchange), "backward_wait_s"; and adds the forward's attention
    laps to "attention_s" and its wait to "gather_s"."""

    @staticmethod
    def forward(ctx, q, k, v, rp: _RankPlan, group, scale, clock, parts):
        h_kv = k.shape[1]
        kv = torch.cat([k, v], dim=1)
        received = kv.new_empty((rp.fetched_rows,) + tuple(kv.shape[1:]))
        work = None
        if rp.exchange == "all-gather":
            padded = kv.new_zeros((rp.capacity,) + tuple(kv.shape[1:]))
            padded[: rp.local_rows] = kv
            work = dist.all_gather_into_tensor(received, padded, group=group, async_op=True)
        elif rp.moves:
            send = kv.index_select(0, rp.send_index)
            work = dist.all_to_all_single(received, send, rp.recv_splits, rp.send_splits,
                                          group=group, async_op=True)
        local = kv.index_select(0, rp.local_key_rows)
        k_l, v_l = local[:, :h_kv].contiguous(), local[:, h_kv:].contiguous()
        out, lse, state_l = parts.local_forward(q, k_l, v_l, rp, scale)
        local_s = clock.lap("local_attention_s")
        if work is not None:
            work.wait()
        clock.add("gather_s", clock.lap("exchange_wait_s"))
        remote = received.index_select(0, rp.remote_key_rows)
        k_r, v_r = remote[:, :h_kv].contiguous(), remote[:, h_kv:].contiguous()
        q_r = q.index_select(0, rp.remote_q_rows)
        state_r = None
        if len(rp.remote_q_rows):
            out_r, lse_r, state_r = parts.remote_forward(q_r, k_r, v_r, rp, scale)
            merged, merged_lse = _merge(out[rp.remote_q_rows], lse[:, rp.remote_q_rows],
                                        out_r, lse_r)
            out[rp.remote_q_rows] = merged
            lse[:, rp.remote_q_rows] = merged_lse
        clock.add("attention_s", local_s + clock.lap("remote_attention_s"))
        ctx.save_for_backward(q, k_l, v_l, q_r, k_r, v_r, out, lse)
        ctx.rp, ctx.group, ctx.scale, ctx.h_kv, ctx.clock = rp, group, scale, h_kv, clock
        ctx.parts, ctx.states = parts, (state_l, state_r)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        q, k_l, v_l, q_r, k_r, v_r, out, lse = ctx.saved_tensors
        rp, h_kv, clock = ctx.rp, ctx.h_kv, ctx.clock
        clock.restart()
        rq, work = rp.remote_q_rows, None
        d_received = q.new_zeros((rp.fetched_rows, 2 * h_kv, q.shape[2]))
        if len(rq):
            dq_r, dk_r, dv_r = ctx.parts.remote_backward(q_r, k_r, v_r, out[rq], lse[:, rq],
                                                         d_out[rq], rp, ctx.scale, ctx.states[1])
            d_received.index_add_(0, rp.remote_key_rows, torch.cat([dk_r, dv_r], dim=1))
        clock.lap("backward_remote_s")
        if rp.exchange == "all-gather":
            d_kv_r = q.new_empty((rp.capacity, 2 * h_kv, q.shape[2]))
            work = dist.reduce_scatter_tensor(d_kv_r, d_received, op=dist.ReduceOp.SUM,
                                              group=ctx.group, async_op=True)
        elif rp.moves:
            d_kv_r = q.new_empty((len(rp.send_index), 2 * h_kv, q.shape[2]))
            work = dist.all_to_all_single(d_kv_r, d_received, rp.send_splits, rp.recv_splits,
                                          group=ctx.group, async_op=True)
        dq, dk_l, dv_l = ctx.parts.local_backward(q, k_l, v_l, out, lse, d_out, rp, ctx.scale,
                                                  ctx.states[0])
        if len(rq):
            dq.index_add_(0, rq, dq_r)
        d_kv = q.new_zeros((rp.local_rows, 2 * h_kv, q.shape[2]))
        d_kv.index_add_(0, rp.local_key_rows, torch.cat([dk_l, dv_l], dim=1))
        clock.lap("backward_local_s")
        if work is not None:
            work.wait()
            if rp.exchange == "all-gather":
                d_kv += d_kv_r[: rp.local_rows]
            else:
                d_kv.index_add_(0, rp.send_index, d_kv_r)  # a row may go to several ranks
        clock.lap("backward_wait_s")
        return dq, d_kv[:, :h_kv], d_kv[:, h_kv:], None, None, None, None, None


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


# ---- agreement: every rank checks, then all ranks compare, before any collective moves a row ----

_RECORD_BYTES = 2048  # one rank's fingerprint and verdict, UTF-8 JSON padded with NULs
_MESSAGE_CHARS = 600  # a local error longer than this is cut in the shared message
# Compared across ranks in this order; the first that differs is named in the error.
_FIELDS = ("cp_size", "strategy", "mask", "micro_batch", "plan", "dtype", "device", "heads",
           "kv_heads", "head_dim", "scale", "backend")


def _exchange_device(group) -> "torch.device":
    """Where the agreement's tensor lives: a device every rank of the group can use (the current
    CUDA device for NCCL alone, else the CPU: gloo, or gloo beside NCCL)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend and "cpu" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _device_problem(t: "torch.Tensor", group) -> Optional[str]:
    """Why the group cannot exchange rows of a tensor on ``t.device``, or None."""
    kind = t.device.type
    backend = str(dist.get_backend(group)).lower()
    allowed = {"cuda"} if backend == "nccl" else {"cpu", "cuda"}
    if kind not in allowed:
        return (f"q, k, v are on device {t.device}, which the {backend} group cannot exchange "
                f"(expected {' or '.join(sorted(allowed))})")
    return None


def plan_digest(plan: wlb.ShardPlan) -> str:
    """What a plan makes every rank do, as a short hex digest: strategy, mask, C, tokens,
    capacity and every rank's segments (document, piece, query range: the micro-batch's
    documents and their cut); the same plan gives the same digest in every process. It reads
    the plan's segments only, not its index maps (about 1 ms for 200 documents at C = 8)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{plan.strategy}|{plan.mask or plan.layer_mix}|{plan.cp_size}|{plan.tokens}|"
             f"{plan.rank_capacity}".encode())
    for r in range(plan.cp_size):
        rank = plan[r]
        for column in (rank.segment_ids, rank.segment_pieces, rank.q_begin, rank.q_end):
            h.update(np.ascontiguousarray(column, dtype="<i8").tobytes() + b"|")
    return h.hexdigest()


def _fingerprint(q, k, v, plan, group, world: int, rank: int, scale, backend, digest,
                 caller_problem: Optional[str] = None):
    """(this rank's fingerprint, its local error or None, error kind, chosen backend, scale);
    ``caller_problem``: a check the caller made that failed (it is this rank's error)."""
    record: Dict[str, Any] = {}
    problem, kind, chosen = caller_problem, "value", None
    if not isinstance(plan, wlb.ShardPlan):
        problem = f"plan must be a wlb.ShardPlan, got {type(plan).__name__}"
        return record, problem, "type", None, scale
    record.update(cp_size=plan.cp_size, strategy=plan.strategy, mask=plan.mask or plan.layer_mix,
                  micro_batch=f"{plan.tokens} tokens", plan=digest(plan))
    if plan.mask is None:
        problem = (f"the plan's layer mix {plan.layer_mix} has several masks; pass "
                   f"plan.for_mask(mask) for this layer's")
    elif plan.cp_size != world:
        problem = (f"the plan is for cp_size {plan.cp_size} but the process group has {world} "
                   f"ranks")
    tensors = all(isinstance(t, torch.Tensor) for t in (q, k, v))
    if tensors and q.dim() == 3 and k.dim() == 3:
        record.update(dtype=str(q.dtype), device=q.device.type, heads=int(q.shape[1]),
                      kv_heads=int(k.shape[1]), head_dim=int(q.shape[2]))
    try:
        scale = check_scale(scale)
        record["scale"] = "default" if scale is None else repr(scale)
    except ValueError as e:
        problem = problem or str(e)
    if problem is None:
        problem = _check_inputs(q, k, v, plan, rank)
        if problem is not None and not tensors:
            kind = "type"
    if problem is None:
        problem = _device_problem(q, group)
    if problem is None:
        try:
            chosen = select_backend(q.device, q.dtype, backend, plan.kernel_window)
            record["backend"] = chosen
        except ValueError as e:
            problem = str(e)
    return record, problem, kind, chosen, scale


def _encode(record: Dict[str, Any], problem: Optional[str], kind: str) -> bytes:
    """One rank's record as _RECORD_BYTES of JSON: field texts cut to 64 characters (the plan's
    digest covers what they leave out), the local error cut to fit (never dropped: an empty
    message still marks the rank as failed), NUL padding."""
    fields = {key: value[:64] if isinstance(value, str) else value
              for key, value in record.items()}
    entry = {"f": fields, "e": None if problem is None else problem[:_MESSAGE_CHARS], "k": kind}
    blob = json.dumps(entry, sort_keys=True).encode()
    while len(blob) > _RECORD_BYTES:  # escaped characters: cut the message further
        entry["e"] = entry["e"][: len(entry["e"]) * 3 // 4]
        blob = json.dumps(entry, sort_keys=True).encode()
    return blob.ljust(_RECORD_BYTES, b"\0")


def _ranks_text(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _verdict(entries: List[Dict[str, Any]]) -> Optional[Tuple[type, str]]:
    """The one error every rank raises for these gathered entries (the same on every rank), or
    None when all ranks passed their checks and agree on every field."""
    failed = [r for r, e in enumerate(entries) if e["e"] is not None]
    if failed:
        kind = TypeError if all(entries[r]["k"] == "type" for r in failed) else ValueError
        lines = "; ".join(f"rank {r}: {entries[r]['e']}" for r in failed)
        return kind, (f"cp_attention: {_ranks_text(failed)} of {len(entries)} rejected "
                      f"{'its' if len(failed) == 1 else 'their'} inputs, so every rank stops "
                      f"before any collective ({lines})")
    for field in _FIELDS:
        groups: Dict[str, List[int]] = {}
        for r, e in enumerate(entries):
            groups.setdefault(str(e["f"].get(field)), []).append(r)
        if len(groups) > 1:
            shown = "; ".join(f"{value} on {_ranks_text(ranks)}" for value, ranks in groups.items())
            return ValueError, (f"cp_attention: the CP ranks disagree on {field} ({shown}); every "
                                f"rank must call it with the same plan, dtype, device type, "
                                f"head counts, head dim and scale")
    return None


# Agreements that passed in this process: (this rank's signature: the plan's digest, shapes,
# dtypes, devices, scale, backend, group, rank) -> (backend, scale, group). Bounded, oldest out.
_AGREED: "OrderedDict[Any, Tuple[str, Optional[float], Any]]" = OrderedDict()
# Plans' digests by identity (the plan is kept, so its id is not reused while it is here; few,
# since a plan holds its index maps: a training step's layers reuse one plan).
_DIGESTS: "OrderedDict[int, Tuple[wlb.ShardPlan, str]]" = OrderedDict()
_AGREED_ENTRIES, _DIGEST_ENTRIES = 256, 8


def _remember(table: OrderedDict, key, value, entries: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > entries:
        table.popitem(last=False)


def _digest_of(plan: wlb.ShardPlan, cache: Optional[Dict[Any, Any]]) -> str:
    """plan_digest(plan), computed once per plan object (CPAttention's cache, or this module's)."""
    if cache is not None:
        if "plan_digest" not in cache:
            cache["plan_digest"] = plan_digest(plan)
        return cache["plan_digest"]
    entry = _DIGESTS.get(id(plan))
    if entry is None or entry[0] is not plan:
        entry = (plan, plan_digest(plan))
    _remember(_DIGESTS, id(plan), entry, _DIGEST_ENTRIES)
    return entry[1]


def _signature(q, k, v, plan, group, rank: int, world: int, scale, backend, digest):
    """(what every rank must share, this rank's whole call) for the agreement cache, or
    (None, None) for arguments of the wrong types (those always take the whole agreement)."""
    if not isinstance(plan, wlb.ShardPlan) or not all(isinstance(t, torch.Tensor)
                                                      for t in (q, k, v)):
        return None, None
    shared = (digest(plan), world, str(q.dtype), q.device.type, tuple(q.shape[1:]),
              tuple(k.shape[1:]), repr(scale), repr(backend))
    mine = (shared, rank, id(group), str(dist.get_backend(group)), tuple(q.shape),
            tuple(k.shape), tuple(v.shape),
            str(q.device), str(k.device), str(v.device), str(k.dtype), str(v.dtype))
    return shared, mine


def _agree(q, k, v, plan, group, rank: int, scale, backend, agree: bool,
           cache: Optional[Dict[Any, Any]] = None, caller_problem: Optional[str] = None):
    """Every rank's checks and fingerprints, compared on every rank before any collective moves
    a row: returns (backend, scale) when all ranks passed and agree, else raises the same error
    on every rank. ``agree=False`` checks this rank alone (no exchange). ``cache``: CPAttention's
    per-plan cache, where the plan's digest is kept after its first call.

    The whole agreement (every rank's checks, an all_gather of 2 KiB records) runs once per
    signature (the plan's digest, shapes, dtypes, devices, scale, backend, group) per process:
    every call first all-reduces (MAX) one 40-byte tensor, a 62-bit hash of what the ranks must
    share and whether this rank has agreed on its call before; where every rank has and the
    hashes are equal, the call goes on with the remembered result, else every rank runs the
    whole agreement, so a rank that alone changes its plan or shapes still makes every rank
    raise the same error (no collective can be skipped by one rank alone: it would hang)."""
    world = dist.get_world_size(group)
    digest = lambda p: _digest_of(p, cache)
    if not agree:
        return _agree_fully(q, k, v, plan, group, rank, world, scale, backend, digest, False,
                            caller_problem)
    shared, mine = _signature(q, k, v, plan, group, rank, world, scale, backend, digest)
    known = _AGREED.get(mine) if mine is not None and caller_problem is None else None
    h = int.from_bytes(hashlib.blake2b(repr(shared).encode(), digest_size=8).digest(), "little")
    lo, hi = h & 0x7FFFFFFF, (h >> 31) & 0x7FFFFFFF
    flags = torch.tensor([lo, hi, -lo, -hi, 0 if known is not None else 1], dtype=torch.int64,
                         device=_exchange_device(group))
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    max_lo, max_hi, min_lo, min_hi, unknown = flags.tolist()
    if not unknown and max_lo == -min_lo and max_hi == -min_hi:
        _AGREED.move_to_end(mine)
        return known[0], known[1]
    chosen, scale_ = _agree_fully(q, k, v, plan, group, rank, world, scale, backend, digest, True,
                                  caller_problem)
    if mine is not None:
        _remember(_AGREED, mine, (chosen, scale_, group), _AGREED_ENTRIES)
    return chosen, scale_


def _agree_fully(q, k, v, plan, group, rank: int, world: int, scale, backend, digest,
                 agree: bool, caller_problem: Optional[str] = None):
    """The whole agreement: this rank's checks and fingerprint, all-gathered and compared."""
    record, problem, kind, chosen, scale = _fingerprint(q, k, v, plan, group, world, rank, scale,
                                                        backend, digest, caller_problem)
    if not agree:
        if problem is not None:
            raise (TypeError if kind == "type" else ValueError)(
                f"cp_attention on rank {rank}: {problem}")
        return chosen, scale
    device = _exchange_device(group)
    mine = torch.frombuffer(bytearray(_encode(record, problem, kind)), dtype=torch.uint8)
    gathered = [torch.empty(_RECORD_BYTES, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine.to(device), group=group)
    entries = [json.loads(bytes(t.cpu().numpy()).rstrip(b"\0")) for t in gathered]
    verdict = _verdict(entries)
    if verdict is not None:
        raise verdict[0](verdict[1])
    return chosen, scale


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
    The mask is ``plan.mask`` (see the module's docstring); a plan whose layer mix has several
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
