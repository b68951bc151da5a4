"""The cost estimate of a run on a booking: GPU-hours × the booking's hourly rate.

Compute is counted in model FLOPs (6·N·D plus attention, :meth:`ModelSize.flops_per_token`) and
turned into time with the accelerator's dense peak and an assumed MFU; every booked accelerator
is held for the whole run, so GPU-hours are wall hours × booked accelerators. The estimate is
deliberately simple and conservative; it is what the confirmation's cost bound is checked
against, and it is shown to the human who approves.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ito.core.hardware import ACCELERATORS
from ito.core.ladder import ladder_plan, proxy_size
from ito.core.manifest import Manifest
from ito.core.model_sizes import SIZES

__all__ = ["CostEstimate", "StageEstimate", "estimate_cost"]

STAGE_OVERHEAD_SECONDS = 60.0
"""Fixed time per stage for evals, checkpoint commits and process start-up."""
DATA_PREP_SECONDS = 60.0

# Work multipliers relative to plain next-token training on the same tokens.
# DPO runs the policy forward+backward and a frozen reference forward (6N + 2N per token).
DPO_FACTOR = 8.0 / 6.0
# GRPO: rollouts generate every token (2N) and are trained on (6N) with a reference (2N).
RLVR_FACTOR = 10.0 / 6.0


@dataclass(frozen=True)
class StageEstimate:
    stage: str
    tokens: int
    seq_len: int
    flops: float
    seconds: float


@dataclass(frozen=True)
class CostEstimate:
    accelerator: str
    accelerators: int
    stages: list[StageEstimate]
    seconds: float
    gpu_hours: float
    rate_usd_per_gpu_hour: float
    cost_usd: float
    ceiling_usd: float
    max_incremental_cost_usd: float
    parallelism: dict[str, Any] | None = None
    """The run's accepted parallelism plan (:meth:`ito.core.run_plan.RunPlan.to_dict`), set by
    gate 5; stored with the estimate so the run carries it to its engine."""

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
            f.name: getattr(self, f.name) for f in fields(self) if f.name != "stages"
        }
        data["stages"] = [
            {f.name: getattr(stage, f.name) for f in fields(stage)} for stage in self.stages
        ]
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
) -> CostEstimate:
    accel = ACCELERATORS[accelerator]
    count = nodes * gpus_per_node
    throughput = count * accel.peak_bf16_flops * accel.assumed_mfu
    size = SIZES[manifest.model.size]
    last_seq = manifest.curriculum[-1].seq_len

    stages: list[StageEstimate] = []

    def add(stage: str, tokens: int, seq_len: int, flops: float) -> None:
        stages.append(
            StageEstimate(
                stage, tokens, seq_len, flops, flops / throughput + STAGE_OVERHEAD_SECONDS
            )
        )

    stages.append(StageEstimate("data_prep", 0, 0, 0.0, DATA_PREP_SECONDS))
    ladder = ladder_plan(manifest) if manifest.ladder.enabled else None
    if ladder is not None:
        proxy = proxy_size(manifest)
        seq = ladder.stage.seq_len
        # Two proxy runs: the reference mix with and without the custom data (§7.4).
        add(
            "ladder",
            2 * manifest.ladder.tokens,
            seq,
            2 * manifest.ladder.tokens * proxy.flops_per_token(seq),
        )
    for stage in manifest.curriculum:
        add(
            stage.stage,
            stage.tokens,
            stage.seq_len,
            stage.tokens * size.flops_per_token(stage.seq_len),
        )
    post = manifest.post_training
    if post.sft is not None:
        add(
            "sft",
            post.sft.max_tokens,
            last_seq,
            post.sft.max_tokens * size.flops_per_token(last_seq),
        )
    if post.dpo is not None:
        add(
            "dpo",
            post.dpo.max_tokens,
            last_seq,
            post.dpo.max_tokens * size.flops_per_token(last_seq) * DPO_FACTOR,
        )
    if post.rlvr is not None:
        add(
            "rlvr",
            post.rlvr.max_tokens,
            last_seq,
            post.rlvr.max_tokens * size.flops_per_token(last_seq) * RLVR_FACTOR,
        )

    seconds = sum(s.seconds for s in stages)
    gpu_hours = seconds / 3600.0 * count
    cost = round(gpu_hours * rate_usd_per_gpu_hour, 6)
    return CostEstimate(
        accelerator=accelerator,
        accelerators=count,
        stages=stages,
        seconds=round(seconds, 3),
        gpu_hours=round(gpu_hours, 6),
        rate_usd_per_gpu_hour=rate_usd_per_gpu_hour,
        cost_usd=cost,
        ceiling_usd=manifest.budget.ceiling_usd,
        max_incremental_cost_usd=manifest.budget.max_incremental_cost_usd,
    )
