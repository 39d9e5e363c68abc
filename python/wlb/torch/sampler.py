"""``PackedBatchSampler``: plans packed steps from document lengths, yields this rank's micro-batches.

Planning runs in the main process on lengths only; the DataLoader's workers fetch and collate the
tokens (``PackedPieces`` + ``PackedCollate``, ``wlb.torch.collate``), so any ``num_workers`` gives
the same batches. Every DP rank builds the same sampler (same lengths, seed and sizes) and plans
the same global steps: each step's N = PP x DP micro-batches are packed once, then placed on DP
ranks by ``wlb.assign_dp_ranks`` (the 1F1B step-time model of wlb/sim: the slowest rank's
pipeline time is minimised, and each rank's run order is chosen by the same model), and rank r
yields its PP micro-batches in that order.

    sampler = PackedBatchSampler(corpus.lengths, pp=4, dp=2, rank=dp_rank, context=32768)
    loader = StatefulDataLoader(PackedPieces(corpus), batch_sampler=sampler,
                                collate_fn=PackedCollate(), num_workers=4)
    for i, mb in enumerate(loader):      # PP micro-batches per step, in run order
        ...                              # mb["input_ids"], mb["position_ids"], mb["cu_seqlens"]

A yielded batch is a list of ``(document, offset, length)`` pieces (documents longer than S are cut
into pieces of at most S tokens). Documents of length 0 (Megatron's builder writes them) are
skipped: counted in ``empty_documents`` and reported once, by a warning when the sampler is built.

Epoch end: every rank yields PP micro-batches per step, in lockstep with the others, so when the
epoch's last tokens do not fill N micro-batches, some are empty: an empty list of pieces, which
``PackedCollate`` turns into a batch of 0 tokens (``cu_seqlens`` ``[0]``). Run the step anyway
(DDP and pipeline schedules wait for every rank): ``wlb.torch.packed_cross_entropy`` gives such a
micro-batch a zero loss that still has a gradient (never NaN) and the ``(sum, count)`` pair for
the token-weighted mean across ranks. Hugging Face models cannot run 0 tokens: skip their forward
on an empty micro-batch, or, under DDP, back-propagate ``0 * sum(p.sum() for p in params)``. An epoch is the documents in a seeded random order (``shuffle``),
arriving N x S tokens per step as ``wlb.split_into_steps`` cuts them; call ``set_epoch(e)`` before
each epoch (as with ``DistributedSampler``), or every iteration replays the same order.

Resume. ``state_dict()`` / ``load_state_dict()`` (torchdata's ``StatefulDataLoader`` calls them,
workers or not) restore exactly: same PP and DP continue right after the last micro-batch given.
A state restored with another DP (N changes) is an elastic restore: the pieces of steps not
finished on every rank (the current, partly given step included: its gradients were never
applied) and the packer's queued and carried pieces are pushed first to a new packer for
N' = PP x DP', then the rest of the epoch follows in N' x S-token steps. Steps finished before the
save are never repeated and no piece is lost; every plan after the restore may differ from an
uninterrupted run at DP' (or at the old DP).

Scale. Any number of documents (up to 2^40) is planned from a stream: ``lengths`` is kept as
given (a ``numpy.memmap`` such as ``MegatronTokens.lengths`` stays one; any integer dtype) and
checked chunk by chunk; the sampler holds the epoch's shuffled order (uint32 while the corpus has
under 2^32 documents: 4 bytes a document; with empty documents also the non-empty ones' indices,
so at most 8 bytes a document) and the pieces of the steps in flight, cut from the order one push
at a time. ``load_state_dict`` finds the saved position by a chunked scan of the order.

Online calibration. ``calibration=OnlineCalibration(...)`` (``wlb.torch.calibration``) replaces the
cost with fits of the micro-batch times the training loop measures: step s (counted from the first
step this sampler planned, across epochs) is planned with the last fit whose first step is <= s,
the sampler's ``cost`` before the first fit. The cost each push planned with and the calibration's
state are part of ``state_dict()``, so a resume plans exactly as the uninterrupted run.
"""

from __future__ import annotations

import copy
import hashlib
import numbers
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

import wlb

from ._common import require_torch
from .calibration import OnlineCalibration, cost_model, parse_fit

_STATE_VERSION = 1
_COLUMNS = ("ids", "lengths", "pieces", "offsets")

Piece = Tuple[int, int, int]  # (document, offset, length)


def _columns(docs: Any) -> Dict[str, List[int]]:
    """A Documents / MicroBatch's pieces as plain int lists (picklable state)."""
    return {c: np.asarray(getattr(docs, c), dtype=np.int64).tolist() for c in _COLUMNS}


def _join(parts: Sequence[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    return {c: np.concatenate([np.asarray(p[c], dtype=np.int64) for p in parts] or
                              [np.zeros(0, np.int64)]) for c in _COLUMNS}


_FINGERPRINT_CHUNK = 1 << 26  # bytes of lengths hashed per task (64 MiB)


def corpus_fingerprint(lengths: np.ndarray) -> str:
    """A SHA-256 digest of the int64 lengths array (its bytes, little-endian), hashed in 64 MiB
    chunks on a thread pool (hashlib releases the GIL; SHA-256 runs on the CPU's SHA extensions
    where it has them: 2.1x BLAKE2b's speed on this project's machine) and the chunk digests
    hashed again with the count: any changed, added, removed or reordered length changes it,
    unlike a count and a sum. A memory-mapped array is read once, chunk by chunk, and an array of
    another integer dtype is converted to int64 one chunk at a time (no int64 copy of the whole
    corpus; cost: bench/python_fingerprint_bench.py)."""
    lengths = np.asarray(lengths)
    per_chunk = _FINGERPRINT_CHUNK // 8
    spans = range(0, len(lengths), per_chunk)

    def digest(start: int) -> bytes:
        part = np.ascontiguousarray(lengths[start:start + per_chunk], dtype="<i8")
        return hashlib.sha256(memoryview(part).cast("B")).digest()

    if len(spans) > 1:
        with ThreadPoolExecutor(max_workers=4) as pool:
            parts = list(pool.map(digest, spans))
    else:
        parts = [digest(start) for start in spans]
    top = hashlib.sha256(b"wlb-lengths\0" + len(lengths).to_bytes(8, "little"))
    for part in parts:
        top.update(part)
    return top.hexdigest()[:32]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_int(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
    """``value`` as an int in [low, high]; ValueError naming ``name`` and the value (a bool is
    not an integer here)."""
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


class PackedBatchSampler:
    """Yields this DP rank's micro-batches of packed steps (see the module docstring).

    ``lengths``: tokens per document (``dataset[i]`` has ``lengths[i]`` tokens). ``pp``, ``dp``,
    ``rank``: pipeline stages, data-parallel ranks and this rank. ``assign``: ``"model"`` (the
    1F1B step-time model of a (TP, CP, PP, DP) job of preset ``model``) or ``"round_robin"``
    (micro-batch k on rank k % DP, in order). ``calibration``: an ``OnlineCalibration`` whose fits
    replace ``cost`` as they come (module docstring). ``packer``: any of
    ``wlb.packer_names()``; the default, ``wlb-lookahead``, is the measured best
    (docs/results/pytorch/sampler_default.md). Other keyword arguments go to
    ``wlb.Packer`` (``micro_batches`` is PP x DP; ``cost`` defaults to ``model``).
    """

    def __init__(self, lengths: Any, *, pp: int, dp: int, rank: int, context: int,
                 packer: str = "wlb-lookahead", seed: int = 0, shuffle: bool = True,
                 assign: str = "model", model: str = "llama2-7b", tp: int = 1, cp: int = 1,
                 gemm_tflops: float = 500.0,
                 calibration: Optional[OnlineCalibration] = None, **packer_args):
        require_torch()
        lengths, empty, first_empty = _checked_lengths(lengths)
        self.empty_documents = empty  # skipped: no token to plan
        # The documents planned, when some are empty (None: all of them; no copy of the indices).
        self._planned: Optional[np.ndarray] = None
        if empty:
            self._planned = _nonzero_indices(lengths, len(lengths) - empty)
            warnings.warn(f"PackedBatchSampler: {empty} of {lengths.size} documents have no "
                          f"token (the first: document {first_empty}); they are skipped",
                          stacklevel=2)
        for name, value in (("pp", pp), ("dp", dp)):
            _check_int(name, value, 1, _MAX_MICRO_BATCHES)
        if not _is_int(rank) or not 0 <= rank < dp:
            raise ValueError(f"rank must be in [0, dp = {dp}), got {rank!r}")
        _check_int("seed", seed, 0)
        if not isinstance(shuffle, (bool, np.bool_)):
            raise ValueError(f"shuffle must be a bool, got {shuffle!r}")
        if assign not in ("model", "round_robin"):
            raise ValueError(f"assign must be 'model' or 'round_robin', got {assign!r}")
        if "micro_batches" in packer_args:
            raise TypeError("micro_batches is PP x DP; give pp and dp instead")
        if calibration is not None and not isinstance(calibration, OnlineCalibration):
            raise TypeError(f"calibration must be an OnlineCalibration, got {calibration!r}")
        if calibration is not None and dp > 1 and calibration.group is None:
            raise ValueError("with DP > 1 every rank must fit the same measurements: give the "
                             "OnlineCalibration a group (group='world' or a process group)")
        # The array as given (a memmap stays one): the sampler reads it chunk by chunk and holds
        # no per-document copy of it (module docstring, "Scale").
        self.lengths = lengths
        self._pieces: Optional[_EpochPieces] = None  # the epoch order, built once per epoch
        self.pp, self.dp, self.rank = pp, dp, rank
        self.seed, self.shuffle, self.assign = seed, shuffle, assign
        self._job = dict(model=model, tp=tp, cp=cp, pp=pp, dp=dp, gemm_tflops=gemm_tflops)
        packer_args.setdefault("cost", model)
        self._packer_args = dict(packer_args, name=packer, context=context, micro_batches=pp * dp)
        wlb.Packer(**self._packer_args)  # bad packer arguments fail here, not in the loader
        self._corpus_key = {"documents": len(self.lengths), "seed": seed, "shuffle": shuffle,
                            "packer": packer}
        self._fingerprint: Optional[str] = None  # corpus_fingerprint, hashed on first use
        self.calibration = calibration
        self._run_steps = 0  # steps given over the whole run (the calibration's step numbers)
        self.epoch = 0
        self._resume: Optional[Dict[str, Any]] = None
        self._state: Dict[str, Any] = self._start_state(self.epoch)
        self._live: Optional[Dict[str, Any]] = None

    def _corpus(self) -> Dict[str, Any]:
        """What a state must agree on to resume: the documents (their count and the fingerprint
        of their lengths), their order and the packer."""
        if self._fingerprint is None:
            self._fingerprint = corpus_fingerprint(self.lengths)
        return dict(self._corpus_key, lengths_sha256=self._fingerprint)

    @property
    def micro_batches(self) -> int:
        return self.pp * self.dp

    def set_epoch(self, epoch: int) -> None:
        """The next iteration plays epoch `epoch` (its own document order) from the start."""
        self.epoch = epoch
        self._resume = None
        self._state = self._start_state(epoch)

    def _start_state(self, epoch: int) -> Dict[str, Any]:
        return {"version": _STATE_VERSION, "epoch": epoch, "pp": self.pp, "dp": self.dp,
                "context": self._packer_args["context"], "corpus": self._corpus(), "steps": 0,
                "packer": None,
                "consumed": 0, "queued": _join([]), "step_in_push": 0, "micro_batch": 0,
                **self._calibration_entry(self._run_steps, None)}

    def _calibration_entry(self, run_steps: int, push: Any) -> Dict[str, Any]:
        """The state's "calibration" entry: steps given over the run, the cost of the push a
        resume redoes (``push``: {"step", "cost"}) and, filled in by state_dict(), the
        calibration's own state. Nothing without a calibration."""
        if self.calibration is None:
            return {}
        return {"calibration": {"run_steps": run_steps, "push": push, "state": None}}

    def _push_cost(self, run_step: int) -> Dict[str, Any]:
        return {"step": run_step, "cost": self.calibration.cost_for(run_step)}

    def _packer_for(self, packer: Any, cost: Optional[Dict[str, Any]]) -> Any:
        """A packer planning with `cost` (None: the sampler's own) that holds `packer`'s state."""
        args = dict(self._packer_args)
        if cost is not None:
            args["cost"] = cost_model(cost)
        fresh = wlb.Packer(**args)
        fresh.load_state_dict(packer.state_dict())
        return fresh

    # ---- planning -----------------------------------------------------------------------------

    def _epoch_pieces(self, epoch: int) -> "_EpochPieces":
        """Epoch `epoch`'s pieces, as a stream over its document order (kept for the epoch)."""
        if self._pieces is None or self._pieces.epoch != epoch:
            self._pieces = None  # free the last epoch's order before making the next
            count = len(self.lengths) if self._planned is None else len(self._planned)
            order = np.arange(count, dtype=_index_dtype(len(self.lengths)))
            if self.shuffle:  # the order of Generator.permutation(count), at 4 bytes a document
                np.random.default_rng([self.seed, epoch]).shuffle(order)
            if self._planned is not None:
                for start in range(0, count, _SCAN_CHUNK):
                    part = order[start:start + _SCAN_CHUNK]
                    part[:] = self._planned[part]
            self._pieces = _EpochPieces(epoch, self.lengths, order, self._packer_args["context"])
        return self._pieces

    def _assignment(self, step: Any) -> List[List[int]]:
        """Each DP rank's micro-batch indices, in run order."""
        if self.assign == "round_robin":
            return [list(range(r, len(step.micro_batches), self.dp)) for r in range(self.dp)]
        forward, backward = wlb.micro_batch_stage_times(
            [mb.lengths for mb in step.micro_batches], **self._job)
        return wlb.assign_dp_ranks(forward, backward, self.pp, self.dp)["ranks"]

    def steps(self) -> Iterator[Tuple[Any, List[List[int]]]]:
        """Every global step of the (resumed) epoch: (wlb.StepPlan, each rank's indices)."""
        for step, ranks, _ in self._plan():
            yield step, ranks

    def _plan(self) -> Iterator[Tuple[Any, List[List[int]], int]]:
        state = self._resume if self._resume is not None else self._start_state(self.epoch)
        self._resume = None
        pieces = self._epoch_pieces(state["epoch"])
        packer = wlb.Packer(**self._packer_args)
        cursor = pieces.seek(state["consumed"])
        elastic = (state["pp"], state["dp"]) != (self.pp, self.dp)
        if state["packer"] is not None and not elastic:
            packer.load_state_dict(state["packer"])
        queued = state["queued"]
        skip_steps, skip_mbs = (0, 0) if elastic else (state["step_in_push"], state["micro_batch"])
        calibrated = state.get("calibration")
        # The run's number of the epoch's step 0, and the cost of the push a resume redoes.
        base = calibrated["run_steps"] - state["steps"] if calibrated else 0
        redo = calibrated["push"] if calibrated and not elastic else None
        cost_key: Any = "own"
        # Steps finished before the first one yielded here: a state saved after its step's last
        # micro-batch counts that step, which is yielded again (with nothing left to give).
        steps = state["steps"] - (1 if not elastic and state["micro_batch"] == self.pp else 0)
        tokens_per_step = self._packer_args["context"] * self.micro_batches
        while True:
            before = {"packer": packer.state_dict(), "consumed": cursor.piece, "queued": queued}
            if self.calibration is not None:
                # This push plans with the cost of the first step it can return.
                push = redo if redo is not None else self._push_cost(base + steps)
                redo = None
                key = push["cost"]["from_step"] if push["cost"] is not None else "own"
                if key != cost_key:
                    packer, cost_key = self._packer_for(packer, push["cost"]), key
                before["push"] = push
            ready, cursor, final = _push(packer, pieces, cursor, queued, tokens_per_step)
            queued = _join([])
            for index, step in enumerate(ready):
                if index < skip_steps:
                    continue
                ranks = self._assignment(step)
                self._live = {"before": before, "ready": ready, "index": index, "packer": packer,
                              "consumed": cursor.piece, "epoch": state["epoch"], "steps": steps,
                              "base": base}
                yield step, ranks, skip_mbs if index == skip_steps else 0
                steps += 1
            skip_steps, skip_mbs = 0, 0
            if final:
                return

    def __iter__(self) -> Iterator[List[Piece]]:
        for step, ranks, skip in self._plan():
            mine = ranks[self.rank]
            for position in range(skip, len(mine)):
                mb = step.micro_batches[mine[position]]
                self._record(position + 1, len(mine))
                yield list(zip(mb.ids.tolist(), mb.offsets.tolist(), mb.lengths.tolist()))
        self._live = None

    def __len__(self) -> int:
        raise TypeError("PackedBatchSampler plans as it goes; its length is known only at the end")

    # ---- state --------------------------------------------------------------------------------

    def _record(self, given: int, per_rank: int) -> None:
        live = self._live
        done = given == per_rank  # this rank finished the step (every rank has, in lockstep)
        self._run_steps = live["base"] + live["steps"] + (1 if done else 0)
        self._state = {
            "version": _STATE_VERSION, "epoch": live["epoch"], "pp": self.pp, "dp": self.dp,
            "context": self._packer_args["context"], "corpus": self._corpus(),
            "steps": live["steps"] + (1 if done else 0),
            # Exact resume (same PP, DP): redo the push, skip what was given.
            "packer": live["before"]["packer"], "consumed": live["before"]["consumed"],
            "queued": live["before"]["queued"], "step_in_push": live["index"],
            "micro_batch": given,
            # Elastic resume (other DP): what is not trained yet, then the rest of the epoch.
            # Kept as plan objects here and turned into columns only when a state is taken.
            "elastic_consumed": live["consumed"],
            "elastic_queued": (live["ready"][live["index"] + (1 if done else 0):],
                               live["packer"].pending),
            **self._calibration_entry(self._run_steps, live["before"].get("push")),
        }

    def state_dict(self) -> Dict[str, Any]:
        """Where iteration stands after the last micro-batch it gave."""
        state = dict(self._state)
        queued = state.get("elastic_queued")
        if isinstance(queued, tuple):
            steps, pending = queued
            state["elastic_queued"] = _join(
                [_columns(mb) for step in steps for mb in step.micro_batches] + [_columns(pending)])
        state = copy.deepcopy(state)
        if self.calibration is not None:
            # Never waits for the GPU: a StatefulDataLoader with workers calls this at dispatch.
            state["calibration"]["state"] = self.calibration.state_dict(wait=False)
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next iteration resumes after the micro-batch this state was taken at; a state of
        another DP size resumes elastically (see the module docstring).

        Every field is checked against this sampler's corpus (the fingerprint of its lengths)
        and the plan the state implies before anything changes, and a bad one is a ValueError
        naming it: types and ranges; every queued piece inside its document, cut at S as the
        epoch cuts it, already arrived and held once; the push the state was taken in is
        replayed, so its step and micro-batch must exist and its elastic part must be exactly
        what that push leaves untrained."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"PackedBatchSampler state must be a dict with version "
                             f"{_STATE_VERSION}, got "
                             f"{state.get('version') if isinstance(state, dict) else state!r}")
        state = _validate_state(self, copy.deepcopy(state))
        self._load_calibration(state)
        if state["dp"] != self.dp and "elastic_queued" in state:
            # What is not trained yet, as the queue of a state before its first micro-batch at
            # this DP (it validates as one if it is saved again before iterating).
            state.update(packer=None, consumed=state["elastic_consumed"], dp=self.dp,
                         queued=state["elastic_queued"], step_in_push=0, micro_batch=0)
            del state["elastic_consumed"], state["elastic_queued"]
        self.epoch = state["epoch"]
        self._resume = state
        self._state = state
        if self.calibration is not None:
            self._run_steps = state["calibration"]["run_steps"]

    def _check_calibration_entry(self, state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Checks the state's "calibration" entry (ValueError naming the field; nothing changes)
        and returns the fitted cost its push planned with (None: the sampler's own cost)."""
        entry = state.get("calibration")
        if self.calibration is None or entry is None:
            if self.calibration is not None or entry is not None:
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

    def _load_calibration(self, state: Dict[str, Any]) -> None:
        """Loads the state's calibration state (its entry checked by _check_calibration_entry),
        unless the calibration already holds one that continues it (one saved at a checkpoint,
        when a StatefulDataLoader with workers took the sampler's state ahead of training)."""
        if self.calibration is None:
            return
        self._check_calibration_entry(state)
        run_steps = state["calibration"]["run_steps"]
        held = self.calibration
        saved = state["calibration"]["state"]
        if held.steps_ended == run_steps and held.continues(saved):
            return  # the calibration loaded from the checkpoint carries this state further
        probe = OnlineCalibration(refit_every=held.refit_every, window=held.window,
                                  delay=held.delay, min_samples=held.min_samples)
        probe.load_state_dict(saved)  # ValueError naming the field
        if probe.steps_ended != run_steps:
            raise ValueError(
                f"state 'calibration.state.steps_ended' is {probe.steps_ended}, but the sampler "
                f"resumes after {run_steps} steps: the sampler's state was taken ahead of "
                f"training (a StatefulDataLoader with workers takes it when it dispatches a "
                f"micro-batch). Load the calibration saved at the checkpoint "
                f"(calibration.load_state_dict) before loading the loader's state")
        held.load_state_dict(saved)


_MAX_MICRO_BATCHES = 4096  # N = PP x DP (wlb/core/limits.hpp kMaxMicroBatches)
_MAX_COUNTER = 1 << 40  # epochs and steps in a state (kMaxStateCounter)
_STATE_KEYS = {"version", "epoch", "pp", "dp", "context", "corpus", "steps", "packer", "consumed",
               "queued", "step_in_push", "micro_batch"}
_ELASTIC_KEYS = {"elastic_consumed", "elastic_queued"}


_SCAN_CHUNK = 1 << 22  # documents per chunk of a scan over the corpus (bounded temporaries)


def _index_dtype(count: int) -> type:
    """The dtype of document indices into a corpus of `count` documents: 4 bytes while they fit."""
    return np.uint32 if count <= np.iinfo(np.uint32).max else np.int64


def _checked_lengths(lengths: Any) -> Tuple[np.ndarray, int, Optional[int]]:
    """Document lengths range-checked before any conversion, chunk by chunk (no whole-corpus
    temporaries): a 1-D integer array (no bools, no floats), every length >= 0 (empty documents
    are skipped) and within int64 as given (an unsigned length above int64 is named as given,
    not wrapped), and their sum within int64. Returns the array as given (no copy: a memmap
    stays one; a list becomes int64), the number of empty documents and the first of them."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and (not np.issubdtype(lengths.dtype, np.integer) or
                                               lengths.dtype == np.bool_)):
        raise TypeError(f"lengths must be a 1-D integer array, got {lengths.dtype} with shape "
                        f"{lengths.shape}")
    if lengths.size == 0:
        return lengths.astype(np.int64), 0, None
    limit = np.iinfo(np.int64).max
    total, empty, first_empty = 0, 0, None
    for start in range(0, len(lengths), _SCAN_CHUNK):
        part = lengths[start:start + _SCAN_CHUNK]
        if lengths.dtype == np.uint64:
            big = np.flatnonzero(part > np.uint64(limit))
            if big.size:
                raise ValueError(f"document {start + int(big[0])} has length "
                                 f"{int(part[big[0]])}, above the int64 limit {limit}")
        part = part.astype(np.int64, copy=False)
        bad = np.flatnonzero(part < 0)
        if bad.size:
            raise ValueError(f"document {start + int(bad[0])} has length {int(part[bad[0]])}; "
                             "lengths must be >= 0")
        zeros = np.flatnonzero(part == 0)
        if zeros.size and first_empty is None:
            first_empty = start + int(zeros[0])
        empty += int(zeros.size)
        top = int(part.max())
        total += int(part.sum()) if top <= limit // len(part) else sum(int(x) for x in part)
        if total > limit:
            raise ValueError(f"the lengths add up to more than {limit} tokens")
    return lengths, empty, first_empty


def _nonzero_indices(lengths: np.ndarray, count: int) -> np.ndarray:
    """The indices of the `count` non-empty documents, filled chunk by chunk (4 bytes each while
    the corpus has under 2^32 documents)."""
    out = np.empty(count, dtype=_index_dtype(len(lengths)))
    at = 0
    for start in range(0, len(lengths), _SCAN_CHUNK):
        hit = np.flatnonzero(lengths[start:start + _SCAN_CHUNK] != 0)
        out[at:at + hit.size] = hit + start
        at += hit.size
    return out


class _Cursor(NamedTuple):
    """A position in an epoch's pieces: before piece `piece` of the epoch (the state's
    "consumed"), which is piece `part` of the document at position `doc` of the epoch's order
    and starts at token `token` of the epoch."""
    piece: int
    doc: int
    part: int
    token: int


class _EpochPieces:
    """An epoch's pieces (its documents in `order`, cut at S as wlb.make_documents cuts them),
    made on demand from a cursor: the sampler holds the order (4 or 8 bytes a document) and the
    pieces of the steps in flight, never the whole epoch's pieces."""

    def __init__(self, epoch: int, lengths: np.ndarray, order: np.ndarray, context: int):
        self.epoch, self.lengths, self.order, self.context = epoch, lengths, order, context
        self._want = 64  # documents to cut per take; adapts to the documents a step holds
        self._known: Dict[int, _Cursor] = {0: _Cursor(0, 0, 0, 0)}

    def __len__(self) -> int:
        return len(self.order)

    def _lengths(self, start: int, stop: int) -> np.ndarray:
        return self.lengths[self.order[start:stop]].astype(np.int64)

    def seek(self, consumed: int) -> _Cursor:
        """The cursor before piece `consumed` (scanning the order chunk by chunk from the start,
        once per distinct value). ValueError naming the value past the epoch's last piece."""
        if consumed in self._known:
            return self._known[consumed]
        piece = token = doc = 0
        while doc < len(self.order):
            lengths = self._lengths(doc, doc + _SCAN_CHUNK)
            counts = np.cumsum(-(-lengths // self.context))
            if piece + int(counts[-1]) <= consumed:
                piece += int(counts[-1])
                token += int(lengths.sum())
                doc += len(lengths)
                continue
            j = int(np.searchsorted(counts, consumed - piece, side="right"))
            part = consumed - piece - (int(counts[j - 1]) if j else 0)
            cursor = _Cursor(consumed, doc + j, part, token + int(lengths[:j].sum()) +
                             part * self.context)
            break
        else:
            if consumed != piece:
                raise ValueError(f"state 'consumed' must be an integer [0, {piece}], "
                                 f"got {consumed!r}")
            cursor = _Cursor(consumed, doc, 0, token)
        if len(self._known) > 8:
            self._known = {0: self._known[0]}
        self._known[consumed] = cursor
        return cursor

    def take(self, cursor: _Cursor, tokens: int) -> Tuple[Dict[str, np.ndarray], _Cursor]:
        """The pieces from `cursor` whose first token lies before cursor.token + `tokens` (as
        wlb.split_into_steps assigns a piece to the step of its first token), and the cursor
        after them."""
        limit = cursor.token + tokens
        parts: List[Dict[str, np.ndarray]] = []
        piece, doc, part, token = cursor
        first_doc = doc
        while doc < len(self.order) and token < limit:
            count = min(len(self.order) - doc, self._want)
            cut = wlb.make_documents(self._lengths(doc, doc + count), self.context)
            columns = {c: np.asarray(getattr(cut, c), dtype=np.int64)[part:] for c in _COLUMNS}
            starts = token + np.cumsum(columns["lengths"]) - columns["lengths"]
            k = int(np.searchsorted(starts, limit, side="left"))
            rows = {c: columns[c][:k] for c in _COLUMNS}
            rows["ids"] = self.order[doc + rows["ids"]].astype(np.int64)
            parts.append(rows)
            piece += k
            if k < len(starts):
                doc, part, token = doc + int(columns["ids"][k]), int(columns["pieces"][k]), \
                    int(starts[k])
                break
            doc, part = doc + count, 0
            token = int(starts[-1] + columns["lengths"][-1]) if len(starts) else token
            self._want = min(2 * self._want, _SCAN_CHUNK)
        self._want = max(64, min(_SCAN_CHUNK, 2 * (doc - first_doc + 1)))
        return _join(parts), _Cursor(piece, doc, part, token)

    def arrived(self, cursor: _Cursor, ids: np.ndarray, pieces: np.ndarray) -> np.ndarray:
        """Whether each (document, piece) lies before `cursor` in the epoch (a scan of the order
        up to the cursor's document, chunk by chunk)."""
        position: Dict[int, int] = {}
        wanted = np.unique(ids)
        stop = min(cursor.doc + 1, len(self.order))
        for start in range(0, stop, _SCAN_CHUNK):
            chunk = self.order[start:min(start + _SCAN_CHUNK, stop)]
            for h in np.flatnonzero(np.isin(chunk, wanted)).tolist():
                position[int(chunk[h])] = start + h
        out = np.zeros(len(ids), dtype=bool)
        for row in range(len(ids)):
            at = position.get(int(ids[row]))
            out[row] = at is not None and (at < cursor.doc or
                                          (at == cursor.doc and int(pieces[row]) < cursor.part))
        return out


def _push(packer: Any, pieces: _EpochPieces, cursor: _Cursor, queued: Dict[str, Any],
          tokens_per_step: int) -> Tuple[List[Any], _Cursor, bool]:
    """One planning push (``_plan``'s, and the state check's replay of it): the queued pieces,
    then the pieces arriving in the next N x S tokens (a piece arrives in the step its first
    token lies in, as wlb.split_into_steps); at the end of the epoch, the packer's flush.
    Returns (ready steps, the cursor after the pieces taken, whether it was the flush)."""
    taken, end = pieces.take(cursor, tokens_per_step)
    arrivals = _join([queued, taken])
    final = len(arrivals["ids"]) == 0
    ready = packer.flush() if final else packer.push(wlb.Documents(**arrivals))
    return ready, end, final


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
    push_cost = sampler._check_calibration_entry(state)
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
