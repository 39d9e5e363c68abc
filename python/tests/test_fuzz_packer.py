"""Hypothesis: random interleavings of push, save, restore (valid and corrupted) and flush never
lose, duplicate or invent a token; random bytes and lengths never crash the binding."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import wlb

EXAMPLES = 40 if os.environ.get("CI") == "true" else 300
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class PackerMachine(RuleBasedStateMachine):
    """One packer; the model is the multiset of tokens pushed per document id."""

    def __init__(self):
        super().__init__()
        self.packer = None
        self.pushed = {}   # id -> tokens pushed
        self.planned = {}  # id -> tokens planned
        self.saved = []    # (state_dict, pushed, planned) snapshots

    @rule(name=st.sampled_from(wlb.packer_names()), context=st.integers(4, 96),
          n=st.integers(1, 4))
    @precondition(lambda self: self.packer is None)
    def make(self, name, context, n):
        self.packer = wlb.Packer(name, context=context, micro_batches=n)

    def take(self, steps):
        for s in steps:
            for mb in s.micro_batches:
                assert mb.tokens <= self.packer.max_tokens
                for i, n in zip(mb.ids.tolist(), mb.lengths.tolist()):
                    self.planned[i] = self.planned.get(i, 0) + n

    @precondition(lambda self: self.packer is not None)
    @rule(lengths=st.lists(st.integers(1, 300), min_size=0, max_size=12))
    def push(self, lengths):
        first = self.packer.next_document_id
        self.take(self.packer.push(np.array(lengths, dtype=np.int64)))
        for k, n in enumerate(lengths):
            self.pushed[first + k] = n

    @precondition(lambda self: self.packer is not None)
    @rule()
    def save(self):
        self.saved.append((self.packer.state_dict(), dict(self.pushed), dict(self.planned)))

    @precondition(lambda self: self.packer is not None and self.saved)
    @rule(data=st.data())
    def restore(self, data):
        state, pushed, planned = data.draw(st.sampled_from(self.saved))
        self.packer.load_state_dict(state)
        self.pushed, self.planned = dict(pushed), dict(planned)

    @precondition(lambda self: self.packer is not None and self.saved)
    @rule(data=st.data(), position=st.integers(0, 10**6), byte=st.integers(0, 255))
    def restore_corrupted(self, data, position, byte):
        state, _, _ = data.draw(st.sampled_from(self.saved))
        blob = bytearray(state["packer_state"])
        position %= len(blob)
        if blob[position] == byte:
            return
        blob[position] = byte
        before = self.packer.state_dict()
        with pytest.raises(ValueError):
            self.packer.load_state_dict({"packer_state": bytes(blob),
                                         "next_document_id": state["next_document_id"]})
        assert self.packer.state_dict() == before  # a rejected restore changes nothing

    @precondition(lambda self: self.packer is not None)
    @rule()
    def flush(self):
        self.take(self.packer.flush())
        assert len(self.packer.pending) == 0
        assert self.planned == self.pushed, "a token lost, duplicated or invented"

    @invariant()
    def nothing_invented(self):
        if self.packer is None:
            return
        held = {}
        for i, n in zip(self.packer.pending.ids.tolist(), self.packer.pending.lengths.tolist()):
            held[i] = held.get(i, 0) + n
        for i in set(self.planned) | set(held):
            assert self.planned.get(i, 0) + held.get(i, 0) <= self.pushed.get(i, 0)


PackerMachine.TestCase.settings = settings(SETTINGS, stateful_step_count=25)
test_packer_state_machine = PackerMachine.TestCase


@SETTINGS
@given(st.binary(max_size=400))
def test_random_blobs_are_rejected_or_restored_never_a_crash(blob):
    packer = wlb.Packer("wlb-lookahead", context=64, micro_batches=2)
    try:
        packer.restore_state(blob)
    except ValueError:
        return
    packer.flush()


@SETTINGS
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=20), st.integers(-3, 9))
def test_random_lengths_and_cp_sizes_raise_clear_errors(lengths, cp):
    try:
        plan = wlb.plan_shards(np.array(lengths, dtype=np.int64), cp, "adaptive")
    except ValueError:
        return
    assert plan.tokens == sum(lengths)


@SETTINGS
@given(st.text(max_size=200))
def test_random_lengths_text_parses_or_raises_value_error(text):
    try:
        lengths = wlb.parse_lengths(text)
    except ValueError:
        return
    assert all(n > 0 for n in lengths.tolist())
