"""The run-state machine: one table decides every transition (DESIGN §5.7)."""

from __future__ import annotations

import itertools

import pytest

from ito.core.errors import ItoError
from ito.core.states import ALLOWED_TRANSITIONS, RunState, check_transition

TERMINAL = {RunState.succeeded, RunState.failed, RunState.gate_failed, RunState.cancelled}
CANCELLABLE = {RunState.queued, RunState.running, RunState.recovering, RunState.awaiting_approval}
PAIRS = list(itertools.product(RunState, RunState))


def test_the_table_names_every_state_and_only_states() -> None:
    assert set(ALLOWED_TRANSITIONS) == set(RunState)
    for targets in ALLOWED_TRANSITIONS.values():
        assert targets <= set(RunState)


@pytest.mark.parametrize(("current", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_a_transition_is_allowed_exactly_when_the_table_lists_it(
    current: RunState, target: RunState
) -> None:
    if target in ALLOWED_TRANSITIONS[current]:
        check_transition(current, target)
    else:
        with pytest.raises(ItoError) as info:
            check_transition(current, target)
        assert info.value.code == "invalid_transition"
        assert info.value.details == {"current": current.value, "target": target.value}


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_a_terminal_state_has_no_exit(state: RunState) -> None:
    assert state.is_terminal()
    assert ALLOWED_TRANSITIONS[state] == frozenset()


@pytest.mark.parametrize("state", sorted(set(RunState) - TERMINAL))
def test_a_non_terminal_state_has_a_way_out(state: RunState) -> None:
    assert not state.is_terminal()
    assert ALLOWED_TRANSITIONS[state]


def test_no_state_moves_to_itself() -> None:
    for state in RunState:
        assert state not in ALLOWED_TRANSITIONS[state]


def test_every_non_terminal_state_can_reach_a_terminal_state() -> None:
    for start in set(RunState) - TERMINAL:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in ALLOWED_TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL, start


def test_cancelled_is_reached_only_through_cancelling() -> None:
    sources = {s for s, targets in ALLOWED_TRANSITIONS.items() if RunState.cancelled in targets}
    assert sources == {RunState.cancelling}


@pytest.mark.parametrize("state", list(RunState))
def test_a_run_is_cancellable_exactly_in_the_active_states(state: RunState) -> None:
    assert state.is_cancellable() is (state in CANCELLABLE)


def test_a_run_already_cancelling_is_not_cancellable_again() -> None:
    assert not RunState.cancelling.is_cancellable()
    with pytest.raises(ItoError) as info:
        check_transition(RunState.cancelling, RunState.cancelling)
    assert info.value.code == "invalid_transition"
