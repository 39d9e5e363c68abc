"""The cross-rank agreement: every rank checks its call and all ranks compare fingerprints
before any collective moves a row, so a failure on one rank raises the same error on every rank
(see the package's docstring)."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import wlb

from .._common import torch
from ..attention import check_scale, select_backend

if torch is not None:
    import torch.distributed as dist


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
