"""The verifiable rewards and DAPO's overlong shaping, by hand-computed values."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ito.core.manifest import RewardName
from ito.core.rewards import REWARDS, overlong_penalty, sample_reward


@pytest.mark.parametrize(
    ("prompt", "completion", "expected"),
    [
        ("12+7=", "19", 1.0),
        ("12+7=", " 19 ", 1.0),  # surrounding whitespace is not part of the answer
        ("12+7=", "18", 0.0),
        ("12+7=", "19 apples", 0.0),  # the answer and nothing else
        ("12-30=", "-18", 1.0),
        ("-3*4=", "-12", 1.0),
        ("12 + 7 =", "19", 1.0),
        ("what is 12+7?", "19", 0.0),  # not an expression: nothing to verify against
        ("12+7=", "", 0.0),
    ],
)
def test_exact_match_arith_verifies_the_prompts_own_expression(
    prompt: str, completion: str, expected: float
) -> None:
    # The answer field is not read: a wrong one changes nothing.
    assert REWARDS["exact_match_arith"](prompt, completion, "wrong") == expected


def test_exact_match_compares_with_the_answer_field() -> None:
    reward = REWARDS["exact_match"]
    assert reward("q", " Paris\n", "Paris") == 1.0
    assert reward("q", "paris", "Paris") == 0.0
    assert reward("q", "Paris", None) == 0.0


def test_format_integer_rewards_the_form_right_or_wrong() -> None:
    reward = REWARDS["format_integer"]
    assert reward("2+2=", "5", None) == 1.0
    assert reward("2+2=", "-5", None) == 1.0
    assert reward("2+2=", "five", None) == 0.0
    assert reward("2+2=", "4.0", None) == 0.0


def test_a_samples_reward_is_the_mean_of_the_named_rewards() -> None:
    names = ["exact_match_arith", "format_integer"]
    assert sample_reward(names, "2+2=", "4", "4") == 1.0
    assert sample_reward(names, "2+2=", "5", "4") == 0.5
    assert sample_reward(names, "2+2=", "x", "4") == 0.0


def test_the_manifest_names_exactly_the_registered_rewards() -> None:
    assert set(get_args(RewardName)) == set(REWARDS)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (60, 0.0), (70, -0.5), (75, -0.75), (80, -1.0), (81, -1.0), (500, -1.0)],
)
def test_overlong_penalty_is_zero_inside_the_budget_then_falls_to_minus_one(
    length: int, expected: float
) -> None:
    # max 80 tokens, soft band of 20: 0 up to 60, −0.5 at 70 (the band's middle), −1 beyond 80.
    assert overlong_penalty(length, 80, 20) == pytest.approx(expected)


def test_overlong_penalty_without_a_soft_band_is_a_step() -> None:
    assert overlong_penalty(80, 80, 0) == 0.0
    assert overlong_penalty(81, 80, 0) == -1.0


@pytest.mark.parametrize(("length", "max_tokens", "soft"), [(-1, 8, 2), (1, 0, 0), (1, 8, 9)])
def test_overlong_penalty_refuses_impossible_settings(
    length: int, max_tokens: int, soft: int
) -> None:
    with pytest.raises(ValueError):
        overlong_penalty(length, max_tokens, soft)


@given(
    max_tokens=st.integers(1, 4096),
    data=st.data(),
)
def test_overlong_penalty_is_monotone_and_bounded(max_tokens: int, data: st.DataObject) -> None:
    soft = data.draw(st.integers(0, max_tokens))
    a = data.draw(st.integers(0, 2 * max_tokens))
    b = data.draw(st.integers(a, 2 * max_tokens))
    pa, pb = overlong_penalty(a, max_tokens, soft), overlong_penalty(b, max_tokens, soft)
    assert -1.0 <= pb <= pa <= 0.0
