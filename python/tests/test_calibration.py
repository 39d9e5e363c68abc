"""Online calibration (wlb.torch.calibration.OnlineCalibration) with PackedBatchSampler: the refit
policy and the step that first plans with a fit, exact resume (sampler state alone, and through
torchdata's StatefulDataLoader without and with workers), the DP gather, and bad states and
arguments. Times are deterministic fakes of the micro-batch's lengths, so runs can be compared
plan by plan."""

import copy
import pickle
import zlib

import numpy as np
import pytest
import torch
from cp_workers import spawn
from torchdata.stateful_dataloader import StatefulDataLoader

import wlb
from wlb.torch import OnlineCalibration, PackedBatchSampler, PackedCollate, PackedPieces

CONTEXT = 512
# The "hardware": attention far heavier than the llama2-7b FLOP preset weighs it at S = 512.
TRUE = {"quadratic": 2e-5, "linear": 1e-3, "document": 0.05, "call": 0.3}


def corpus(seed, count=300):
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(count) < 0.15, rng.integers(CONTEXT // 3, 2 * CONTEXT, count),
                       rng.integers(1, CONTEXT // 5, count))
    return lengths, [rng.integers(0, 50000, size=int(n)) for n in lengths]


def fake_ms(lengths, noise=0.02):
    """The measured fwd+bwd ms of a micro-batch: TRUE, times a deterministic noise factor."""
    d = np.asarray(lengths, dtype=np.float64)
    ms = (TRUE["quadratic"] * (d * d).sum() + TRUE["linear"] * d.sum() +
          TRUE["document"] * d.size + TRUE["call"])
    seed = zlib.crc32(np.asarray(lengths, dtype=np.int64).tobytes())
    return ms * (1 + noise * np.random.default_rng(seed).uniform(-1, 1))


def pieces_of(mb):
    return [tuple(p) for p in mb]


class Trainer:
    """Drives a sampler as a training loop does: measure each micro-batch, end each step."""

    def __init__(self, sampler, calibration, pp):
        self.sampler, self.calibration, self.pp = sampler, calibration, pp
        self.given = 0

    def run(self, stop=None):
        """Every micro-batch yielded (until `stop` micro-batches were given in all)."""
        out = []
        it = iter(self.sampler)
        while stop is None or self.given < stop:
            try:
                mb = next(it)
            except StopIteration:
                break
            out.append(pieces_of(mb))
            self.calibration.record([p[2] for p in mb], fake_ms([p[2] for p in mb]) if mb else 1.0)
            self.given += 1
            if self.given % self.pp == 0:
                self.calibration.end_step()
        return out


def make(lengths, packer, pp=2, delay=0, refit_every=3, window=6, **kw):
    calibration = OnlineCalibration(refit_every=refit_every, window=window, delay=delay,
                                    min_samples=8)
    sampler = PackedBatchSampler(lengths, pp=pp, dp=1, rank=0, context=CONTEXT, packer=packer,
                                 seed=5, calibration=calibration, **kw)
    return sampler, calibration


# ---- the policy --------------------------------------------------------------------------------


def test_refit_recovers_the_measured_cost_and_applies_from_step_t_plus_1_plus_delay():
    lengths, _ = corpus(1)
    for delay in (0, 2):
        sampler, calibration = make(lengths, "wlb", delay=delay, refit_every=4, window=8)
        costs = []  # the cost unit of each step's plan, as the sampler planned it
        trainer = Trainer(sampler, calibration, 2)
        it = iter(sampler)
        for step in range(16):
            for _ in range(2):
                mb = next(it)
                if trainer.given % 2 == 0:
                    costs.append(sampler._live["packer"].cost.unit)
                calibration.record([p[2] for p in mb], fake_ms([p[2] for p in mb], noise=0))
                trainer.given += 1
            calibration.end_step()
        # At the end of step 3 (4 steps ended) the window holds steps 0..2 (read one step late):
        # 6 micro-batches < min_samples = 8, no fit. The first fit is made at the end of step 7
        # (steps 0..6): step 8 + delay is the first planned with it, in ms.
        first = 8 + delay
        assert costs[:first] == ["flop"] * first
        assert set(costs[first:]) == {"ms"}, costs
        fit = calibration.fits()[-1]
        assert fit["from_step"] == 16 + delay
        # Noise-free times: the fit recovers the true per-document cost.
        assert fit["attn_quadratic"] == pytest.approx(TRUE["quadratic"], rel=1e-3)
        assert fit["linear_per_token"] + fit["attn_linear"] == pytest.approx(TRUE["linear"],
                                                                            rel=1e-2)
        assert fit["per_call_ms"] == pytest.approx(TRUE["call"], rel=1e-2)
        assert calibration.last_fit.held_out.mean_relative < 1e-6


def test_window_and_too_few_measurements():
    calibration = OnlineCalibration(refit_every=2, window=3, min_samples=16)
    rng = np.random.default_rng(3)
    for step in range(12):
        for _ in range(2):
            lengths = rng.integers(1, 400, size=rng.integers(1, 6))
            calibration.record(lengths, fake_ms(lengths))
        calibration.end_step()
        state = calibration.state_dict()
        steps = sorted({s[0] for s in state["window"]})
        if calibration.steps_ended % 2 == 0:
            # The window holds the last 3 measured steps (read one step late).
            ended = calibration.steps_ended
            assert steps == list(range(max(0, ended - 4), ended - 1)), (ended, steps)
    # 3 steps x 2 micro-batches < 16: every refit was skipped, and the sampler's cost stays.
    assert calibration.fits() == [] and calibration.refits == 6
    assert calibration.refits_skipped == 6 and "min_samples" in calibration.last_error
    assert calibration.cost_for(12) is None


def test_calibrated_plans_differ_from_the_preset_and_balance_the_measured_cost():
    """The test below can fail: calibration changes plans, toward lower measured imbalance."""
    lengths, _ = corpus(2, count=600)
    measured = {}
    for calibrate in (False, True):
        sampler, calibration = make(lengths, "wlb", pp=4, refit_every=2, window=8)
        if not calibrate:
            sampler.calibration = None
        mbs = Trainer(sampler, calibration, 4).run()
        steps = [mbs[i:i + 4] for i in range(16, len(mbs) - 3, 4)]  # from the first fit on
        times = [[fake_ms([p[2] for p in mb], noise=0) for mb in step] for step in steps]
        measured[calibrate] = (mbs, np.mean([max(t) / np.mean(t) for t in times]))
    assert measured[True][0] != measured[False][0]
    assert measured[True][1] < measured[False][1] - 0.005, measured[True][1]


# ---- resume ------------------------------------------------------------------------------------


@pytest.mark.parametrize("packer,pp,delay", [("wlb", 2, 0), ("wlb-lookahead", 2, 1),
                                             ("wlb-refine", 4, 0)])
def test_resume_from_sampler_state_plans_exactly(packer, pp, delay):
    lengths, _ = corpus(7)
    sampler, calibration = make(lengths, packer, pp=pp, delay=delay)
    trainer = Trainer(sampler, calibration, pp)
    full = trainer.run()
    sampler.set_epoch(1)
    full += trainer.run()  # a second epoch: fits and step numbers carry across
    assert len(calibration.fits()) >= 1 and calibration.refits >= 10
    rng = np.random.default_rng(len(packer) + pp)
    for stop in sorted(rng.choice(np.arange(1, len(full)), size=6, replace=False).tolist()):
        sampler, calibration = make(lengths, packer, pp=pp, delay=delay)
        trainer = Trainer(sampler, calibration, pp)
        head = trainer.run(stop)
        epoch = 0
        if len(head) < stop:  # the first epoch ended before the save point
            sampler.set_epoch(1)
            head += trainer.run(stop)
            epoch = 1
        state = pickle.loads(pickle.dumps(sampler.state_dict()))
        sampler, calibration = make(lengths, packer, pp=pp, delay=delay)
        sampler.load_state_dict(state)
        trainer = Trainer(sampler, calibration, pp)
        trainer.given = stop
        rest = trainer.run()
        if epoch == 0:
            sampler.set_epoch(1)
            rest += trainer.run()
        assert head + rest == full, stop


def loader(docs, sampler, workers):
    return StatefulDataLoader(PackedPieces(docs), batch_sampler=sampler,
                              collate_fn=PackedCollate(), num_workers=workers,
                              timeout=120 if workers else 0)


def train(it, calibration, pp, given, stop=None):
    out = []
    for mb in it:
        out.append(mb["document_ids"].tolist() + mb["lengths"].tolist())
        lengths = mb["lengths"].tolist()
        if lengths:
            calibration.record(lengths, fake_ms(lengths))
        given += 1
        if given % pp == 0:
            calibration.end_step()
        if stop is not None and given == stop:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_through_stateful_dataloader(workers):
    lengths, docs = corpus(4, count=240)
    pp, delay = 2, 2 if workers else 0  # 2 workers x prefetch 2 = 4 micro-batches = 2 steps ahead
    sampler, calibration = make(lengths, "wlb-lookahead", pp=pp, delay=delay, refit_every=2)
    full = train(loader(docs, sampler, workers), calibration, pp, 0)
    assert calibration.fits()
    rng = np.random.default_rng(workers)
    for stop in sorted(rng.choice(np.arange(1, len(full)), size=3, replace=False).tolist()):
        sampler, calibration = make(lengths, "wlb-lookahead", pp=pp, delay=delay, refit_every=2)
        first = loader(docs, sampler, workers)
        it = iter(first)
        head = train(it, calibration, pp, 0, stop)
        checkpoint = pickle.loads(pickle.dumps(
            {"loader": first.state_dict(), "calibration": calibration.state_dict()}))
        del it, first
        sampler, calibration = make(lengths, "wlb-lookahead", pp=pp, delay=delay, refit_every=2)
        second = loader(docs, sampler, workers)
        calibration.load_state_dict(checkpoint["calibration"])
        second.load_state_dict(checkpoint["loader"])
        rest = train(second, calibration, pp, stop)
        assert head + rest == full, stop
        if workers and stop >= 8:
            # Without the checkpoint's calibration, the sampler's copy (taken when the loader
            # dispatched, ahead of training) is refused rather than planned from.
            sampler, calibration = make(lengths, "wlb-lookahead", pp=pp, delay=delay,
                                        refit_every=2)
            third = loader(docs, sampler, workers)
            third.load_state_dict(checkpoint["loader"])
            with pytest.raises(ValueError, match="steps_ended"):
                next(iter(third))


def test_planning_ahead_of_the_delay_is_refused():
    lengths, docs = corpus(4, count=240)
    sampler, calibration = make(lengths, "wlb", pp=2, delay=0)
    with pytest.raises(RuntimeError, match="delay >= ceil"):
        train(loader(docs, sampler, 2), calibration, 2, 0)
    sampler, calibration = make(lengths, "wlb", pp=2, delay=0)
    with pytest.raises(RuntimeError, match="planning step 1"):
        list(sampler)  # nobody ends a step


# ---- DP: every rank fits the same measurements -------------------------------------------------


def dp_rank(rank, world, payload):
    lengths = np.asarray(payload)
    calibration = OnlineCalibration(refit_every=2, window=6, min_samples=8, group="world")
    sampler = PackedBatchSampler(lengths, pp=2, dp=world, rank=rank, context=CONTEXT,
                                 packer="wlb", seed=5, calibration=calibration)
    trainer = Trainer(sampler, calibration, 2)
    given = trainer.run()
    return {"given": given, "fits": calibration.fits()}


def test_dp_ranks_gather_measurements_and_plan_alike():
    lengths, _ = corpus(8, count=400)
    results = spawn(2, dp_rank, lengths.tolist())
    assert results[0]["fits"] == results[1]["fits"] and results[0]["fits"]
    # Same plans on both ranks: together they train every piece of the epoch exactly once.
    pieces = sorted(p for r in results for mb in r["given"] for p in mb)
    order = np.random.default_rng([5, 0]).permutation(len(lengths))
    docs = wlb.make_documents(lengths[order], CONTEXT)
    expected = sorted(zip(order[docs.ids].tolist(), docs.offsets.tolist(), docs.lengths.tolist()))
    assert pieces == expected


# ---- bad input ---------------------------------------------------------------------------------


def trained_state():
    lengths, _ = corpus(7)
    sampler, calibration = make(lengths, "wlb")
    Trainer(sampler, calibration, 2).run(40)
    assert calibration.fits()
    return calibration.state_dict(), sampler.state_dict()


BAD_CALIBRATION = [
    ("version", lambda s: s.update(version=2)),
    ("steps_ended", lambda s: s.update(steps_ended=-1)),
    ("steps_ended", lambda s: s.update(steps_ended=True)),
    ("window", lambda s: s.update(window="x")),
    (r"window\[0\] ms", lambda s: s["window"][0].__setitem__(2, float("nan"))),
    (r"window\[0\] lengths", lambda s: s["window"][0].__setitem__(1, [3, 0])),
    (r"window\[0\]\[0\] \(step\)", lambda s: s["window"][0].__setitem__(0, 10**6)),
    ("window", lambda s: s["window"].reverse()),
    (r"current\[0\] ms", lambda s: s["current"].append([[5], -1.0])),
    (r"fits\[0\].attn_quadratic", lambda s: s["fits"][0].update(attn_quadratic=-1.0)),
    (r"fits\[0\].from_step", lambda s: s["fits"][0].update(from_step=10**9)),
    (r"fits\[0\]", lambda s: s["fits"][0].pop("unit")),
    ("refit_every", lambda s: s["config"].update(refit_every=4)),
    ("refits_skipped", lambda s: s.update(refits_skipped=10**6)),
    ("unknown entry 'extra'", lambda s: s.update(extra=1)),
    ("'unfinished' is 2", lambda s: s.update(unfinished=2)),  # GPU work not waited for
    ("'unfinished' must be", lambda s: s.update(unfinished=-1)),
    ("no 'fits' entry", lambda s: s.pop("fits")),
]


@pytest.mark.parametrize("name,mutate", BAD_CALIBRATION, ids=[b[0] for b in BAD_CALIBRATION])
def test_bad_calibration_state_is_refused_naming_the_field(name, mutate):
    state, sampler_state = trained_state()
    good = OnlineCalibration(refit_every=3, window=6, min_samples=8)
    good.load_state_dict(copy.deepcopy(state))
    assert good.state_dict() == state
    bad = copy.deepcopy(state)
    mutate(bad)
    with pytest.raises(ValueError, match=name):
        OnlineCalibration(refit_every=3, window=6, min_samples=8).load_state_dict(bad)
    # The same through the sampler's state.
    lengths, _ = corpus(7)
    broken = copy.deepcopy(sampler_state)
    mutate(broken["calibration"]["state"])
    sampler, _ = make(lengths, "wlb")
    with pytest.raises(ValueError, match=name):
        sampler.load_state_dict(broken)


BAD_ENTRY = [
    ("calibration.run_steps", lambda e: e.update(run_steps=-3)),
    ("calibration.run_steps", lambda e: e.update(run_steps="7")),
    ("calibration.push.step", lambda e: e["push"].update(step=10**7)),
    ("calibration.push'", lambda e: e.update(push=[1])),
    (r"calibration.push.cost.per_document", lambda e: e["push"]["cost"].update(per_document=-1)),
    ("'calibration' must be a dict", lambda e: e.pop("push")),
    ("steps_ended", lambda e: e.update(run_steps=e["run_steps"] + 1)),
]


@pytest.mark.parametrize("name,mutate", BAD_ENTRY, ids=[b[0] for b in BAD_ENTRY])
def test_bad_sampler_calibration_entry_is_refused(name, mutate):
    _, state = trained_state()
    assert state["calibration"]["push"]["cost"] is not None
    lengths, _ = corpus(7)
    bad = copy.deepcopy(state)
    mutate(bad["calibration"])
    sampler, _ = make(lengths, "wlb")
    with pytest.raises(ValueError, match=name):
        sampler.load_state_dict(bad)
    sampler, _ = make(lengths, "wlb")
    sampler.load_state_dict(copy.deepcopy(state))  # the unmodified state loads


def test_states_with_and_without_calibration_do_not_mix():
    _, state = trained_state()
    lengths, _ = corpus(7)
    plain = PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT, seed=5,
                               packer="wlb")  # the state's packer: only the calibration differs
    with pytest.raises(ValueError, match="with an OnlineCalibration and this sampler has none"):
        plain.load_state_dict(state)
    sampler, _ = make(lengths, "wlb")
    with pytest.raises(ValueError, match="without an OnlineCalibration"):
        sampler.load_state_dict(plain.state_dict())


def test_bad_arguments():
    for kw in ({"refit_every": 0}, {"window": 1}, {"delay": -1}, {"min_samples": 7},
               {"refit_every": 2.0}, {"window": True}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            OnlineCalibration(**kw)
    calibration = OnlineCalibration()
    for lengths, ms, match in (([3, 4], 0.0, "finite number of ms > 0"),
                               ([3, 4], float("inf"), "finite number of ms > 0"),
                               ([3, 0], 1.0, "length 0"), ([[3]], 1.0, "1-D integer"),
                               ([1.5], 1.0, "1-D integer")):
        with pytest.raises(ValueError, match=match):
            calibration.record(lengths, ms)
    calibration.record([], 1.0)  # an empty micro-batch is not measured
    with calibration.measure(torch.tensor([5, 6])):
        pass
    assert len(calibration.state_dict()["current"]) == 1
    with pytest.raises(TypeError, match="OnlineCalibration"):
        PackedBatchSampler([5, 6], pp=1, dp=1, rank=0, context=8, calibration="yes")
    with pytest.raises(ValueError, match="group"):
        PackedBatchSampler([5, 6], pp=1, dp=2, rank=0, context=8, calibration=calibration)


def test_resumed_step_count_matches_the_uninterrupted_run():
    """A state saved at a step boundary counts that step once after the resume (the calibration
    numbers steps by this count)."""
    lengths, _ = corpus(3)
    full = PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT, seed=5)
    counts, states = [], []
    for mb in full:
        counts.append(full.state_dict()["steps"])
        states.append(full.state_dict())
    for stop in range(0, len(counts), 3):
        resumed = PackedBatchSampler(lengths, pp=2, dp=1, rank=0, context=CONTEXT, seed=5)
        resumed.load_state_dict(states[stop])
        after = [resumed.state_dict()["steps"] for _ in resumed]
        assert after == counts[stop + 1:], stop


def test_resume_inside_a_multi_step_flush_redoes_it_with_its_own_cost():
    """The flush at an epoch's end returns several steps from one push, all planned with the
    cost of the first; a fit every step makes later steps' costs differ, so a resume inside the
    flush must redo it with the cost the state saved, not with its own step's."""
    lengths, _ = corpus(11, count=200)
    kw = dict(pp=2, refit_every=1, window=4, lookahead=2)
    sampler, calibration = make(lengths, "wlb-lookahead", **kw)
    full = Trainer(sampler, calibration, 2).run()
    assert len(calibration.fits()) >= 1
    multi = 0
    for stop in range(len(full) - 30, len(full)):
        sampler, calibration = make(lengths, "wlb-lookahead", **kw)
        trainer = Trainer(sampler, calibration, 2)
        head = trainer.run(stop)
        state = pickle.loads(pickle.dumps(sampler.state_dict()))
        push = state["calibration"]["push"]
        multi += push["step"] < state["calibration"]["run_steps"] - (state["micro_batch"] == 2)
        sampler, calibration = make(lengths, "wlb-lookahead", **kw)
        sampler.load_state_dict(state)
        trainer = Trainer(sampler, calibration, 2)
        trainer.given = stop
        assert head + trainer.run() == full, stop
    assert multi >= 1  # a save point inside a push that returned several steps
