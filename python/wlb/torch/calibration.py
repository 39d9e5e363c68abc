"""``OnlineCalibration``: the packer's cost, fitted to the micro-batch times training measures.

The training loop times each micro-batch's forward + backward and says where each step ends; every
``refit_every`` steps the cost is refitted (``wlb.fit_micro_batch_cost``: ms = a * sum d^2 +
b * sum d + c * documents + per_call) to the last ``window`` steps' measurements, and
``PackedBatchSampler`` plans with it from step ``T + 1 + delay`` on, T the step at whose end the
fit was made:

    calibration = OnlineCalibration(refit_every=10, window=50, device="cuda")
    sampler = PackedBatchSampler(lengths, pp=4, dp=1, rank=0, context=S, packer="wlb-lookahead",
                                 calibration=calibration)
    for i, mb in enumerate(StatefulDataLoader(pieces, batch_sampler=sampler, ...)):
        with calibration.measure(mb):                   # this micro-batch (its document lengths)
            model(mb).backward()
        if (i + 1) % 4 == 0:                              # the step's PP micro-batches are done
            optimizer.step()
            calibration.end_step()

``measure`` and ``record`` take a micro-batch's document lengths or the batch itself: a
``PackedCollate`` batch (its ``lengths``) or a ``PackedCollate(format="hf")`` one (the lengths
from its ``cu_seq_lens_q``). ``attention`` is the fit's attention family
(``wlb.CostModel.attention_families()``): ``"per-document"`` (a * sum d^2: varlen kernels) or
``"dense"`` (a * T^2 of the micro-batch's T tokens: sdpa / eager over a packed mask;
``wlb.torch.hf.attention_family(model)`` says which a transformers model runs).

Timing. On a CUDA device a measurement is a pair of CUDA events on the current stream, read one
step late: ``end_step()`` of step T reads the events of step T - 1 (waiting on the last of them,
which the GPU finished while the CPU queued step T), so nothing waits on the step being run. On
the CPU it is ``time.perf_counter`` around the block (the block's work is done when it returns);
the times still join the fit one step late, so both devices follow one rule. ``record(lengths,
ms)`` adds a time measured elsewhere (a profiler, or fixed times in a test) by the same rule.

The policy. Step T's measurements join the window at the end of step T + 1. When the count of
ended steps E = T + 1 is a multiple of ``refit_every``, the window holds the measurements of steps
T - window .. T - 1 (fewer at the start) and is fitted; with fewer than ``min_samples``
measurements, or when the fit is refused (``ValueError``: e.g. every micro-batch alike), the
previous cost stays and ``refits_skipped`` counts it. A fit made at the end of step T is the cost
of every step numbered T + 1 + ``delay`` or later (steps counted from the first step this sampler
planned, across epochs); before the first fit, the sampler's own ``cost`` applies. One push of the
packer plans with the cost of the first step it can return (a push that returns several steps,
as the flush at an epoch's end, plans them all with that cost).

Prefetching. A DataLoader asks the sampler for micro-batches ahead of training: ``num_workers x
prefetch_factor`` of them with workers, none with ``num_workers = 0``. The sampler plans step s
when the loader asks for its first micro-batch, and refuses (``RuntimeError``) to plan it before
training has ended step s - 1 - delay, since a fit that changes its cost could still come. So
``delay = 0`` fits a loader without workers; with workers give ``delay >= ceil(num_workers x
prefetch_factor / PP)``. Which step uses which fit is thus fixed by step numbers alone, never by
timing, and a resume plans exactly as the uninterrupted run.

State. ``state_dict()`` holds the measurements (those not read yet included: taking it on CUDA
waits for them), the window, the fits still in use and the counters; ``PackedBatchSampler``'s
``state_dict()`` holds it too, without waiting (a CUDA measurement still running is left out and
counted, and then only a calibration loaded from the checkpoint can resume it). torchdata's
``StatefulDataLoader`` with workers takes the sampler's state when it dispatches a micro-batch,
ahead of training, so that copy misses the last steps' measurements: save
``calibration.state_dict()`` beside the loader's state and load it before the loader's (the
sampler keeps a loaded calibration that continues the one in its state; it refuses a state whose
calibration ended another number of steps than the sampler gave).

Several processes planning one job (DP ranks, pipeline stages) must fit the same measurements, or
their plans differ: give ``group`` (a ``torch.distributed`` process group of all of them, or
``"world"``); each refit then gathers the measurements every process read since the last refit
(``all_gather_object``, rank order), once every ``refit_every`` steps.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

import wlb

from .._checks import describe, integer, real
from ._common import require_torch, torch
from .calibration_state import _CONFIG, _COST_FIELDS, _MAX_STEP, _parse_state, _STATE_VERSION

_MAX_LENGTH = 2**24  # the fit's limit on a document's length (kMaxContext)


# A measurement as the state holds it: [step, [lengths...], ms].
Sample = List[Any]


def _lengths_of(lengths: Any) -> List[int]:
    """A micro-batch's document lengths as ints ([] for an empty micro-batch: not measured), from
    the lengths or a PackedCollate batch (varlen: its "lengths"; hf: its "cu_seq_lens_q")."""
    if isinstance(lengths, dict):
        if "lengths" in lengths:
            lengths = lengths["lengths"]
        elif "cu_seq_lens_q" in lengths:
            cu = lengths["cu_seq_lens_q"]
            cu = cu.detach().cpu().numpy() if torch is not None and isinstance(
                cu, torch.Tensor) else np.asarray(cu)
            lengths = np.diff(cu.astype(np.int64))
        else:
            raise ValueError(f"a measured batch must be a PackedCollate batch (with 'lengths' or "
                             f"'cu_seq_lens_q'), got keys {sorted(map(str, lengths))}")
    if torch is not None and isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    array = np.asarray(lengths)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"a measured micro-batch's lengths must be a 1-D integer array, got "
                         f"{array.dtype} with shape {array.shape}")
    if array.size == 0:
        return []
    # Checked as Python ints before any conversion: a uint64 above 2^63 must not wrap negative.
    for bad in (int(array.min()), int(array.max())):
        if not 1 <= bad <= _MAX_LENGTH:
            raise ValueError(f"a measured micro-batch has a document of length {bad} "
                             f"({array.dtype}); lengths must be in [1, {_MAX_LENGTH}]")
    return array.astype(np.int64).tolist()


def _check_ms(ms: Any) -> float:
    return real("a measured time (a finite number of ms > 0)", ms, 0.0, low_open=True)


def _check_group(group: Any) -> Any:
    """None, "world" or a torch.distributed process group; anything else is refused now, not at
    the first refit's gather."""
    if group is None or (isinstance(group, str) and group == "world"):
        return group
    import torch.distributed as dist  # only where a group is given
    if not dist.is_available() or not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be None, 'world' or a torch.distributed process group, got "
                        f"{describe(group)}")
    return group


class OnlineCalibration:
    """Measures micro-batches, refits the cost, hands it to ``PackedBatchSampler`` (see the module
    docstring). ``refit_every``: steps between refits (>= 1); ``window``: steps of measurements
    fitted (>= 2: the held-out check splits them by step parity); ``delay``: steps between a fit
    and the first step planned with it (>= 0); ``min_samples``: fewest measurements fitted (>= 8:
    four fit terms, checked on each half); ``device``: where the timed work runs (CUDA: events,
    else ``time.perf_counter``); ``group``: see the module docstring; ``attention``: the fit's
    attention family (module docstring)."""

    def __init__(self, *, refit_every: int = 10, window: int = 50, delay: int = 0,
                 min_samples: int = 16, device: Any = "cpu", group: Any = None,
                 attention: str = "per-document"):
        require_torch()
        if attention not in wlb.CostModel.attention_families():
            raise ValueError(f"attention must be one of {wlb.CostModel.attention_families()}, "
                             f"got {attention!r}")
        self.attention = attention
        self.refit_every, self.window, self.delay, self.min_samples = (
            integer(name, value, low, 2**31)
            for name, value, low in (("refit_every", refit_every, 1), ("window", window, 2),
                                     ("delay", delay, 0), ("min_samples", min_samples, 8)))
        self.device = torch.device(device)
        self.group = _check_group(group)
        self._reset()

    def _reset(self) -> None:
        self._ended = 0                    # steps ended (end_step() calls)
        self._current: List[Any] = []      # this step's measurements: (lengths, ms | (start, end))
        self._previous: List[Any] = []     # the last ended step's, read at the next end_step()
        self._unshared: List[Sample] = []  # read here since the last refit, not yet gathered
        self._window: List[Sample] = []    # what the next refit fits (after its gather)
        self._fits: List[Dict[str, Any]] = []  # {"from_step", coefficients, errors}
        self.refits = 0
        self.refits_skipped = 0
        self.last_fit: Any = None          # the last wlb.fit_micro_batch_cost result (this process)
        self.last_error: Optional[str] = None

    # ---- recording ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def measure(self, lengths: Any) -> Iterator[None]:
        """Times the block (one micro-batch's forward + backward) for the step under way; an
        empty micro-batch (no documents: the last steps of an epoch can have them) is not
        timed."""
        lengths = _lengths_of(lengths)
        if not lengths:
            yield
        elif self.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            yield
            end.record(stream)
            self._current.append((lengths, (start, end)))
        else:
            begin = time.perf_counter()
            yield
            self._current.append((lengths, (time.perf_counter() - begin) * 1e3))

    def record(self, lengths: Any, ms: float) -> None:
        """Adds a micro-batch of the step under way measured elsewhere (``ms`` of forward +
        backward); an empty micro-batch is ignored."""
        lengths, ms = _lengths_of(lengths), _check_ms(ms)
        if lengths:
            self._current.append((lengths, ms))

    @staticmethod
    def _read(step: int, pending: List[Any], wait: bool = True) -> List[Sample]:
        """[step, lengths, ms] of each pending measurement; without `wait`, a CUDA measurement
        the GPU has not finished is left out."""
        out = []
        for lengths, timing in pending:
            if isinstance(timing, tuple):
                start, end = timing
                if not wait and not end.query():
                    continue
                end.synchronize()
                timing = float(start.elapsed_time(end))
            out.append([step, lengths, timing])
        return out

    def end_step(self) -> None:
        """The training step under way has ended: reads the previous step's measurements and,
        every ``refit_every`` steps, refits."""
        if self._ended >= _MAX_STEP:
            raise RuntimeError(f"OnlineCalibration counted {self._ended} steps; no more fit")
        self._unshared.extend(self._read(self._ended - 1, self._previous))
        self._previous, self._current = self._current, []
        self._ended += 1
        if self._ended % self.refit_every == 0:
            self._refit()

    def _world(self) -> Tuple[Any, int]:
        if self.group is None:
            return None, 1
        import torch.distributed as dist  # only where a group is given
        group = None if self.group == "world" else self.group
        return group, dist.get_world_size(group)

    def _refit(self) -> None:
        group, world = self._world()
        if world > 1:
            import torch.distributed as dist
            gathered: List[Any] = [None] * world
            dist.all_gather_object(gathered, self._unshared, group=group)
            # In step order, each step's measurements in rank order: the same list everywhere.
            new = sorted((sample for part in gathered for sample in part), key=lambda s: s[0])
        else:
            new = self._unshared
        self._unshared = []
        self._window.extend(new)
        first = self._ended - 1 - self.window  # steps ended - 2 is the newest measured step
        self._window = [s for s in self._window if s[0] >= first]
        self.refits += 1
        if len(self._window) < self.min_samples:
            self.refits_skipped += 1
            self.last_error = (f"{len(self._window)} measurements in the window, fewer than "
                               f"min_samples = {self.min_samples}")
            return
        try:
            fit = wlb.fit_micro_batch_cost([np.asarray(s[1], dtype=np.int64) for s in self._window],
                                           [s[2] for s in self._window],
                                           step=[s[0] for s in self._window],
                                           attention=self.attention)
        except ValueError as error:  # the measurements cannot be fitted: keep the last cost
            self.refits_skipped += 1
            self.last_error = str(error)
            return
        self.last_fit, self.last_error = fit, None
        model = fit.model
        record = {"from_step": self._ended + self.delay, "unit": model.unit,
                  "description": model.description, "per_call_ms": float(fit.per_call_ms),
                  "held_out_mean_relative": float(fit.held_out.mean_relative),
                  "samples": len(self._window)}
        record.update({f: float(getattr(model, f)) for f in _COST_FIELDS})
        self._fits.append(record)
        # A fit no later step can use (a later one applies from its step on) is dropped.
        while len(self._fits) > 1 and self._fits[1]["from_step"] <= self._ended:
            self._fits.pop(0)

    # ---- what the sampler asks ------------------------------------------------------------------

    @property
    def steps_ended(self) -> int:
        return self._ended

    def fits(self) -> List[Dict[str, Any]]:
        """The fits still in use or to come: their first step, coefficients and held-out error."""
        return [dict(f) for f in self._fits]

    def cost_for(self, step: int) -> Optional[Dict[str, Any]]:
        """The fit that is the cost of run step ``step`` (steps counted from the first step the
        sampler planned), None before the first fit (the sampler's own cost). Raises RuntimeError
        when a fit that could still come may change it."""
        if step - self.delay > self._ended:
            raise RuntimeError(
                f"PackedBatchSampler is planning step {step}, but training has ended only "
                f"{self._ended} steps: a fit made at the end of step {step - 1 - self.delay} "
                f"would change its cost (OnlineCalibration(delay={self.delay})). The DataLoader "
                f"asks for num_workers x prefetch_factor micro-batches ahead of training; give "
                f"delay >= ceil(that / PP), or end every step with end_step()")
        chosen = None
        for fit in self._fits:
            if fit["from_step"] <= step:
                chosen = fit
        return None if chosen is None else dict(chosen)

    # ---- state ----------------------------------------------------------------------------------

    def state_dict(self, wait: bool = True) -> Dict[str, Any]:
        """Everything a resume needs. The measurements not read yet are read here: on CUDA this
        waits for them, unless ``wait`` is False (``PackedBatchSampler.state_dict()``, which a
        StatefulDataLoader with workers calls at every dispatch): then those the GPU has not
        finished are counted in ``unfinished``, and such a state cannot be loaded alone."""
        current = self._read(self._ended, self._current, wait)
        previous = self._read(self._ended - 1, self._previous, wait)
        unfinished = len(self._current) + len(self._previous) - len(current) - len(previous)
        return {
            "version": _STATE_VERSION,
            "config": {k: getattr(self, k) for k in _CONFIG},
            "steps_ended": self._ended,
            "current": [[list(s[1]), s[2]] for s in current],
            "previous": [[list(s[1]), s[2]] for s in previous],
            "unfinished": unfinished,
            "unshared": [[s[0], list(s[1]), s[2]] for s in self._unshared],
            "window": [[s[0], list(s[1]), s[2]] for s in self._window],
            "fits": [dict(f) for f in self._fits],
            "refits": self.refits, "refits_skipped": self.refits_skipped,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores a ``state_dict()``; a malformed one is a ValueError naming the field, and then
        nothing changes."""
        parsed = _parse_state(state, {k: getattr(self, k) for k in _CONFIG})
        if parsed[-1]:
            raise ValueError(
                f"calibration state 'unfinished' is {parsed[-1]}: it was taken while that many "
                f"measurements were still running on the GPU (PackedBatchSampler.state_dict() "
                f"does not wait for them); load a state from OnlineCalibration.state_dict()")
        self._reset()
        (self._ended, self._current, self._previous, self._unshared, self._window, self._fits,
         self.refits, self.refits_skipped) = parsed[:-1]

    def continues(self, state: Dict[str, Any]) -> bool:
        """Whether this calibration is ``state`` carried further by the same run: it ended at
        least as many steps, its fits begin with the state's fits that it still uses, and every
        measurement of the state's window it still holds is the same."""
        parsed = _parse_state(state, {k: getattr(self, k) for k in _CONFIG})
        ended, _, _, _, window, fits = parsed[:6]
        if ended > self._ended:
            return False
        mine = {f["from_step"]: f for f in self._fits}
        for fit in fits:
            if fit["from_step"] in mine and mine[fit["from_step"]] != fit:
                return False
        first = self._window[0][0] if self._window else math.inf
        theirs = [s for s in window if s[0] >= first]
        return theirs == self._window[:len(theirs)]


def cost_model(fit: Dict[str, Any]) -> "wlb.CostModel":
    """The ``wlb.CostModel`` of a fit record (``OnlineCalibration.fits()``, ``cost_for()``)."""
    return wlb.CostModel(unit=fit["unit"], description=fit["description"],
                         **{f: fit[f] for f in _COST_FIELDS})
