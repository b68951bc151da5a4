"""The parallelism plan as the API answers it (DESIGN §5.4, §7.2): the ``parallelism`` section of
``POST /v1/plans`` — :meth:`ito.core.run_plan.RunPlan.to_dict` — or the planner's refusal."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from ito.core.responses import ErrorBody, ReasonBody

__all__ = [
    "Communication",
    "LayoutPlan",
    "MemoryPerGpu",
    "ParallelismPlanned",
    "ParallelismRefused",
    "PlanRule",
    "Precision",
    "Predicted",
]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Precision(_View):
    param_dtype: str
    """What the model computes in (FSDP2 ``MixedPrecisionPolicy.param_dtype``)."""
    reduce_dtype: str
    fp8: bool


class MemoryPerGpu(_View):
    """Bytes per GPU (:class:`ito.core.planner_memory.MemoryBreakdown`)."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    loss: int = 0
    """One chunk of the loss's fp32 logits and their gradients (the engine's chunked loss)."""
    buffers: int
    runtime_reserve: int
    capacity: int
    stage: str
    peak_allocated: int
    total: int
    headroom: int
    usable: int


class Communication(_View):
    bytes: float
    seconds: float
    exposed_seconds: float
    """The part the step's compute does not hide."""
    crosses_nodes: bool


class Predicted(_View):
    step_seconds: float
    compute_seconds: float
    recompute_seconds: float
    bubble_seconds: float
    bubble_fraction: float
    exposed_communication_seconds: float
    tokens_per_second: float
    mfu: float
    """Predicted model-FLOPs utilisation."""


class PlanRule(_View):
    """One choice of the plan and the rule that made it."""

    choice: str
    value: bool | int | float | str
    why: str


class LayoutPlan(_View):
    """The planner's plan (:meth:`ito.core.planner.Plan.to_dict`)."""

    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    mesh: dict[str, int]
    """Mesh dimensions, outermost first."""
    micro_batch: int
    grad_accum: int
    pp_microbatches: int
    global_batch_tokens: int
    activation_checkpointing: Literal["none", "selective", "full"]
    precision: Precision
    compile: bool
    memory: MemoryPerGpu
    communication: dict[str, Communication]
    predicted: Predicted
    rules: list[PlanRule]
    warnings: list[ReasonBody]
    candidates: int
    acceptable: int


class ParallelismPlanned(_View):
    """The layout the run would use on this booking."""

    ok: Literal[True]
    mode: Literal["planned", "cpu_stand_in"]
    """``planned``: chosen by the planner (a GPU booking); ``cpu_stand_in``: the engine's CPU
    layout, checked by the planner."""
    applied: bool
    """Whether this engine version trains exactly this layout and precision."""
    note: str
    seq_len: int
    """The sequence length planned for (the curriculum's longest)."""
    pinned: dict[str, int | str]
    """What the manifest pinned (``resources.parallelism``, its replica groups)."""
    plan: LayoutPlan
    layout: dict[str, int | str] | None = None
    """What the run spec carries to the engine (:class:`ito.core.run_spec.LayoutSpec`);
    ``None``: the engine's default layout, which is the plan."""


class ParallelismRefused(_View):
    """No acceptable layout: ``error`` is ``plan_refused`` with its ``reasons``."""

    ok: Literal[False]
    error: ErrorBody
