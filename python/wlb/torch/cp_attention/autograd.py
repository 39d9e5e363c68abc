"""The autograd functions of CP attention: the sequential path's key exchange (``_GatherKeys``)
and the overlapped path (``_OverlappedAttention``), which runs attention over this rank's own keys
while the exchange is in flight and merges the fetched keys' part by log-sum-exp."""

from __future__ import annotations

from .._common import torch
from .rank_plan import _fetch_rows, _RankPlan, _return_grads

if torch is not None:
    import torch.distributed as dist


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
