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
arriving N x S tokens per step (a piece arrives in the step its first token lies in, as in
``wlb.split_into_steps``, but each step's N x S tokens are counted from the end of the previous
step's last piece, not from fixed multiples of N x S, so every step but the last holds at least
N x S tokens and the two cuts drift apart over an epoch); call ``set_epoch(e)`` before
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
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

import wlb

from ._common import require_torch
from .calibration import OnlineCalibration, cost_model
from .epoch_pieces import (_checked_lengths, _columns, _epoch_order, _EpochPieces, _join,
                           _nonzero_indices, _push)
from .sampler_state import (_check_calibration_entry, _check_int, _is_int, _MAX_MICRO_BATCHES,
                            _STATE_VERSION, _validate_state)

Piece = Tuple[int, int, int]  # (document, offset, length)


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
            order = _epoch_order(count, len(self.lengths), self.seed, epoch, self.shuffle,
                                 self._planned)
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
    def _load_calibration(self, state: Dict[str, Any]) -> None:
        """Loads the state's calibration state (its entry checked by _check_calibration_entry),
        unless the calibration already holds one that continues it (one saved at a checkpoint,
        when a StatefulDataLoader with workers took the sampler's state ahead of training)."""
        if self.calibration is None:
            return
        _check_calibration_entry(self, state)
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
