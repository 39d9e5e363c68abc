"""One rank's part of a shard plan as tensors, and the K/V row exchange it runs.

``comm_volume`` says what the exchange moves; ``_rank_plan`` builds the index tensors one rank's
forward and backward read (the key split of the overlapped path included); ``_fetch_rows`` and
``_return_grads`` are the blocking exchange of the rows and of their gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np

import wlb

from .._common import torch

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
