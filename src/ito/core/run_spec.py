"""The run spec document: what the worker writes to ``spec-<attempt>.json`` for the engine
(DESIGN §7.1), as a model both sides use — the supervisor builds it, the engine validates it
(:func:`ito.pipeline.spec.load_spec`) before it trusts anything in it.

The manifest inside travels as the already-validated document; the engine parses it again.
The fault-injection fields are test and drill hooks, set only through ``ITO_FAULT_INJECTION``.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ito.core.hardware import ACCELERATORS

__all__ = [
    "FAULT_INJECTION_FIELDS",
    "BookedAccelerator",
    "FailAtSpec",
    "InitialWeightsSpec",
    "LayoutSpec",
    "RestartFromSpec",
    "RunSpecDocument",
]

_STEP_MAX = 2**31 - 1
FAULT_INJECTION_FIELDS = frozenset(
    {
        "error_at",
        "fail_at",
        "loss_spike_at",
        "max_steps_per_stage",
        "min_step_seconds",
        "pause_at_step",
    }
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


class ErrorAtSpec(_Spec):
    rank: Annotated[int, Field(ge=0, le=1 << 20)]
    """Global rank that raises."""
    step: PositiveStep
    """Global step (1-based) at whose start it raises, on every attempt and every restart: a
    deterministic error, unlike ``fail_at``'s crash."""
    code: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
    """The registered error code it raises."""


class RestartFromSpec(_Spec):
    step: Step
    """Global step of the committed checkpoint to resume from."""
    skip_steps: Step
    """Batches of data to skip after it."""


Degree = Annotated[int, Field(ge=1, le=1 << 16)]
Dtype = Literal["float32", "bfloat16"]


class LayoutSpec(_Spec):
    """The parallel layout the engine applies (the planner's :class:`~ito.core.planner.Plan`,
    as degrees): the mesh is ``pp × dp_replicate × dp_shard × cp × tp`` (TorchTitan's order),
    whose product must be the world size. Absent from a spec: FSDP over every rank, four
    sequences per rank, fp32 (the engine's behaviour before the planner)."""

    dp_replicate: Degree = 1
    dp_shard: Degree = 1
    tp: Degree = 1
    pp: Degree = 1
    cp: Degree = 1
    micro_batch: Degree = 4
    """Sequences per micro-batch on one data-parallel rank."""
    grad_accum: Degree = 1
    """Micro-batches accumulated per optimizer step (without a pipeline)."""
    pp_microbatches: Degree = 1
    """Micro-batches of the pipeline schedule (with one)."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    param_dtype: Dtype = "float32"
    """What FSDP2 gathers parameters in (``MixedPrecisionPolicy.param_dtype``)."""
    reduce_dtype: Dtype = "float32"
    """What gradients are reduced in."""


class BookedAccelerator(_Spec):
    """What the booking promises every node: the engine checks it sees exactly that before it
    trains (``accelerator_unavailable`` otherwise, never a CPU fallback)."""

    gpu: Annotated[str, Field(min_length=1, max_length=20), AfterValidator(_known_accelerator)]
    """The booked accelerator type (:data:`ito.core.hardware.ACCELERATORS`)."""
    gpus_per_node: Annotated[int, Field(ge=1, le=1024)]


class InitialWeightsSpec(_Spec):
    """The weights the run starts from instead of its random initialisation (the manifest's
    ``model.revision``, resolved by the server), verified by the engine before step 0
    (``revision_unresolvable`` otherwise)."""

    kind: Literal["run", "hf"]
    """``run``: a committed DCP checkpoint directory (its model part is loaded; the optimizer
    and trainer state start fresh); ``hf``: a Hugging Face directory (``config.json``,
    ``model.safetensors``)."""
    path: AbsolutePath
    """``run``: the checkpoint's step directory; ``hf``: the directory. Below
    ``storage_root`` when that is given (the engine proves it there on disk)."""
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    """``run``: :func:`ito.core.revisions.checkpoint_digest` of the directory; ``hf``: sha256 of
    ``model.safetensors``."""
    revision: Annotated[str, Field(min_length=1, max_length=2100)]
    """The manifest's ``model.revision`` (for the logs)."""


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
    """Stages to run, in order: curriculum stages, then post-training ones (``sft``, ``dpo``,
    ``rlvr``) the manifest asks for; ``None``: the whole curriculum and every post-training
    stage the manifest asks for."""
    max_steps_per_stage: PositiveStep | None = None
    fail_at: FailAtSpec | None = None
    error_at: ErrorAtSpec | None = None
    """Test hook: a registered error raised in the engine (see :class:`ErrorAtSpec`)."""
    loss_spike_at: PositiveStep | None = None
    pause_at_step: PositiveStep | None = None
    min_step_seconds: Annotated[float, Field(gt=0, le=60, allow_inf_nan=False)] | None = None
    restart_from: RestartFromSpec | None = None
    rollout_worker: bool | None = None
    """Test hook: ``True`` runs RLVR's rollouts in the separate worker, ``False`` in the
    synchronous loop; ``None``: the engine chooses (``ito.pipeline.train``)."""
    rollout_lookahead: Annotated[int, Field(ge=0, le=64)] | None = None
    """Test hook: steps past the trainer's latest request that the separate rollout worker may
    generate ahead; ``None``: the manifest's ``max_staleness``."""
    layout: LayoutSpec | None = None
    """The planned layout; ``None``: FSDP over every rank (the engine's default)."""
    accelerator: BookedAccelerator | None = None
    """The booked accelerator; ``None`` (the engine run alone, in tests): not checked."""
    initial_weights: InitialWeightsSpec | None = None
    """What the run starts from; ``None``: the seeded random initialisation."""
    recorded_checkpoints: (
        Annotated[list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]], Field(max_length=10_000)]
        | None
    ) = None
    """Digests of the checkpoints the server recorded for the run (not deleted): with those the
    engine's own journal lists, the only checkpoints it resumes from or prunes. ``None`` (the
    engine run alone, in tests): its journal's only."""
    provenance_sha256: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    """The data-preparation report bound to the run: training reads a prepared shard only if
    ``provenance.json`` has this digest and lists the shard's digest. ``None`` (the engine run
    alone, in tests): prepared shards are read as they are."""

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
            weights = self.initial_weights
            if weights is not None:
                path = posixpath.normpath(weights.path)
                if path != weights.path or not path.startswith(root.rstrip("/") + "/"):
                    raise ValueError("initial_weights.path must lie strictly below storage_root")
        return self
