"""``OnlineCalibration``'s saved state and fit records checked field by field (a bad one is a
ValueError naming the field), apart from the calibration's measuring and refitting."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

_STATE_VERSION = 1
_CONFIG = ("refit_every", "window", "delay", "min_samples", "attention")
_COST_FIELDS = ("attn_quadratic", "attn_linear", "linear_per_token", "per_document",
                "dense_quadratic")
_MAX_STEP = 2**62  # far beyond any run; keeps state integers in a checked range


def _field_error(field: str, value: Any, expected: str) -> ValueError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValueError(f"calibration state '{field}' must be {expected}, got {shown}")


def _integer(field: str, value: Any, low: int, high: int = _MAX_STEP) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _field_error(field, value, f"an integer in [{low}, {high}]")
    return value


def _sample(field: str, value: Any, with_step: bool, low_step: int, high_step: int) -> List[Any]:
    if not isinstance(value, (list, tuple)) or len(value) != (3 if with_step else 2):
        raise _field_error(field, value, "[step, lengths, ms]" if with_step else "[lengths, ms]")
    out = list(value)
    if with_step:
        out[0] = _integer(f"{field}[0] (step)", out[0], low_step, high_step)
    lengths, ms = out[-2], out[-1]
    if (not isinstance(lengths, (list, tuple)) or not lengths or
            any(isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= _MAX_STEP
                for d in lengths)):
        raise _field_error(f"{field} lengths", lengths, "a non-empty list of integers >= 1")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
        raise _field_error(f"{field} ms", ms, "a finite number > 0")
    out[-2], out[-1] = list(lengths), float(ms)
    return out


def parse_fit(field: str, fit: Any) -> Dict[str, Any]:
    """A fit record (``cost_for()``) checked field by field: ValueError naming ``field``."""
    keys = {"from_step", "unit", "description", "per_call_ms", "held_out_mean_relative",
            "samples", *_COST_FIELDS}
    if isinstance(fit, dict) and "dense_quadratic" not in fit:
        fit = dict(fit, dense_quadratic=0.0)  # saved before the dense family: per-document
    if not isinstance(fit, dict) or set(fit) != keys:
        raise _field_error(field, fit, f"a dict with keys {sorted(keys)}")
    out = dict(fit)
    out["from_step"] = _integer(f"{field}.from_step", fit["from_step"], 1, _MAX_STEP)
    out["samples"] = _integer(f"{field}.samples", fit["samples"], 8)
    for key in ("unit", "description"):
        if not isinstance(fit[key], str):
            raise _field_error(f"{field}.{key}", fit[key], "a string")
    for key in (*_COST_FIELDS, "per_call_ms", "held_out_mean_relative"):
        v = fit[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v >= 0):
            raise _field_error(f"{field}.{key}", v, "a finite number >= 0")
        out[key] = float(v)
    return out


def _parse_state(state: Any, config: Dict[str, int]) -> Tuple[Any, ...]:
    if not isinstance(state, dict):
        raise _field_error("(state)", state, "a dict")
    if state.get("version") != _STATE_VERSION:
        raise _field_error("version", state.get("version"), str(_STATE_VERSION))
    known = {"version", "config", "steps_ended", "current", "previous", "unfinished", "unshared",
             "window", "fits", "refits", "refits_skipped"}
    missing = sorted(known - state.keys())
    if missing:
        raise ValueError(f"calibration state has no '{missing[0]}' entry")
    extra = sorted(set(state) - known)
    if extra:
        raise ValueError(f"calibration state has an unknown entry '{extra[0]}'")
    saved = state["config"]
    if isinstance(saved, dict) and "attention" not in saved:
        saved = dict(saved, attention="per-document")  # saved before the dense family
    if saved != config:
        saved = saved if isinstance(saved, dict) else {}
        name = next((k for k in _CONFIG if saved.get(k) != config[k]), "config")
        raise ValueError(f"calibration state 'config' was saved with {name} = {saved.get(name)!r}; "
                         f"this calibration has {name} = {config.get(name)!r}")
    ended = _integer("steps_ended", state["steps_ended"], 0)
    unfinished = _integer("unfinished", state["unfinished"], 0)
    lists = {}
    for name in ("current", "previous", "unshared", "window", "fits"):
        if not isinstance(state[name], list):
            raise _field_error(name, state[name], "a list")
        lists[name] = state[name]
    if ended == 0 and lists["previous"]:
        raise _field_error("previous", lists["previous"], "empty before the first step ended")
    current = [tuple(_sample(f"current[{i}]", s, False, 0, 0)) for i, s in
               enumerate(lists["current"])]
    previous = [tuple(_sample(f"previous[{i}]", s, False, 0, 0)) for i, s in
                enumerate(lists["previous"])]
    # Read measurements are of steps already ended before the last one (read one step late).
    unshared = [_sample(f"unshared[{i}]", s, True, 0, max(ended - 2, 0))
                for i, s in enumerate(lists["unshared"])]
    window = [_sample(f"window[{i}]", s, True, 0, max(ended - 2, 0))
              for i, s in enumerate(lists["window"])]
    if any(window[i][0] > window[i + 1][0] for i in range(len(window) - 1)):
        raise _field_error("window", [s[0] for s in window], "measurements in step order")
    fits = []
    for i, fit in enumerate(lists["fits"]):
        out = parse_fit(f"fits[{i}]", fit)
        field = f"fits[{i}]"
        if fits and out["from_step"] <= fits[-1]["from_step"]:
            raise _field_error(f"{field}.from_step", out["from_step"],
                               f"above the previous fit's {fits[-1]['from_step']}")
        if out["from_step"] > ended + config["delay"]:
            raise _field_error(f"{field}.from_step", out["from_step"],
                               f"at most steps_ended + delay = {ended + config['delay']}")
        fits.append(out)
    refits = _integer("refits", state["refits"], len(fits))
    skipped = _integer("refits_skipped", state["refits_skipped"], 0, refits)
    return ended, current, previous, unshared, window, fits, refits, skipped, unfinished
