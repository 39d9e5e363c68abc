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

The package, one idea per file: ``rank_plan`` (one rank's plan as tensors and the K/V exchange,
``comm_volume``), ``autograd`` (the sequential and the overlapped autograd functions),
``kernels`` (the overlapped path's attention parts per backend), ``agreement`` (the ranks' checks
and agreement, ``plan_digest``) and ``layer`` (``cp_attention``, ``CPAttention``, the clock).
"""

from .agreement import plan_digest
from .layer import CPAttention, cp_attention, describe_backend
from .rank_plan import comm_volume, CommVolume

# Private names the tests and benches reach through the package (they patch the submodules).
from .agreement import _encode, _RECORD_BYTES, _verdict  # noqa: F401
from .autograd import _OverlappedAttention  # noqa: F401
from .kernels import _flash_ops, _overlap_parts, _VarlenParts  # noqa: F401
from .layer import _Clock  # noqa: F401
from .rank_plan import _fetch_rows, _rank_plan, _return_grads  # noqa: F401

__all__ = ["CommVolume", "CPAttention", "comm_volume", "cp_attention", "describe_backend",
           "plan_digest"]
