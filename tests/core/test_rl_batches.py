"""DAPO's dynamic sampling and the rollout staleness bound (``ito.core.rl_batches``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ito.core.errors import ItoError
from ito.core.rl_batches import DynamicSampler, EmptySteps, StalenessGate, informative

Group = tuple[str, tuple[float, ...]]


def _rounds(*rounds: list[Group]) -> tuple[list[int], Callable[[int], list[Group]]]:
    asked: list[int] = []
    source = iter(rounds)

    def generate(n: int) -> list[Group]:
        asked.append(n)
        return next(source)

    return asked, generate


def _rewards(group: Group) -> tuple[float, ...]:
    return group[1]


def test_all_equal_groups_are_dropped_mixed_ones_kept_and_the_batch_refilled() -> None:
    asked, generate = _rounds(
        [("a", (1.0, 0.0)), ("b", (1.0, 1.0)), ("c", (0.0, 0.0))],
        [("d", (0.0, 0.5)), ("e", (1.0, 0.0))],
    )
    filled = DynamicSampler(groups=3, max_rounds=4).fill(generate, _rewards)
    assert [g[0] for g in filled.groups] == ["a", "d", "e"]
    assert (filled.rounds, filled.dropped) == (2, 2)
    # The second round asked for the two groups still missing.
    assert asked == [3, 2]


def test_a_round_that_gives_more_than_needed_fills_the_batch_and_stops() -> None:
    asked, generate = _rounds([("a", (1.0, 0.0)), ("b", (0.0, 1.0)), ("c", (1.0, 0.0))])
    filled = DynamicSampler(groups=2, max_rounds=1).fill(generate, _rewards)
    assert [g[0] for g in filled.groups] == ["a", "b"]
    assert asked == [2]


def test_the_round_limit_trains_on_what_it_found_filled_with_uninformative_groups() -> None:
    _, generate = _rounds([("a", (1.0, 1.0))], [("b", (0.0, 1.0))], [("c", (0.0, 0.0))])
    filled = DynamicSampler(groups=2, max_rounds=3).fill(generate, _rewards)
    assert [g[0] for g in filled.groups] == ["b"]
    assert [g[0] for g in filled.filler] == ["a"]  # the first dropped, to fill the batch
    assert (filled.rounds, filled.dropped, filled.complete) == (3, 2, False)


def test_a_step_with_no_informative_group_is_filled_entirely() -> None:
    _, generate = _rounds([("a", (1.0, 1.0)), ("b", (1.0, 1.0))], [("c", (1.0, 1.0))])
    filled = DynamicSampler(groups=2, max_rounds=2).fill(generate, _rewards)
    assert filled.groups == [] and [g[0] for g in filled.filler] == ["a", "b"]


def test_a_solved_task_ends_the_stage_early_after_patience_empty_steps() -> None:
    steps = EmptySteps(patience=3)
    assert steps.observe(2, complete=True, solved=False) is None
    assert steps.observe(0, complete=False, solved=True) is None
    assert steps.observe(0, complete=False, solved=True) is None
    assert steps.observe(1, complete=False, solved=False) is None  # the streak starts again
    assert [steps.observe(0, complete=False, solved=False) for _ in range(3)] == [
        None,
        None,
        "end",
    ]
    assert (steps.skipped, steps.trained, steps.partial, steps.streak) == (5, 2, 1, 3)


def test_a_policy_solving_everything_from_the_first_step_ends_early_not_failed() -> None:
    steps = EmptySteps(patience=2)
    assert steps.observe(0, complete=False, solved=True) is None
    assert steps.observe(0, complete=False, solved=True) == "end"


def test_rewards_constant_below_the_top_from_the_first_step_fail_with_the_code() -> None:
    steps = EmptySteps(patience=2)
    assert steps.observe(0, complete=False, solved=False) is None
    with pytest.raises(ItoError) as ended:
        steps.observe(0, complete=False, solved=False)
    assert ended.value.code == "dynamic_sampling_exhausted"
    assert ended.value.details["empty_steps"] == 2


def test_the_empty_step_record_survives_a_checkpoint() -> None:
    steps = EmptySteps(patience=4)
    steps.observe(1, complete=False, solved=False)
    steps.observe(0, complete=False, solved=True)
    back = EmptySteps.restore(steps.state(), 4)
    assert back == steps
    assert EmptySteps.restore(None, 4) == EmptySteps(4)


@given(st.lists(st.floats(allow_nan=False), min_size=1, max_size=8))
def test_a_group_is_informative_iff_its_rewards_differ(rewards: list[float]) -> None:
    assert informative(rewards) == (len(set(rewards)) > 1)


def test_the_staleness_bound_admits_lags_up_to_it_and_counts_the_dropped() -> None:
    gate = StalenessGate(max_staleness=1)
    offered = [(5, 5), (4, 5), (3, 5), (2, 5), (5, 6)]  # (sample version, trainer version)
    assert [gate.admit(s, t) for s, t in offered] == [True, True, False, False, True]
    assert gate.dropped == 2
    assert dict(gate.lags) == {0: 1, 1: 2, 2: 1, 3: 1}


def test_on_policy_admits_only_the_current_version() -> None:
    gate = StalenessGate(max_staleness=0)
    assert gate.admit(7, 7) and not gate.admit(6, 7)
    with pytest.raises(ValueError):
        gate.admit(8, 7)
