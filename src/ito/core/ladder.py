"""The ladder decision (DESIGN §7.4): what the job compares, and the rule that decides.

Data marked ``custom`` must win its place before the real training starts. The ladder trains a
small proxy model twice, from the same seed, for the same token budget (``ladder.tokens`` each):
once on the *reference mix* — the non-custom data of the curriculum stage that names the
custom data — and once on that mix with the custom data added. Both are measured on that
stage's eval battery at its sequence length. The custom data passes if, on every eval of the
battery, it loses by no more than ``ladder.margin``:

- losses (``heldout_loss``, ``perplexity``): relative to the reference — the custom run's value
  at most ``(1 + margin) ×`` the reference run's;
- accuracies (``exact_match``, ``sampled_exact_match``, ``multiple_choice``, fractions in
  [0, 1]): in accuracy points — at least the reference's value ``− margin``.

A value that is not known or not finite (a diverged proxy) fails closed. The proxy is the named
size with the run's vocabulary (both arms read the run's tokenizer), so its cost in the
estimate is exactly what the job trains.

Pure: no torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ito.core.manifest import LOSS_EVALS, CurriculumStage, EvalSpec, Manifest
from ito.core.model_sizes import SIZES, ModelSize

__all__ = [
    "LadderPlan",
    "ladder_passes",
    "ladder_plan",
    "ladder_rule",
    "ladder_threshold",
    "proxy_size",
]


@dataclass(frozen=True)
class LadderPlan:
    """What the ladder job compares."""

    stage_index: int
    """Position in the curriculum of the stage that names the custom data."""
    stage: CurriculumStage
    reference: tuple[str, ...]
    """The stage's data that is not custom (the reference mix)."""
    custom: tuple[str, ...]
    """The stage's custom data."""

    @property
    def with_custom(self) -> tuple[str, ...]:
        return self.reference + self.custom


def ladder_plan(manifest: Manifest) -> LadderPlan | None:
    """The comparison the ladder runs: the first curriculum stage that names custom data
    (validation and :mod:`ito.core.runtime_support` refuse manifests whose custom data is
    anywhere else), or ``None`` when no stage does."""
    custom = {ref.id for ref in manifest.data if ref.custom}
    for index, stage in enumerate(manifest.curriculum):
        if any(d in custom for d in stage.data):
            return LadderPlan(
                stage_index=index,
                stage=stage,
                reference=tuple(d for d in stage.data if d not in custom),
                custom=tuple(d for d in stage.data if d in custom),
            )
    return None


def proxy_size(manifest: Manifest) -> ModelSize:
    """The proxy model: ``ladder.proxy_size`` with the run's vocabulary."""
    return replace(SIZES[manifest.ladder.proxy_size], vocab=SIZES[manifest.model.size].vocab)


def ladder_threshold(eval_name: str, reference: float | None, margin: float) -> float | None:
    """The worst value the custom run may reach given the reference run's (``None`` when the
    reference is not known: nothing to compare with, the decision fails closed)."""
    if reference is None or not math.isfinite(reference):
        return None
    if eval_name in LOSS_EVALS:
        return reference * (1.0 + margin)
    return reference - margin


def ladder_passes(
    eval_name: str, reference: float | None, custom: float | None, margin: float
) -> bool:
    """Whether the custom run's ``custom`` loses to ``reference`` by no more than ``margin``."""
    bound = ladder_threshold(eval_name, reference, margin)
    if bound is None or custom is None or not math.isfinite(custom):
        return False
    return custom <= bound if eval_name in LOSS_EVALS else custom >= bound


def ladder_rule(spec: EvalSpec, margin: float) -> str:
    """The comparison as a human reads it: ``heldout_loss(web) with custom ≤ 1.01 × without``."""
    head = f"{spec.eval}({spec.data}) with custom"
    if spec.eval in LOSS_EVALS:
        return f"{head} ≤ {1.0 + margin:g} × without"
    return f"{head} ≥ without − {margin:g}"
