"""What the API answers about manifests and plans (DESIGN §5.3, §5.4): a stored manifest, its
summary, and the side-effect-free plan of a run — the ``data`` of those routes, as models (see
:mod:`ito.core.run_views` for the rules).

A manifest's ``resources``, ``budget`` and ``checkpoint`` sections are echoed as validated; their
schema is the manifest's own (``/v1/schemas/manifest``), so they stay open objects here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ito.core.booking_views import EligibilityRecord
from ito.core.parallelism_views import ParallelismPlanned, ParallelismRefused
from ito.core.responses import ErrorBody

__all__ = [
    "ChecksPassed",
    "ChecksRefused",
    "GateSpecView",
    "Ineligible",
    "ManifestStored",
    "ManifestSummary",
    "ManifestView",
    "ModelSummary",
    "Plan",
    "PlanCost",
    "PlanValidation",
    "PlanWarning",
    "SourceSummary",
    "StagePlan",
]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ModelSummary(_View):
    family: str
    size: str
    revision: str
    """``scratch`` or the ``sha256:`` of the starting weights."""
    parameters: int


class SourceSummary(_View):
    """One data source of the manifest (its URI is not repeated)."""

    id: str
    role: str
    license: str
    custom: bool


class GateSpecView(_View):
    """One gate a stage must pass: exactly one of ``min``, ``max`` (absolute) or ``min_ratio``,
    ``max_ratio`` (times the untrained model's value at step 0) is set."""

    stage: str
    battery: str
    eval: str
    data: str
    min: float | None = None
    max: float | None = None
    min_ratio: float | None = None
    max_ratio: float | None = None
    gate: str
    """How a human reads it: ``heldout_loss(web) ≤ 0.6 × step 0``."""


class ManifestSummary(_View):
    """What a human approving this manifest needs to see at a glance."""

    name: str
    model: ModelSummary
    resources: dict[str, Any]
    stages: list[str]
    """The curriculum's stages, then the post-training ones the manifest names."""
    curriculum_tokens: int
    data: list[SourceSummary]
    budget: dict[str, Any]
    checkpoint: dict[str, Any]
    gates: list[GateSpecView] = []
    """Every stage's eval gates and their bounds, frozen with the manifest's digest."""


class ManifestView(_View):
    manifest_id: str
    """The digest: ``sha256:`` of the manifest's exact bytes."""
    digest: str
    """The same as ``manifest_id``."""
    size_bytes: int
    summary: ManifestSummary
    created_at: str


class ManifestStored(ManifestView):
    created: bool
    """False when these bytes were already stored: nothing changed."""


# ---- plan --------------------------------------------------------------------------------------


class PlanValidation(_View):
    ok: bool
    schema_: str = Field(alias="schema")
    """The manifest schema it was validated against."""


class Ineligible(_View):
    """The booking would be refused at gate 1 now; ``error`` is that refusal."""

    eligible: Literal[False]
    booking_id: str
    checked_at: str
    error: ErrorBody


class ChecksPassed(_View):
    """Gate 5's resource checks pass."""

    ok: Literal[True]
    checkpoint_uri: str
    """Where this run's checkpoints would go (``{run_id}`` stands for the run's id)."""
    checkpoint_bytes_reserved: int


class ChecksRefused(_View):
    ok: Literal[False]
    error: ErrorBody


class StagePlan(_View):
    """One stage the run would execute (:class:`ito.core.stage_plan.PlannedStage`)."""

    stage: str
    kind: Literal["data_prep", "ladder", "curriculum", "post_training"]
    steps: int | None
    """Optimizer steps, counted as the engine counts them on the planned layout; ``None`` for
    work not counted in steps."""
    tokens: int
    tokens_per_step: int
    seq_len: int
    battery: str | None
    estimated_seconds: float
    upper_seconds: float = 0.0
    """The most the stage should take (its expected time at an uncalibrated throughput;
    RLVR: every step at its most generation rounds)."""


class PlanCost(_View):
    """The cost estimate (:class:`ito.core.pricing.CostEstimate`) without its stages."""

    accelerator: str
    accelerators: int
    seconds: float
    gpu_hours: float
    rate_usd_per_gpu_hour: float
    cost_usd: float
    ceiling_usd: float
    max_incremental_cost_usd: float
    within_ceiling: bool
    within_incremental: bool
    upper_seconds: float = 0.0
    """The most the run should take: every stage at its upper bound (an uncalibrated
    throughput, RLVR at its most generation rounds)."""
    upper_cost_usd: float = 0.0
    """The cost at ``upper_seconds``: the bound the approver signs by default."""
    assumed_mfu: float = 0.0
    """The fraction of peak FLOP/s both the time and the cost assume (uncalibrated)."""


class PlanWarning(_View):
    """Something the run would do differently from what the manifest asks, said not hidden."""

    code: str
    stages: list[str]
    message: str


class Plan(_View):
    """What creating the run would do; nothing was written."""

    ready: bool
    """True when the run would pass every gate checked here (``refusals`` is empty)."""
    booking_id: str
    manifest_id: str
    validation: PlanValidation
    summary: ManifestSummary
    eligibility: Annotated[EligibilityRecord | Ineligible, Field(discriminator="eligible")]
    checks: Annotated[ChecksPassed | ChecksRefused, Field(discriminator="ok")]
    parallelism: Annotated[ParallelismPlanned | ParallelismRefused, Field(discriminator="ok")]
    """The parallelism and precision plan on this booking (DESIGN §7.2), or the planner's
    refusal (``plan_refused`` with its reasons); computed even when another check refuses."""
    initial_weights: dict[str, Any] | None = None
    """The manifest's ``model.revision`` as the run would record it
    (:class:`ito.core.revisions.InitialWeights`: kind, sha256, the source run, stage and step
    or the directory); ``None`` for ``scratch`` or when it is refused (see ``refusals``)."""
    stage_plan: list[StagePlan]
    cost: PlanCost
    refusals: list[ErrorBody]
    warnings: list[PlanWarning]
