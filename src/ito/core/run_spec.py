"""The run spec document: what the worker writes to ``spec-<attempt>.json`` for the engine
(DESIGN §7.1), as a model both sides use — the supervisor builds it, the engine validates it
(:func:`ito.pipeline.spec.load_spec`) before it trusts anything in it.

The manifest inside travels as the already-validated document; the engine parses it again.
The fault-injection fields are test and drill hooks, set only through ``ITO_FAULT_INJECTION``.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ito.core.hardware import ACCELERATORS

__all__ = [
    "FAULT_INJECTION_FIELDS",
    "BookedAccelerator",
    "FailAtSpec",
    "RestartFromSpec",
    "RunSpecDocument",
]

_STEP_MAX = 2**31 - 1
FAULT_INJECTION_FIELDS = frozenset(
    {"fail_at", "loss_spike_at", "max_steps_per_stage", "min_step_seconds", "pause_at_step"}
)
"""The fields ``ITO_FAULT_INJECTION`` may set."""


def _absolute(value: str) -> str:
    if not posixpath.isabs(value):
        raise ValueError("must be an absolute path")
    return value


def _known_accelerator(value: str) -> str:
    if value not in ACCELERATORS:
        raise ValueError(f"must be one of {sorted(ACCELERATORS)}")
    return value


AbsolutePath = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_absolute)]
PositiveStep = Annotated[int, Field(ge=1, le=_STEP_MAX)]
Step = Annotated[int, Field(ge=0, le=_STEP_MAX)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FailAtSpec(_Spec):
    rank: Annotated[int, Field(ge=0, le=1 << 20)]
    """Global rank that exits with status 137."""
    step: PositiveStep
    """Global step (1-based) at whose start it exits."""
    replica: Annotated[int, Field(ge=0, le=1024)] = 0
    """Replica group of that rank."""
    rejoin_after_steps: PositiveStep | None = None
    """The killed group waits for a commit this many steps past its newest one."""


class RestartFromSpec(_Spec):
    step: Step
    """Global step of the committed checkpoint to resume from."""
    skip_steps: Step
    """Batches of data to skip after it."""


class BookedAccelerator(_Spec):
    """What the booking promises every node: the engine checks it sees exactly that before it
    trains (``accelerator_unavailable`` otherwise, never a CPU fallback)."""

    gpu: Annotated[str, Field(min_length=1, max_length=20), AfterValidator(_known_accelerator)]
    """The booked accelerator type (:data:`ito.core.hardware.ACCELERATORS`)."""
    gpus_per_node: Annotated[int, Field(ge=1, le=1024)]


class RunSpecDocument(_Spec):
    run_id: Annotated[str, Field(min_length=1, max_length=64)]
    attempt: PositiveStep = 1
    manifest: dict[str, Any]
    """The manifest document (validated again by the engine)."""
    workdir: AbsolutePath
    checkpoint_dir: AbsolutePath
    events_path: AbsolutePath
    storage_root: AbsolutePath | None = None
    """The booking's storage root (resolved); ``checkpoint_dir`` lies strictly below it."""
    stages: (
        Annotated[list[Annotated[str, Field(min_length=1, max_length=30)]], Field(max_length=64)]
        | None
    ) = None
    """Curriculum stages to run, in order; ``None``: the whole curriculum."""
    max_steps_per_stage: PositiveStep | None = None
    fail_at: FailAtSpec | None = None
    loss_spike_at: PositiveStep | None = None
    pause_at_step: PositiveStep | None = None
    min_step_seconds: Annotated[float, Field(gt=0, le=60, allow_inf_nan=False)] | None = None
    restart_from: RestartFromSpec | None = None
    accelerator: BookedAccelerator | None = None
    """The booked accelerator; ``None`` (the engine run alone, in tests): not checked."""
    parallelism: dict[str, Any] | None = None
    """The run's accepted parallelism plan (:meth:`ito.core.run_plan.RunPlan.to_dict`), as
    gate 5 stored it with the run's estimate: for the engine to apply (issue 9 item 3)."""

    @model_validator(mode="after")
    def _checkpoints_below_root(self) -> RunSpecDocument:
        if self.storage_root is not None:
            root = posixpath.normpath(self.storage_root)
            below = posixpath.normpath(self.checkpoint_dir)
            inside = (
                ".." not in self.checkpoint_dir.split("/")
                and below != root
                and below.startswith(root.rstrip("/") + "/")
            )
            if not inside:
                raise ValueError("checkpoint_dir must lie strictly below storage_root")
        return self
