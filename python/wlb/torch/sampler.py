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
into pieces of at most S tokens). An epoch is the documents in a seeded random order (``shuffle``),
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

Online calibration. ``calibration=OnlineCalibration(...)`` (``wlb.torch.calibration``) replaces the
cost with fits of the micro-batch times the training loop measures: step s (counted from the first
step this sampler planned, across epochs) is planned with the last fit whose first step is <= s,
the sampler's ``cost`` before the first fit. The cost each push planned with and the calibration's
state are part of ``state_dict()``, so a resume plans exactly as the uninterrupted run.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

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


class PackedBatchSampler:
    """Yields this DP rank's micro-batches of packed steps (see the module docstring).

    ``lengths``: tokens per document (``dataset[i]`` has ``lengths[i]`` tokens). ``pp``, ``dp``,
    ``rank``: pipeline stages, data-parallel ranks and this rank. ``assign``: ``"model"`` (the
    1F1B step-time model of a (TP, CP, PP, DP) job of preset ``model``) or ``"round_robin"``
    (micro-batch k on rank k % DP, in order). ``calibration``: an ``OnlineCalibration`` whose fits
    replace ``cost`` as they come (module docstring). Other keyword arguments go to
    ``wlb.Packer`` (``micro_batches`` is PP x DP; ``cost`` defaults to ``model``).
    """

    def __init__(self, lengths: Any, *, pp: int, dp: int, rank: int, context: int,
                 packer: str = "wlb", seed: int = 0, shuffle: bool = True, assign: str = "model",
                 model: str = "llama2-7b", tp: int = 1, cp: int = 1, gemm_tflops: float = 500.0,
                 calibration: Optional[OnlineCalibration] = None, **packer_args):
        require_torch()
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
            raise TypeError(f"lengths must be a 1-D integer array, got {lengths.dtype} with shape "
                            f"{lengths.shape}")
        bad = np.flatnonzero(lengths < 1)
        if bad.size:
            raise ValueError(f"document {int(bad[0])} has length {int(lengths[bad[0]])}; lengths "
                             "must be >= 1")
        for name, value in (("pp", pp), ("dp", dp)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(rank, int) or not 0 <= rank < dp:
            raise ValueError(f"rank must be in [0, dp = {dp}), got {rank!r}")
        if assign not in ("model", "round_robin"):
            raise ValueError(f"assign must be 'model' or 'round_robin', got {assign!r}")
        if calibration is not None and not isinstance(calibration, OnlineCalibration):
            raise TypeError(f"calibration must be an OnlineCalibration, got {calibration!r}")
        if calibration is not None and dp > 1 and calibration.group is None:
            raise ValueError("with DP > 1 every rank must fit the same measurements: give the "
                             "OnlineCalibration a group (group='world' or a process group)")
        if "micro_batches" in packer_args:
            raise TypeError("micro_batches is PP x DP; give pp and dp instead")
        self.lengths = lengths.astype(np.int64)
        self.pp, self.dp, self.rank = pp, dp, rank
        self.seed, self.shuffle, self.assign = seed, shuffle, assign
        self._job = dict(model=model, tp=tp, cp=cp, pp=pp, dp=dp, gemm_tflops=gemm_tflops)
        packer_args.setdefault("cost", model)
        self._packer_args = dict(packer_args, name=packer, context=context, micro_batches=pp * dp)
        wlb.Packer(**self._packer_args)  # bad packer arguments fail here, not in the loader
        self._corpus_key = {"documents": len(self.lengths), "tokens": int(self.lengths.sum()),
                            "seed": seed, "shuffle": shuffle, "packer": packer}
        self.calibration = calibration
        self._run_steps = 0  # steps given over the whole run (the calibration's step numbers)
        self.epoch = 0
        self._resume: Optional[Dict[str, Any]] = None
        self._state: Dict[str, Any] = self._start_state(self.epoch)
        self._live: Optional[Dict[str, Any]] = None

    def _corpus(self) -> Dict[str, Any]:
        """What a state must agree on to resume: the documents, their order and the packer."""
        return dict(self._corpus_key)

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

    def _epoch_pieces(self, epoch: int) -> Dict[str, np.ndarray]:
        order = (np.random.default_rng([self.seed, epoch]).permutation(len(self.lengths))
                 if self.shuffle else np.arange(len(self.lengths)))
        pieces = wlb.make_documents(self.lengths[order], self._packer_args["context"])
        out = {c: np.asarray(getattr(pieces, c), dtype=np.int64) for c in _COLUMNS}
        out["ids"] = order[out["ids"]].astype(np.int64)
        out["starts"] = np.concatenate([[0], np.cumsum(out["lengths"])]).astype(np.int64)
        return out

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
        elastic = (state["pp"], state["dp"]) != (self.pp, self.dp)
        if state["packer"] is not None and not elastic:
            packer.load_state_dict(state["packer"])
        consumed, queued = state["consumed"], state["queued"]
        skip_steps, skip_mbs = (0, 0) if elastic else (state["step_in_push"], state["micro_batch"])
        steps = state["steps"]
        calibrated = state.get("calibration")
        # The run's number of the epoch's step 0, and the cost of the push a resume redoes.
        base = calibrated["run_steps"] - steps if calibrated else 0
        redo = calibrated["push"] if calibrated and not elastic else None
        cost_key: Any = "own"
        tokens_per_step = self._packer_args["context"] * self.micro_batches
        total = len(pieces["ids"])
        while True:
            before = {"packer": packer.state_dict(), "consumed": consumed, "queued": queued}
            if self.calibration is not None:
                # This push plans with the cost of the first step it can return.
                push = redo if redo is not None else self._push_cost(base + steps)
                redo = None
                key = push["cost"]["from_step"] if push["cost"] is not None else "own"
                if key != cost_key:
                    packer, cost_key = self._packer_for(packer, push["cost"]), key
                before["push"] = push
            # A piece arrives in the step its first token lies in (as wlb.split_into_steps).
            end = min(total, int(np.searchsorted(
                pieces["starts"], pieces["starts"][consumed] + tokens_per_step, side="left")))
            arrivals = _join([queued, {c: pieces[c][consumed:end] for c in _COLUMNS}])
            final = len(arrivals["ids"]) == 0
            ready = packer.flush() if final else packer.push(wlb.Documents(**arrivals))
            consumed, queued = end, _join([])
            for index, step in enumerate(ready):
                if index < skip_steps:
                    continue
                ranks = self._assignment(step)
                if index == skip_steps and skip_mbs == len(ranks[self.rank]):
                    steps -= 1  # a resumed state counts its fully given step already
                self._live = {"before": before, "ready": ready, "index": index, "packer": packer,
                              "consumed": consumed, "epoch": state["epoch"], "steps": steps,
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
        another DP size resumes elastically (see the module docstring)."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"PackedBatchSampler state must be a dict with version "
                             f"{_STATE_VERSION}, got "
                             f"{state.get('version') if isinstance(state, dict) else state!r}")
        if state["context"] != self._packer_args["context"] or state["pp"] != self.pp:
            raise ValueError(f"the state was saved with context {state['context']} and PP "
                             f"{state['pp']}; this sampler has context "
                             f"{self._packer_args['context']} and PP {self.pp} (only DP may change)")
        if state.get("corpus") != self._corpus():
            raise ValueError(f"the state was saved for {state.get('corpus')}; this sampler has "
                             f"{self._corpus()}")
        state = copy.deepcopy(state)
        self._load_calibration(state)
        if state["dp"] != self.dp and "elastic_queued" in state:
            state.update(packer=None, consumed=state["elastic_consumed"],
                         queued=state["elastic_queued"], step_in_push=0, micro_batch=0)
        elif state["packer"] is not None:
            wlb.Packer(**self._packer_args).load_state_dict(state["packer"])  # rejects a bad blob
        self.epoch = state["epoch"]
        self._resume = state
        self._state = state
        if self.calibration is not None:
            self._run_steps = state["calibration"]["run_steps"]

    def _load_calibration(self, state: Dict[str, Any]) -> None:
        """Checks the state's "calibration" entry and loads its calibration state, unless the
        calibration already holds one that continues it (one saved at a checkpoint, when a
        StatefulDataLoader with workers took the sampler's state ahead of training)."""
        entry = state.get("calibration")
        if self.calibration is None or entry is None:
            if self.calibration is not None or entry is not None:
                raise ValueError(
                    "state 'calibration': the state was saved " +
                    ("without" if entry is None else "with") + " an OnlineCalibration and this "
                    "sampler has " + ("one" if entry is None else "none"))
            return
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
        held = self.calibration
        saved = entry["state"]
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
