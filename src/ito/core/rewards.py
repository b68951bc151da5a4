"""Verifiable rewards for RLVR (DESIGN §7.6), named by ``post_training.rlvr.rewards``.

Each reward is a pure function of one sample — the prompt, the completion the policy generated
(decoded up to its end-of-text, which is not part of it) and the row's ``answer`` field (``None``
when the row has none) — to a value in [0, 1]. A sample's reward is the mean of the rewards the
manifest names; DAPO's overlong shaping (:func:`overlong_penalty`) is added to it by the trainer,
from the completion's token count.

``exact_match``        1 iff the completion, stripped of surrounding whitespace, equals the
                       stripped answer. A row without an answer scores 0 (data preparation
                       refuses such rows for this reward before training).
``exact_match_arith``  1 iff the completion is the integer the prompt's expression ``a+b=``
                       (``+``, ``-`` or ``*`` of two integers, then ``=``) evaluates to; the
                       answer field is not read: the reward is verified from the prompt alone.
                       A prompt that is not such an expression scores 0.
``format_integer``     1 iff the completion is an integer literal and nothing else (a format
                       check: it rewards answering in the expected form, right or wrong).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

__all__ = ["REWARDS", "RewardFn", "overlong_penalty", "sample_reward"]

RewardFn = Callable[[str, str, str | None], float]
"""``(prompt, completion, answer) -> reward in [0, 1]``."""

_INTEGER = re.compile(r"-?\d{1,64}")
_EXPRESSION = re.compile(r"\s*(-?\d{1,32})\s*([+*-])\s*(-?\d{1,32})\s*=\s*")


def exact_match(prompt: str, completion: str, answer: str | None) -> float:
    if answer is None:
        return 0.0
    return 1.0 if completion.strip() == answer.strip() else 0.0


def exact_match_arith(prompt: str, completion: str, answer: str | None) -> float:
    expression = _EXPRESSION.fullmatch(prompt)
    said = completion.strip()
    if expression is None or _INTEGER.fullmatch(said) is None:
        return 0.0
    a, op, b = int(expression[1]), expression[2], int(expression[3])
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return 1.0 if int(said) == value else 0.0


def format_integer(prompt: str, completion: str, answer: str | None) -> float:
    return 1.0 if _INTEGER.fullmatch(completion.strip()) else 0.0


REWARDS: Mapping[str, RewardFn] = MappingProxyType(
    {
        "exact_match": exact_match,
        "exact_match_arith": exact_match_arith,
        "format_integer": format_integer,
    }
)
"""Every reward the trainer can compute, by the name the manifest gives it."""


def sample_reward(names: list[str], prompt: str, completion: str, answer: str | None) -> float:
    """The mean of the named rewards for one sample (names are validated by the manifest)."""
    return sum(REWARDS[name](prompt, completion, answer) for name in names) / len(names)


def overlong_penalty(length: int, max_tokens: int, soft_tokens: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, §3.4, eq. 13), added to the reward.

    0 while ``length ≤ max_tokens − soft_tokens``; then falling linearly to −1 at
    ``max_tokens`` (−0.5 in the middle of the soft band); −1 beyond. With ``soft_tokens`` 0 the
    band is empty: 0 up to ``max_tokens``, −1 beyond. The same formula as TRL's
    ``trl.rewards.get_soft_overlong_punishment``.
    """
    if length < 0 or max_tokens < 1 or not 0 <= soft_tokens <= max_tokens:
        raise ValueError(
            f"overlong_penalty needs 0 ≤ length, 1 ≤ max_tokens and 0 ≤ soft_tokens ≤ "
            f"max_tokens; got {length}, {max_tokens}, {soft_tokens}"
        )
    start = max_tokens - soft_tokens
    if length <= start:
        return 0.0
    if length <= max_tokens:
        return (start - length) / soft_tokens
    return -1.0
