"""How RLVR's trainer fills a batch from rollouts (DESIGN §7.6): DAPO's dynamic sampling and the
staleness bound of a separate rollout worker. Pure: no torch, no I/O.

**Dynamic sampling** (DAPO, Yu et al. 2025, §3.2). A group is the ``group_size`` completions of
one prompt; when their rewards are all equal every advantage is 0 and the group teaches nothing.
:class:`DynamicSampler` keeps only groups whose rewards differ and asks for more prompts until the
batch holds its ``groups`` groups, for at most ``max_rounds`` generation rounds. A policy that
already solves most of its prompts is not a failure (DESIGN §7.6): once the rounds run out the
step trains on the informative groups it has (the batch is filled with uninformative ones, which
carry no loss), and a step with none is skipped. :class:`EmptySteps` counts the steps without
one; after ``patience`` in a row the stage ends early, as completed, and its gate decides — unless
the stage never saw a group worth learning from and its rewards were never all at the top: then
nothing about the data or the rewards can teach this policy anything, and the stage fails
``dynamic_sampling_exhausted``.

**Staleness** (trainer/rollout separation). Each sample carries the policy version that
generated it; the trainer at version ``v`` consumes a sample of version ``u`` only when its lag
``v − u`` is at most ``max_staleness`` (0: strictly on-policy) and drops the rest, counting them.
:class:`StalenessGate` keeps the lag histogram and the dropped count the run reports as metrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ito.core.errors import ItoError

__all__ = ["DynamicSampler", "EmptySteps", "FilledBatch", "StalenessGate", "informative"]

G = TypeVar("G")


def informative(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards are not all equal (it has a non-zero advantage)."""
    return any(r != rewards[0] for r in rewards[1:])


@dataclass(frozen=True)
class FilledBatch(Generic[G]):
    groups: list[G]
    """The informative groups kept (at most the batch's number), in the order generated."""
    rounds: int
    """Generation rounds it took."""
    dropped: int
    """Groups dropped because their rewards were all equal."""
    filler: list[G] = field(default_factory=list)
    """Uninformative groups that fill the batch up to its size when the rounds ran out (the
    first ones dropped); they carry no loss."""

    @property
    def complete(self) -> bool:
        """Whether the batch holds only informative groups."""
        return not self.filler


@dataclass(frozen=True)
class DynamicSampler:
    groups: int
    """Groups a batch holds."""
    max_rounds: int
    """Generation rounds allowed to fill one batch."""

    def __post_init__(self) -> None:
        if self.groups < 1 or self.max_rounds < 1:
            raise ValueError("a batch needs at least one group and one generation round")

    def fill(
        self,
        generate: Callable[[int], Sequence[G]],
        rewards: Callable[[G], Sequence[float]],
    ) -> FilledBatch[G]:
        """Call ``generate(n)`` — ``n`` the groups still missing; it may return more or fewer —
        until ``groups`` informative groups are kept (extra ones are not used), or ``max_rounds``
        rounds have run: then the batch is the informative groups found, filled up with the
        first uninformative ones (:attr:`FilledBatch.filler`)."""
        kept: list[G] = []
        spare: list[G] = []
        dropped = 0
        rounds = 0
        while len(kept) < self.groups and rounds < self.max_rounds:
            rounds += 1
            for group in generate(self.groups - len(kept)):
                if len(kept) == self.groups:
                    break
                if informative(rewards(group)):
                    kept.append(group)
                else:
                    dropped += 1
                    if len(spare) < self.groups:
                        spare.append(group)
        return FilledBatch(kept, rounds, dropped, spare[: self.groups - len(kept)])


@dataclass
class EmptySteps:
    """The stage's record of steps whose rollouts held no informative group; kept in its
    checkpoints (:meth:`state`), so a resumed stage goes on counting."""

    patience: int
    """Consecutive empty steps after which the stage ends early."""
    streak: int = 0
    """Empty steps in a row, up to the last one."""
    skipped: int = 0
    """Empty steps in the stage: no optimizer step was taken."""
    trained: int = 0
    """Steps that trained on at least one informative group."""
    partial: int = 0
    """Of those, steps whose batch the rounds could not fill."""

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError("patience must be ≥ 1")

    def observe(self, informative_groups: int, complete: bool, solved: bool) -> str | None:
        """Record one step: ``informative_groups`` kept, whether the batch was full of them,
        whether every reward of an empty step was the top one (the prompts are solved). Returns
        ``"end"`` when the stage should end early, as completed; raises
        ``dynamic_sampling_exhausted`` when it has nothing to learn and never had; else
        ``None``."""
        if informative_groups > 0:
            self.streak = 0
            self.trained += 1
            self.partial += 0 if complete else 1
            return None
        self.streak += 1
        self.skipped += 1
        if self.streak < self.patience:
            return None
        if self.trained == 0 and not solved:
            raise ItoError(
                "dynamic_sampling_exhausted",
                f"{self.streak} step(s) in a row gave no group whose rewards differ, and no "
                "step of the stage ever did: the rewards do not vary for this policy on "
                "these prompts",
                empty_steps=self.streak,
            )
        return "end"

    def state(self) -> dict[str, int]:
        return {
            "patience": self.patience,
            "streak": self.streak,
            "skipped": self.skipped,
            "trained": self.trained,
            "partial": self.partial,
        }

    @staticmethod
    def restore(state: object, patience: int) -> EmptySteps:
        """The record a checkpoint carried (``None`` or not a record: a fresh one)."""
        if not isinstance(state, dict):
            return EmptySteps(patience)
        return EmptySteps(
            patience,
            streak=int(state.get("streak", 0)),
            skipped=int(state.get("skipped", 0)),
            trained=int(state.get("trained", 0)),
            partial=int(state.get("partial", 0)),
        )


@dataclass
class StalenessGate:
    max_staleness: int
    dropped: int = 0
    """Samples refused for their lag."""
    lags: Counter[int] = field(default_factory=Counter)
    """Lag of every sample offered (consumed or dropped)."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be ≥ 0")

    def admit(self, sample_version: int, trainer_version: int) -> bool:
        """Whether the trainer at ``trainer_version`` may consume a sample generated by
        ``sample_version``; a refused one is counted as dropped."""
        lag = trainer_version - sample_version
        if lag < 0:
            raise ValueError(
                f"a sample of policy version {sample_version} is newer than the trainer's "
                f"{trainer_version}"
            )
        self.lags[lag] += 1
        if lag > self.max_staleness:
            self.dropped += 1
            return False
        return True
