"""The cost estimate of a run on a booking: GPU-hours × the booking's hourly rate.

Compute is counted in model FLOPs (6·N·D plus attention, :meth:`ModelSize.flops_per_token`) and
turned into time with the accelerator's dense peak and an assumed MFU; every booked accelerator
is held for the whole run, so GPU-hours are wall hours × booked accelerators. The assumed MFU is
uncalibrated (no benchmark on the accelerator has measured it), so every estimate carries an
upper bound beside its expected figure (:data:`ito.core.stage_plan.UNCALIBRATED_SLOWDOWN`, and
RLVR at its most generation rounds). Both are shown to the human who approves; the expected cost
is what the budget gates check, the upper one is what the approver signs by default — a spending
limit the run never passes without a new approval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ito.core.hardware import ACCELERATORS
from ito.core.manifest import Manifest
from ito.core.stage_plan import (
    STAGE_OVERHEAD_SECONDS,
    PlannedStage,
    StagePlan,
    build_stage_plan,
    sequences_per_step,
)

__all__ = [
    "STAGE_OVERHEAD_SECONDS",
    "CostEstimate",
    "StageEstimate",
    "cents_up",
    "estimate_cost",
]


def cents_up(usd: float) -> float:
    """``usd`` rounded up to the cent (a figure a human signs); float noise below a millionth
    of a cent never adds one (``0.25`` stays ``0.25``)."""
    return math.ceil(round(usd * 100, 6)) / 100


@dataclass(frozen=True)
class StageEstimate:
    """One priced stage as the estimate's ``stages`` list shows it (kept for readers of runs
    stored before the stage plan; the plan itself is :attr:`CostEstimate.stage_plan`)."""

    stage: str
    tokens: int
    seq_len: int
    flops: float
    seconds: float

    @classmethod
    def of(cls, stage: PlannedStage) -> StageEstimate:
        return cls(stage.name, stage.tokens, stage.seq_len, stage.flops, stage.seconds)


@dataclass(frozen=True)
class CostEstimate:
    accelerator: str
    accelerators: int
    stage_plan: StagePlan
    """Exactly the stages the run executes (:mod:`ito.core.stage_plan`), what is priced."""
    seconds: float
    gpu_hours: float
    rate_usd_per_gpu_hour: float
    cost_usd: float
    ceiling_usd: float
    max_incremental_cost_usd: float
    parallelism: dict[str, Any] | None = None
    """The run's accepted parallelism plan (:meth:`ito.core.run_plan.RunPlan.to_dict`), set by
    gate 5; stored with the estimate so the run carries it to its engine."""
    upper_seconds: float = 0.0
    """The most the run should take (:attr:`StagePlan.upper_seconds`)."""
    upper_cost_usd: float = 0.0
    """What the run costs at :attr:`upper_seconds`: the cost bound a train confirmation asks
    the approver to sign by default (within the manifest's ceiling and max incremental
    cost)."""
    assumed_mfu: float = 0.0
    """The one fraction of peak FLOP/s that both the time and the cost above assume (the
    accelerator's :attr:`~ito.core.hardware.Accelerator.assumed_mfu`; uncalibrated until a
    benchmark on that accelerator measures it)."""

    @property
    def stages(self) -> list[StageEstimate]:
        return [StageEstimate.of(stage) for stage in self.stage_plan.stages]

    @property
    def within_ceiling(self) -> bool:
        return self.cost_usd <= self.ceiling_usd

    @property
    def within_incremental(self) -> bool:
        return self.cost_usd <= self.max_incremental_cost_usd

    def to_dict(self) -> dict[str, Any]:
        """As stored with the run and answered by the API. Built field by field, not with
        ``dataclasses.asdict``, which deep-copies the (already plain) parallelism plan: on the
        create path that copy cost more than every database statement together."""
        data: dict[str, Any] = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name != "stage_plan"
        }
        data["stages"] = [
            {f.name: getattr(stage, f.name) for f in fields(stage)} for stage in self.stages
        ]
        data["stage_plan"] = self.stage_plan.model_dump()
        if self.parallelism is None:
            del data["parallelism"]
        data["within_ceiling"] = self.within_ceiling
        data["within_incremental"] = self.within_incremental
        return data


def estimate_cost(
    manifest: Manifest,
    *,
    accelerator: str,
    nodes: int,
    gpus_per_node: int,
    rate_usd_per_gpu_hour: float,
    sequences_per_step: int | None = None,
    data_parallel: int | None = None,
) -> CostEstimate:
    """The run's stage plan, priced. ``sequences_per_step`` and ``data_parallel``: what one
    optimizer step of the planned layout trains on and over how many data-parallel ranks
    (:func:`ito.core.stage_plan.sequences_per_step`, :func:`~ito.core.stage_plan.data_parallel`);
    ``None``: the engine's default layout on the booked accelerators."""
    accel = ACCELERATORS[accelerator]
    count = nodes * gpus_per_node
    throughput = count * accel.peak_bf16_flops * accel.assumed_mfu
    stage_plan = build_stage_plan(
        manifest,
        throughput_flops=throughput,
        sequences_per_step=(
            sequences_per_step if sequences_per_step is not None else _default_step(count)
        ),
        data_parallel=data_parallel if data_parallel is not None else count,
    )
    seconds = stage_plan.seconds
    gpu_hours = seconds / 3600.0 * count
    cost = round(gpu_hours * rate_usd_per_gpu_hour, 6)
    upper = stage_plan.upper_seconds
    return CostEstimate(
        accelerator=accelerator,
        accelerators=count,
        stage_plan=stage_plan,
        seconds=round(seconds, 3),
        gpu_hours=round(gpu_hours, 6),
        rate_usd_per_gpu_hour=rate_usd_per_gpu_hour,
        cost_usd=cost,
        ceiling_usd=manifest.budget.ceiling_usd,
        max_incremental_cost_usd=manifest.budget.max_incremental_cost_usd,
        upper_seconds=round(upper, 3),
        assumed_mfu=accel.assumed_mfu,
        upper_cost_usd=round(upper / 3600.0 * count * rate_usd_per_gpu_hour, 6),
    )


def _default_step(accelerators: int) -> int:
    return sequences_per_step(None, accelerators)
