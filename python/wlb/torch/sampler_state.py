"""``PackedBatchSampler.load_state_dict``'s checks, apart from its planning loop: a state is
checked field by field against the sampler's corpus and the plan it implies (the push it was
taken in is replayed), and a bad one is a ValueError naming the field."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Dict, Optional

import numpy as np

import wlb

from .calibration import cost_model
from .calibration_state import parse_fit
from .epoch_pieces import _COLUMNS, _columns, _Cursor, _EpochPieces, _join, _push

if TYPE_CHECKING:
    from .sampler import PackedBatchSampler

_STATE_VERSION = 1
_MAX_MICRO_BATCHES = 4096  # N = PP x DP (wlb/core/limits.hpp kMaxMicroBatches)
_MAX_COUNTER = 1 << 40  # epochs and steps in a state (kMaxStateCounter)
_STATE_KEYS = {"version", "epoch", "pp", "dp", "context", "corpus", "steps", "packer", "consumed",
               "queued", "step_in_push", "micro_batch"}
_ELASTIC_KEYS = {"elastic_consumed", "elastic_queued"}


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_int(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
    """``value`` as an int in [low, high]; ValueError naming ``name`` and the value (a bool is
    not an integer here)."""
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def _check_calibration_entry(sampler: "PackedBatchSampler",
                             state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Checks the state's "calibration" entry (ValueError naming the field; nothing changes)
    and returns the fitted cost its push planned with (None: the sampler's own cost)."""
    entry = state.get("calibration")
    if sampler.calibration is None or entry is None:
        if sampler.calibration is not None or entry is not None:
            raise ValueError(
                "state 'calibration': the state was saved " +
                ("without" if entry is None else "with") + " an OnlineCalibration and this "
                "sampler has " + ("one" if entry is None else "none"))
        return None
    if not isinstance(entry, dict) or set(entry) != {"run_steps", "push", "state"}:
        raise ValueError(f"state 'calibration' must be a dict with run_steps, push and state, "
                         f"got {entry!r:.200}")
    run_steps = entry["run_steps"]
    if (isinstance(run_steps, bool) or not isinstance(run_steps, int) or
            not state["steps"] <= run_steps <= 2**62):
        raise ValueError(f"state 'calibration.run_steps' must be an integer in "
                         f"[steps = {state['steps']}, 2^62], got {run_steps!r}")
    push = entry["push"]
    if push is not None:
        if not isinstance(push, dict) or set(push) != {"step", "cost"}:
            raise ValueError(f"state 'calibration.push' must be None or a dict with step and "
                             f"cost, got {push!r:.200}")
        if (isinstance(push["step"], bool) or not isinstance(push["step"], int) or
                not 0 <= push["step"] <= run_steps):
            raise ValueError(f"state 'calibration.push.step' must be an integer in "
                             f"[0, run_steps = {run_steps}], got {push['step']!r}")
        if push["cost"] is not None:
            push["cost"] = parse_fit("calibration.push.cost", push["cost"])
    return push["cost"] if push is not None else None


def _state_columns(name: str, value: Any) -> Dict[str, np.ndarray]:
    """A state's queue (ids, lengths, pieces, offsets columns) as int64 arrays; ValueError
    naming the field unless each column is a 1-D integer array (or list) of one common size."""
    if not isinstance(value, dict) or set(value) != set(_COLUMNS):
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise ValueError(f"state '{name}' must be a dict of the columns {list(_COLUMNS)}, got "
                         f"{keys}")
    out = {}
    for c in _COLUMNS:
        column = value[c]
        if isinstance(column, list) and not all(_is_int(x) for x in column):
            raise ValueError(f"state '{name}.{c}' must hold integers, got "
                             f"{next(x for x in column if not _is_int(x))!r}")
        array = np.asarray(column)
        if array.ndim != 1 or (array.size and (not np.issubdtype(array.dtype, np.integer) or
                                               array.dtype == np.bool_)):
            raise ValueError(f"state '{name}.{c}' must be a 1-D integer array, got "
                             f"{array.dtype} with shape {array.shape}")
        if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
            raise ValueError(f"state '{name}.{c}' holds {int(array.max())}, above int64")
        out[c] = array.astype(np.int64)
    sizes = {c: len(out[c]) for c in _COLUMNS}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"state '{name}' columns differ in size: {sizes}")
    return out


def _same_columns(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[c], b[c]) for c in _COLUMNS)


def _check_pieces(name: str, columns: Dict[str, np.ndarray], lengths: np.ndarray, context: int,
                  pieces: _EpochPieces, arrived: _Cursor, held: Dict[int, list]) -> None:
    """Every row of a state's queue lies inside its document and inside the piece it names (the
    piece's S-token span, as make_documents cuts it; a packer may cut a piece further), belongs
    to a piece among the first ``arrived`` pieces of the epoch, and overlaps no other piece held
    (``held``: document -> [(offset, end, where)] of the queues checked before)."""
    ids, lens, idx, offs = (columns[c] for c in ("ids", "lengths", "pieces", "offsets"))
    n = len(lengths)
    for row in range(len(ids)):
        doc, piece, offset, length = int(ids[row]), int(idx[row]), int(offs[row]), int(lens[row])
        where = f"state '{name}' row {row} (document {doc}, piece {piece})"
        if not 0 <= doc < n:
            raise ValueError(f"{where}: no document {doc} in a corpus of {n}")
        size = int(lengths[doc])
        if (piece < 0 or length < 1 or offset < piece * context or
                offset + length > min((piece + 1) * context, size)):
            raise ValueError(f"{where}: tokens [{offset}, {offset + length}) are not inside piece "
                             f"{piece} of a {size}-token document cut at S = {context}")
        for begin, stop, other in held.get(doc, ()):
            if offset < stop and begin < offset + length:
                raise ValueError(f"{where}: tokens [{offset}, {offset + length}) are also held "
                                 f"by {other}")
        held.setdefault(doc, []).append((offset, offset + length, where))
    if not len(ids):
        return
    # Each held piece must have arrived: among the epoch's first `arrived.piece` pieces.
    present = pieces.arrived(arrived, ids, idx)
    for row in np.flatnonzero(~present).tolist()[:1]:
        raise ValueError(f"state '{name}' row {row} (document {int(ids[row])}, piece "
                         f"{int(idx[row])}) has not arrived by piece {arrived.piece} of the epoch")


def _validate_state(sampler: "PackedBatchSampler", state: Dict[str, Any]) -> Dict[str, Any]:
    """``state`` checked field by field against the sampler's corpus and the plan it implies
    (ValueError naming the field), with its queues as int64 columns. See load_state_dict."""
    missing = sorted(_STATE_KEYS - set(state))
    if missing:
        raise ValueError(f"PackedBatchSampler state has no {missing} entries")
    elastic = _ELASTIC_KEYS & set(state)
    if elastic and elastic != _ELASTIC_KEYS:
        raise ValueError(f"PackedBatchSampler state has {sorted(elastic)} without "
                         f"{sorted(_ELASTIC_KEYS - elastic)}")
    unknown = sorted(set(state) - _STATE_KEYS - _ELASTIC_KEYS - {"calibration"})
    if unknown:
        raise ValueError(f"PackedBatchSampler state has unknown entries {unknown}")
    context = sampler._packer_args["context"]
    if (state["context"] != context or state["pp"] != sampler.pp or not _is_int(state["pp"]) or
            not _is_int(state["context"])):
        raise ValueError(f"the state was saved with context {state['context']!r} and PP "
                         f"{state['pp']!r}; this sampler has context {context} and PP "
                         f"{sampler.pp} (only DP may change)")
    if state["corpus"] != sampler._corpus():
        raise ValueError(f"state 'corpus' is {state['corpus']!r}; this sampler has "
                         f"{sampler._corpus()}")
    epoch = _check_int("state 'epoch'", state["epoch"], 0, _MAX_COUNTER)
    dp = _check_int("state 'dp'", state["dp"], 1, _MAX_MICRO_BATCHES // sampler.pp)
    steps = _check_int("state 'steps'", state["steps"], 0, _MAX_COUNTER)
    pieces = sampler._epoch_pieces(epoch)
    _check_int("state 'consumed'", state["consumed"], 0)
    cursor = pieces.seek(state["consumed"])  # ValueError past the epoch's last piece
    step_in_push = _check_int("state 'step_in_push'", state["step_in_push"], 0, _MAX_COUNTER)
    micro_batch = _check_int("state 'micro_batch'", state["micro_batch"], 0, sampler.pp)
    queued = _state_columns("queued", state["queued"])
    state["queued"] = queued
    blob = state["packer"]
    args = dict(sampler._packer_args, micro_batches=sampler.pp * dp)
    push_cost = _check_calibration_entry(sampler, state)
    if push_cost is not None:  # the push the state was taken in planned with a fitted cost
        args["cost"] = cost_model(push_cost)
    packer = wlb.Packer(**args)
    if blob is not None:
        if not isinstance(blob, dict):
            raise ValueError(f"state 'packer' must be None or a Packer.state_dict(), got "
                             f"{type(blob).__name__}")
        try:
            packer.load_state_dict(blob)  # the C++ checks of the blob
        except (TypeError, ValueError) as e:
            raise ValueError(f"state 'packer': {e}") from e
    held: Dict[int, list] = {}
    _check_pieces("queued", queued, sampler.lengths, context, pieces, cursor, held)
    _check_pieces("packer", _columns(packer.pending), sampler.lengths, context, pieces, cursor,
                  held)
    if not elastic:
        # Only a state before its first micro-batch has no elastic part (a start state, or one
        # restored elastically and saved again before iterating).
        if step_in_push or micro_batch:
            raise ValueError(f"state 'step_in_push' {step_in_push} and 'micro_batch' "
                             f"{micro_batch} need the state's elastic entries")
        if blob is None and not queued["ids"].size and (cursor.piece or steps):
            raise ValueError(f"state 'consumed' {cursor.piece} and 'steps' {steps}: a state without "
                             f"a packer or queue is the start of an epoch (0 and 0)")
        return state
    if micro_batch < 1:
        raise ValueError(f"state 'micro_batch' must be in [1, {sampler.pp}] after a micro-batch "
                         f"was given, got {micro_batch}")
    # Replay the push the state was taken in: the elastic entries follow from the exact ones.
    tokens_per_step = context * sampler.pp * dp
    try:
        ready, end, _ = _push(packer, pieces, cursor, queued, tokens_per_step)
    except ValueError as e:
        raise ValueError(f"state 'queued' / 'consumed' / 'packer': the push the state was taken "
                         f"in cannot be replayed: {e}") from e
    if step_in_push >= len(ready):
        raise ValueError(f"state 'step_in_push' is {step_in_push} but the push it names plans "
                         f"{len(ready)} steps")
    done = micro_batch == sampler.pp
    if steps < step_in_push + done:
        raise ValueError(f"state 'steps' {steps} is below the {step_in_push + done} steps its "
                         f"push finished")
    if state["elastic_consumed"] != end.piece or not _is_int(state["elastic_consumed"]):
        raise ValueError(f"state 'elastic_consumed' is {state['elastic_consumed']!r}; its push "
                         f"consumes up to piece {end.piece}")
    rest = _join([_columns(mb) for step in ready[step_in_push + done:]
                  for mb in step.micro_batches] + [_columns(packer.pending)])
    queue = _state_columns("elastic_queued", state["elastic_queued"])
    if not _same_columns(queue, rest):
        raise ValueError(f"state 'elastic_queued' ({len(queue['ids'])} pieces) is not what its "
                         f"push leaves untrained ({len(rest['ids'])} pieces)")
    state["elastic_queued"] = queue
    if dp != sampler.dp:  # an elastic restore starts by pushing that queue to a new packer
        try:
            _push(wlb.Packer(**sampler._packer_args), pieces, end, queue,
                  context * sampler.micro_batches)
        except ValueError as e:
            raise ValueError(f"state 'elastic_queued' cannot be pushed to a packer for "
                             f"N = {sampler.micro_batches}: {e}") from e
    return state
