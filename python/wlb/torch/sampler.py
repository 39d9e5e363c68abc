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
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import wlb

from ._common import require_torch

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
    (micro-batch k on rank k % DP, in order). Other keyword arguments go to ``wlb.Packer``
    (``micro_batches`` is PP x DP; ``cost`` defaults to ``model``).
    """

    def __init__(self, lengths: Any, *, pp: int, dp: int, rank: int, context: int,
                 packer: str = "wlb", seed: int = 0, shuffle: bool = True, assign: str = "model",
                 model: str = "llama2-7b", tp: int = 1, cp: int = 1, gemm_tflops: float = 500.0,
                 **packer_args):
        require_torch()
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
            raise TypeError(f"lengths must be a 1-D integer array, got {lengths.dtype} with shape "
                            f"{lengths.shape}")
        bad = np.flatnonzero(lengths < 0)
        if bad.size:
            raise ValueError(f"document {int(bad[0])} has length {int(lengths[bad[0]])}; lengths "
                             "must be >= 0")
        empty = np.flatnonzero(lengths == 0)
        self.empty_documents = int(empty.size)  # skipped: no token to plan
        # The documents planned, when some are empty (None: all of them; no copy of the indices).
        self._planned: Optional[np.ndarray] = None
        if empty.size:
            self._planned = np.flatnonzero(lengths != 0)
            warnings.warn(f"PackedBatchSampler: {empty.size} of {lengths.size} documents have no "
                          f"token (the first: document {int(empty[0])}); they are skipped",
                          stacklevel=2)
        for name, value in (("pp", pp), ("dp", dp)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(rank, int) or not 0 <= rank < dp:
            raise ValueError(f"rank must be in [0, dp = {dp}), got {rank!r}")
        if assign not in ("model", "round_robin"):
            raise ValueError(f"assign must be 'model' or 'round_robin', got {assign!r}")
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
                "consumed": 0, "queued": _join([]), "step_in_push": 0, "micro_batch": 0}

    # ---- planning -----------------------------------------------------------------------------

    def _epoch_pieces(self, epoch: int) -> Dict[str, np.ndarray]:
        count = len(self.lengths) if self._planned is None else len(self._planned)
        order = (np.random.default_rng([self.seed, epoch]).permutation(count)
                 if self.shuffle else np.arange(count))
        if self._planned is not None:
            order = self._planned[order]
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
        tokens_per_step = self._packer_args["context"] * self.micro_batches
        total = len(pieces["ids"])
        while True:
            before = {"packer": packer.state_dict(), "consumed": consumed, "queued": queued}
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
                self._live = {"before": before, "ready": ready, "index": index, "packer": packer,
                              "consumed": consumed, "epoch": state["epoch"], "steps": steps}
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
        }

    def state_dict(self) -> Dict[str, Any]:
        """Where iteration stands after the last micro-batch it gave."""
        state = dict(self._state)
        queued = state.get("elastic_queued")
        if isinstance(queued, tuple):
            steps, pending = queued
            state["elastic_queued"] = _join(
                [_columns(mb) for step in steps for mb in step.micro_batches] + [_columns(pending)])
        return copy.deepcopy(state)

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
        if state["dp"] != self.dp and "elastic_queued" in state:
            state.update(packer=None, consumed=state["elastic_consumed"],
                         queued=state["elastic_queued"], step_in_push=0, micro_batch=0)
        elif state["packer"] is not None:
            wlb.Packer(**self._packer_args).load_state_dict(state["packer"])  # rejects a bad blob
        self.epoch = state["epoch"]
        self._resume = state
        self._state = state
