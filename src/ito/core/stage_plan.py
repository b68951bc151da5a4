"""The stage plan of a run: exactly the stages it will execute, in order, each with its kind,
optimizer steps, tokens, sequence length, eval battery and estimated seconds (DESIGN §5.4,
§5.8, §7.5).

One source for every surface: the cost estimate prices these stages
(:func:`ito.core.pricing.estimate_cost`), ``ito plan`` shows them, gate 5 fixes them at the run's
creation (stored in the run's estimate as ``stage_plan``), and ``runs show``, ``runs watch``,
the MCP tools and the approval page draw them. A stage that will not run is not in the plan.

Steps are counted as the engine counts them (``ito.pipeline.train.Trainer._plans``):
``max(1, tokens // (sequences_per_step × seq_len))``, where ``sequences_per_step`` is what every
optimizer step of the run's layout trains on (:func:`sequences_per_step`). The engine's metric
points carry the run's global step; a stage's steps follow its predecessors' (``first_step``).

:func:`stage_progress` turns the plan and what the run has reported (stage events, its latest
step per stage) into each stage's progress — step / total, tokens, ETA — without I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from ito.core.ladder import ladder_plan, proxy_size
from ito.core.manifest import post_stage_seq_len
from ito.core.model_sizes import SIZES
from ito.core.run_plan import SEQUENCES_PER_RANK

if TYPE_CHECKING:
    from ito.core.manifest import Manifest
    from ito.core.planner import Plan

__all__ = [
    "DATA_PREP_SECONDS",
    "DPO_FACTOR",
    "RLVR_FACTOR",
    "STAGE_OVERHEAD_SECONDS",
    "UNCALIBRATED_SLOWDOWN",
    "PlannedStage",
    "StageKind",
    "StagePlan",
    "StageProgress",
    "StageStatus",
    "build_stage_plan",
    "data_parallel",
    "legacy_stage_plan",
    "post_step_rows",
    "rlvr_factor",
    "sequences_per_step",
    "stage_progress",
    "stored_stage_plan",
]

STAGE_OVERHEAD_SECONDS = 60.0
"""Fixed time per stage for evals, checkpoint commits and process start-up."""
DATA_PREP_SECONDS = 60.0

UNCALIBRATED_SLOWDOWN = 3.0
"""How much slower than predicted a stage may run before its upper bound is passed. The
throughput every estimate assumes (the accelerator's peak × an assumed MFU,
:mod:`ito.core.hardware`) has not been calibrated by a benchmark on any accelerator yet, and a
shared or loaded host runs slower still: the upper bound of each stage is its expected time ×
this factor (measured on the 2-core CPU stand-in: demo runs took 0.5-3× their expected time)."""

# Work multipliers relative to plain next-token training on the same tokens.
# DPO runs the policy forward+backward and a frozen reference forward (6N + 2N per token).
DPO_FACTOR = 8.0 / 6.0
# GRPO: each generation round generates every token of the batch (2N), which is then trained
# on (6N) with the generating policy's log-probabilities scored (2N). With dynamic sampling a
# step takes 1 to ``max_generation_rounds`` rounds.
RLVR_FACTOR = 10.0 / 6.0


def rlvr_factor(rounds: float) -> float:
    """RLVR's work per trained token relative to plain training, at ``rounds`` generation
    rounds per step."""
    return (2.0 * rounds + 8.0) / 6.0


StageKind = Literal["data_prep", "ladder", "curriculum", "post_training"]
StageStatus = Literal["pending", "running", "done", "stopped", "not_run"]
"""``stopped``: the stage the run ended in without completing it; ``not_run``: a stage of the
plan the ended run never reached."""


class PlannedStage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    kind: StageKind
    steps: int | None
    """Optimizer steps the engine takes; ``None`` for work not counted in steps (data
    preparation, the ladder's proxy runs)."""
    first_step: int = 0
    """The run's global step before this stage's first step (metric points count globally)."""
    tokens: int
    """The stage's token budget (the manifest's)."""
    tokens_per_step: int = 0
    """Tokens every optimizer step trains on (0 where there are no steps)."""
    seq_len: int
    battery: str | None = None
    """The fixed eval battery that gates the stage."""
    flops: float = 0.0
    seconds: float
    """Expected wall seconds, the stage's fixed overhead included."""
    upper_seconds: float = 0.0
    """The most the stage should take: its expected time × :data:`UNCALIBRATED_SLOWDOWN`, and
    for RLVR every step at ``max_generation_rounds`` (0 in plans stored before it existed:
    read :attr:`upper`)."""

    @property
    def upper(self) -> float:
        return max(self.upper_seconds, self.seconds)


class StagePlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    sequences_per_step: int
    """Sequences every optimizer step trains on, over every data-parallel rank."""
    stages: list[PlannedStage]
    exact: bool = True
    """``False`` for a plan rebuilt from a run created before plans were stored (its steps
    are unknown)."""

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    @property
    def upper_seconds(self) -> float:
        return sum(s.upper for s in self.stages)

    def stage(self, name: str) -> PlannedStage | None:
        return next((s for s in self.stages if s.name == name), None)


def sequences_per_step(plan: Plan | None, accelerators: int) -> int:
    """What one optimizer step trains on: the planned layout's data-parallel ranks × the
    sequences each rank takes per step (micro-batch × accumulation, or × the pipeline's
    micro-batches); without a plan, the engine's default (:data:`SEQUENCES_PER_RANK` per
    accelerator)."""
    if plan is None:
        return SEQUENCES_PER_RANK * accelerators
    per_rank = plan.micro_batch * (plan.pp_microbatches if plan.pp > 1 else plan.grad_accum)
    return plan.dp_replicate * plan.dp_shard * per_rank


def post_step_rows(stage: str, sequences_per_rank: int, group_size: int = 1) -> int:
    """Rows of the stage's ``seq_len`` one rank trains on per step: SFT one per sequence slot;
    DPO two per pair, half as many pairs as slots (at least one); RLVR whole groups of samples
    (at least one group)."""
    if stage == "dpo":
        return 2 * max(1, sequences_per_rank // 2)
    if stage == "rlvr":
        return group_size * max(1, sequences_per_rank // group_size)
    return sequences_per_rank


def data_parallel(plan: Plan | None, accelerators: int) -> int:
    """Data-parallel ranks of the planned layout (without a plan, the engine's default: FSDP
    over every accelerator)."""
    if plan is None:
        return accelerators
    return plan.dp_replicate * plan.dp_shard


def build_stage_plan(
    manifest: Manifest,
    *,
    throughput_flops: float,
    sequences_per_step: int,
    data_parallel: int,
) -> StagePlan:
    """The stages the run executes, in order, priced at ``throughput_flops`` (FLOP/s of every
    booked accelerator together).

    This is the one place a stage enters a run's plan: post-training stages are added here
    (``_post_training``), with the steps their engine takes."""
    size = SIZES[manifest.model.size]
    stages: list[PlannedStage] = [
        PlannedStage(
            name="data_prep",
            kind="data_prep",
            steps=None,
            tokens=0,
            seq_len=0,
            seconds=DATA_PREP_SECONDS,
            upper_seconds=DATA_PREP_SECONDS * UNCALIBRATED_SLOWDOWN,
        )
    ]
    first = 0

    def add(
        name: str,
        kind: StageKind,
        tokens: int,
        seq_len: int,
        flops: float,
        battery: str | None,
        counted: bool = True,
        rows_per_rank: int | None = None,
        upper_flops: float | None = None,
    ) -> None:
        nonlocal first
        rows = sequences_per_step if rows_per_rank is None else rows_per_rank * data_parallel
        per_step = rows * seq_len
        steps = max(1, tokens // per_step) if counted else None
        stages.append(
            PlannedStage(
                name=name,
                kind=kind,
                steps=steps,
                first_step=first if counted else 0,
                tokens=tokens,
                tokens_per_step=per_step if counted else 0,
                seq_len=seq_len,
                battery=battery,
                flops=flops,
                seconds=flops / throughput_flops + STAGE_OVERHEAD_SECONDS,
                upper_seconds=(
                    (flops if upper_flops is None else upper_flops) / throughput_flops
                    + STAGE_OVERHEAD_SECONDS
                )
                * UNCALIBRATED_SLOWDOWN,
            )
        )
        first += steps or 0

    ladder = ladder_plan(manifest) if manifest.ladder.enabled else None
    if ladder is not None:
        seq = ladder.stage.seq_len
        tokens = 2 * manifest.ladder.tokens  # both proxy runs: with and without the custom data
        flops = tokens * proxy_size(manifest).flops_per_token(seq)
        add("ladder", "ladder", tokens, seq, flops, None, counted=False)
    for stage in manifest.curriculum:
        flops = stage.tokens * size.flops_per_token(stage.seq_len)
        add(stage.stage, "curriculum", stage.tokens, stage.seq_len, flops, stage.battery)
    _post_training(manifest, add, max(1, sequences_per_step // data_parallel))
    return StagePlan(sequences_per_step=sequences_per_step, stages=stages)


def _post_training(manifest: Manifest, add: Callable[..., None], per_rank: int) -> None:
    """SFT, DPO and RLVR, as the manifest asks for them, each at its own sequence length with
    the rows per step the engine trains on (:func:`post_step_rows`). SFT's steps are a bound:
    its ``epochs`` may end it sooner (the engine's ``stage started`` event says by how much)."""
    size = SIZES[manifest.model.size]
    post = manifest.post_training
    if post.sft is not None:
        seq = post_stage_seq_len(manifest, post.sft)
        tokens = post.sft.max_tokens
        flops = tokens * size.flops_per_token(seq)
        rows = post_step_rows("sft", per_rank)
        add("sft", "post_training", tokens, seq, flops, post.sft.battery, rows_per_rank=rows)
    if post.dpo is not None:
        seq = post_stage_seq_len(manifest, post.dpo)
        tokens = post.dpo.max_tokens
        flops = tokens * size.flops_per_token(seq) * DPO_FACTOR
        rows = post_step_rows("dpo", per_rank)
        add("dpo", "post_training", tokens, seq, flops, post.dpo.battery, rows_per_rank=rows)
    if post.rlvr is not None:
        seq = post_stage_seq_len(manifest, post.rlvr)
        tokens = post.rlvr.max_tokens
        dapo = post.rlvr.dapo
        expected = dapo.expected_generation_rounds if dapo.dynamic_sampling else 1.0
        most = dapo.max_generation_rounds if dapo.dynamic_sampling else 1
        flops = tokens * size.flops_per_token(seq) * rlvr_factor(expected)
        upper = tokens * size.flops_per_token(seq) * rlvr_factor(most)
        rows = post_step_rows("rlvr", per_rank, post.rlvr.group_size)
        add(
            "rlvr",
            "post_training",
            tokens,
            seq,
            flops,
            post.rlvr.battery,
            rows_per_rank=rows,
            upper_flops=upper,
        )


_LEGACY_KINDS: dict[str, StageKind] = {
    "data_prep": "data_prep",
    "ladder": "ladder",
    "sft": "post_training",
    "dpo": "post_training",
    "rlvr": "post_training",
}


def stored_stage_plan(estimate: Mapping[str, Any] | None) -> StagePlan:
    """The plan a run stored in its estimate at creation (``stage_plan``), or for a run created
    before plans were stored, the one :func:`legacy_stage_plan` rebuilds."""
    estimate = estimate or {}
    stored = estimate.get("stage_plan")
    if isinstance(stored, Mapping):
        return StagePlan.model_validate(stored)
    return legacy_stage_plan(estimate)


def legacy_stage_plan(estimate: Mapping[str, Any]) -> StagePlan:
    """The plan of a run created before plans were stored, rebuilt from its estimate's stages.
    Those estimates priced post-training stages that no engine of those versions ran: they are
    left out, so nothing that did not run is shown."""
    stages = []
    for entry in estimate.get("stages") or []:
        name = str(entry.get("stage", ""))
        kind = _LEGACY_KINDS.get(name, "curriculum")
        if kind == "post_training":
            continue
        stages.append(
            PlannedStage(
                name=name,
                kind=kind,
                steps=None,
                tokens=int(entry.get("tokens", 0)),
                seq_len=int(entry.get("seq_len", 0)),
                flops=float(entry.get("flops", 0.0)),
                seconds=float(entry.get("seconds", 0.0)),
            )
        )
    return StagePlan(sequences_per_step=0, stages=stages, exact=False)


class StageProgress(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    kind: StageKind
    status: StageStatus
    step: int | None
    """Steps taken inside the stage (``None`` where it has no steps)."""
    steps: int | None
    """The stage's planned steps."""
    tokens: int | None
    """Tokens trained inside the stage so far."""
    eta_seconds: float | None
    """Seconds left in the stage at the last step's pace (running stages only)."""
    estimated_seconds: float
    upper_seconds: float = 0.0
    """The most the stage should take (:attr:`PlannedStage.upper`)."""


def stage_progress(
    plan: StagePlan,
    *,
    terminal: bool,
    started: Collection[str],
    completed: Collection[str],
    last_step: Mapping[str, int],
    step_seconds: float | None,
    taken: Mapping[str, int] | None = None,
) -> list[StageProgress]:
    """Each planned stage's progress. ``started``/``completed``: the stages whose events say
    so; ``last_step``: the run's latest global step reported per stage; ``step_seconds``: the
    latest step's duration. A stage is ``done`` only when its ``completed`` event came (or,
    for data preparation and the ladder, which gate what follows, once a later stage started)."""
    names = plan.names
    reached = [i for i, name in enumerate(names) if name in started or name in completed]
    furthest = max(reached, default=-1)
    rows = []
    for index, stage in enumerate(plan.stages):
        done = stage.name in completed or (
            stage.kind in ("data_prep", "ladder") and index < furthest
        )
        step: int | None = None
        tokens: int | None = None
        if stage.steps is not None:
            global_step = last_step.get(stage.name)
            step = 0 if global_step is None else global_step - stage.first_step
            if done:
                # A stage that ended early (RLVR with nothing left to learn) says how far.
                step = min((taken or {}).get(stage.name, stage.steps), stage.steps)
            else:
                step = max(0, min(step, stage.steps))
            tokens = step * stage.tokens_per_step
        elif stage.name in last_step and not plan.exact:
            step = last_step[stage.name]
        status: StageStatus
        if done:
            status = "done"
        elif stage.name in started or index == furthest:
            status = "stopped" if terminal else "running"
        else:
            status = "not_run" if terminal else "pending"
        eta = None
        if status == "running" and stage.steps is not None and step is not None:
            pace = step_seconds
            if pace is None:
                pace = (stage.seconds - STAGE_OVERHEAD_SECONDS) / stage.steps
            eta = round(max(0, stage.steps - step) * max(pace, 0.0), 1)
        rows.append(
            StageProgress(
                name=stage.name,
                kind=stage.kind,
                status=status,
                step=step,
                steps=stage.steps,
                tokens=tokens,
                eta_seconds=eta,
                estimated_seconds=round(stage.seconds, 1),
                upper_seconds=round(stage.upper, 1),
            )
        )
    return rows
