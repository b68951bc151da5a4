"""The pipeline's events: one model per line type of the events file (DESIGN §7), shared by
the engine that writes them, the supervisor that tails them, the worker API that carries them
and the server that ingests them.

Every model forbids unknown fields and bounds every string, list and number, so a line that is
not exactly one of these is refused where it enters (the supervisor drops it with a log line;
the server answers a report carrying it ``invalid_arguments`` 422). Numbers are finite: the
engine writes a diverged loss as ``null``, never ``NaN``.

Types (the ``type`` field is the discriminator; ``ts`` is unix seconds, absent on events the
worker itself makes):

- ``log``: ``level``, ``message``
- ``stage``: ``stage``, ``status`` (``started`` | ``completed``)
- ``metric``: ``stage``, ``step``, ``values`` (name → number or ``null``)
- ``checkpoint``: ``stage``, ``step``, ``path``, ``bytes``, ``seconds``, ``blocking_seconds``,
  ``sha256``
- ``export``: ``stage``, ``step``, ``path``, ``bytes``, ``sha256``, ``seconds`` — the stage's
  final weights written as a Hugging Face directory
- ``gate``: ``stage``, ``battery``, ``results``, ``passed`` (and ``ladder``, the decision job's
  facts, on the ladder's gate)
- ``restart``: ``restarts`` — torchrun restarted the ranks (an interruption)
- ``spike``: ``stage``, ``step``, ``loss``, ``z``, ``checkpoint_step``, ``skip_steps``
- ``mesh``: ``dims`` (name → degree, outermost first), ``device``, ``micro_batch``,
  ``grad_accum``, ``pp_microbatches``, ``activation_checkpointing``, ``param_dtype``,
  ``reduce_dtype``, ``planned`` — the device mesh and layout the engine built, once per
  attempt
- ``done``: ``status`` — the engine's last word, read by the supervisor and never reported
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

__all__ = [
    "LOG_MESSAGE_MAX_CHARS",
    "CheckpointEvent",
    "DoneEvent",
    "ExportEvent",
    "GateEvent",
    "GateResult",
    "LadderFacts",
    "LogEvent",
    "MeshEvent",
    "MetricEvent",
    "PipelineEvent",
    "ReportedEvent",
    "RestartEvent",
    "SpikeEvent",
    "StageEvent",
    "parse_event_line",
    "pipeline_event",
    "reported_event",
]

LOG_MESSAGE_MAX_CHARS = 16_000
"""The engine cuts a log line (a traceback) to this many characters before writing it."""
_REPORTED_TEXT_MAX = 6 * LOG_MESSAGE_MAX_CHARS
"""The worker escapes control characters as visible escapes (up to six characters each) before
it reports: the bound on a reported message allows for that."""
_STEP_MAX = 2**31 - 1

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Step = Annotated[int, Field(ge=0, le=_STEP_MAX)]
StageLabel = Annotated[str, Field(min_length=1, max_length=30)]
"""A curriculum stage, or ``data_prep``."""
MetricName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_./-]{0,63}$")]
Timestamp = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    ts: Timestamp | None = None
    """Unix seconds when the engine wrote it; ``None`` on events the worker makes."""


class LogEvent(_Event):
    type: Literal["log"] = "log"
    level: Literal["debug", "info", "warning", "error"] = "info"
    message: Annotated[str, Field(max_length=_REPORTED_TEXT_MAX)] = ""


class StageEvent(_Event):
    type: Literal["stage"] = "stage"
    stage: StageLabel
    status: Literal["started", "completed"]
    steps: Annotated[int, Field(ge=1)] | None = None
    """With ``started``: the optimizer steps the stage will take."""
    steps_taken: Annotated[int, Field(ge=1)] | None = None
    """With ``completed``, only for a stage that ended early (RLVR whose policy had nothing
    left to learn from its prompts): the steps it took."""
    skipped_steps: Annotated[int, Field(ge=0)] | None = None
    """With ``steps_taken``: the steps of the stage that had no informative group (no
    optimizer step)."""


class MetricEvent(_Event):
    type: Literal["metric"] = "metric"
    stage: StageLabel
    step: Step
    values: Annotated[dict[MetricName, FiniteFloat | None], Field(max_length=64)]
    """``loss``, ``lr``, ``grad_norm``, ``tokens_per_s``, ``mfu``, ``step_seconds`` (and
    ``replicas`` with several replica groups; post-training's ``dpo_margin``, ``dpo_accuracy``,
    ``reward_mean``, ``kept_group_fraction``, ``generation_rounds``, ``response_length``,
    ``truncated_fraction``); ``eval/<eval>/<data>`` at a gate (and at step 0, the untrained
    model's); ``None`` for a figure that is not finite or not known (MFU without
    a known peak)."""


class CheckpointRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: StageLabel
    step: Step


class CheckpointEvent(_Event):
    type: Literal["checkpoint"] = "checkpoint"
    stage: StageLabel
    step: Step
    path: Annotated[str, Field(min_length=1, max_length=2048)]
    bytes: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    """Wall time from the save's start to its commit (training goes on meanwhile)."""
    blocking_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    """The part of it the training loop waited for."""
    productive_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    """Productive training time that this checkpoint preserves, when the engine knows it."""
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    """The checkpoint's digest (:func:`ito.core.revisions.checkpoint_digest`): what a later
    run starting from it (``run:<id>@<step>``) is checked against."""
    pruned: Annotated[list[CheckpointRef], Field(max_length=1000)] | None = None
    """Older checkpoints the keep-last policy deleted once this one was committed."""


class ExportEvent(_Event):
    type: Literal["export"] = "export"
    stage: StageLabel
    step: Step
    path: Annotated[str, Field(min_length=1, max_length=2048)]
    bytes: Annotated[int, Field(ge=0, le=2**63 - 1)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    """Of the weights file (``model.safetensors``)."""
    seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)]


class GateResult(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    eval: Annotated[str, Field(min_length=1, max_length=64)]
    data: Annotated[str, Field(min_length=1, max_length=128)]
    value: FiniteFloat | None
    threshold: FiniteFloat | None
    """The bound compared with: absolute, or the ratio times ``initial``."""
    passed: bool
    initial: FiniteFloat | None = None
    """The untrained model's value of the same eval, measured at step 0."""
    rule: Annotated[str, Field(max_length=300)] | None = None
    """The gate as the manifest states it (``heldout_loss(web) ≤ 0.6 × step 0``)."""
    reference: FiniteFloat | None = None
    """The ladder only: the reference run's value (``value`` is the run with the custom data)."""


DataIdList = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=128)]], Field(max_length=256)
]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class LadderArmSeconds(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    reference: Seconds
    with_custom: Seconds


class LadderFacts(BaseModel):
    """What the ladder decision job ran (DESIGN §7.4): each of its two proxy runs trained
    ``steps`` steps, ``tokens`` tokens."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    proxy_size: Annotated[str, Field(min_length=1, max_length=16)]
    margin: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    stage: StageLabel
    reference_data: DataIdList
    custom_data: DataIdList
    tokens: Annotated[int, Field(ge=0, le=2**63 - 1)]
    steps: Step
    seconds: LadderArmSeconds


class GateEvent(_Event):
    type: Literal["gate"] = "gate"
    stage: StageLabel
    battery: Annotated[str, Field(min_length=1, max_length=128)]
    results: Annotated[list[GateResult], Field(max_length=256)]
    passed: bool
    ladder: LadderFacts | None = None
    """Stage ``ladder`` only: the decision job's facts."""


class RestartEvent(_Event):
    type: Literal["restart"] = "restart"
    restarts: Annotated[int, Field(ge=1, le=1_000_000)]


class SpikeEvent(_Event):
    type: Literal["spike"] = "spike"
    stage: StageLabel
    step: Step
    loss: FiniteFloat | None
    z: FiniteFloat | None
    checkpoint_step: Step
    """The newest committed checkpoint from before the spike: the proposed restart point."""
    skip_steps: Step
    """Batches of data to skip after it (the window that produced the spike)."""


MeshDim = Annotated[str, Field(pattern=r"^[a-z][a-z_]{0,31}$")]


class MeshEvent(_Event):
    type: Literal["mesh"] = "mesh"
    dims: Annotated[dict[MeshDim, Annotated[int, Field(ge=1, le=1 << 20)]], Field(max_length=8)]
    """The device mesh built: dimension → degree, outermost first."""
    device: Annotated[str, Field(min_length=1, max_length=16)]
    micro_batch: Annotated[int, Field(ge=1, le=1 << 16)]
    grad_accum: Annotated[int, Field(ge=1, le=1 << 16)]
    pp_microbatches: Annotated[int, Field(ge=1, le=1 << 16)] = 1
    activation_checkpointing: Literal["none", "selective", "full"]
    param_dtype: Literal["float32", "bfloat16"]
    reduce_dtype: Literal["float32", "bfloat16"]
    planned: bool
    """Whether the spec planned the layout (``False``: the engine's default)."""


class DoneEvent(_Event):
    type: Literal["done"] = "done"
    status: Literal["succeeded", "gate_failed", "spike", "stopped", "failed"]
    """``stopped``: the worker asked for a stop, the engine committed a checkpoint at ``step``
    and exited; ``failed``: a refusal with a stable ``code`` and a ``reason``."""
    stage: StageLabel | None = None
    step: Step | None = None
    code: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")] | None = None
    reason: Annotated[str, Field(max_length=2000)] | None = None


ReportedEvent = Annotated[
    LogEvent
    | StageEvent
    | MetricEvent
    | CheckpointEvent
    | ExportEvent
    | GateEvent
    | RestartEvent
    | SpikeEvent
    | MeshEvent,
    Field(discriminator="type"),
]
"""What the worker reports to the server: every event but ``done``."""

PipelineEvent = Annotated[
    LogEvent
    | StageEvent
    | MetricEvent
    | CheckpointEvent
    | ExportEvent
    | GateEvent
    | RestartEvent
    | SpikeEvent
    | MeshEvent
    | DoneEvent,
    Field(discriminator="type"),
]
"""A line of the events file."""

_PIPELINE: TypeAdapter[PipelineEvent] = TypeAdapter(PipelineEvent)
_REPORTED: TypeAdapter[ReportedEvent] = TypeAdapter(ReportedEvent)


def pipeline_event(value: Any) -> PipelineEvent:
    """``value`` (a decoded object) as its event model; raises ``ValueError`` if it is none."""
    try:
        return _PIPELINE.validate_python(value)
    except ValidationError as exc:
        raise ValueError(_where(exc)) from None


def reported_event(value: Any) -> ReportedEvent:
    """``value`` as a reportable event model; raises ``ValueError`` if it is none."""
    try:
        return _REPORTED.validate_python(value)
    except ValidationError as exc:
        raise ValueError(_where(exc)) from None


def parse_event_line(line: bytes | str) -> PipelineEvent:
    """One line of the events file as its model; raises ``ValueError`` (naming where, never
    echoing the content) if it is not JSON or not exactly one event type."""
    try:
        return _PIPELINE.validate_json(line)
    except ValidationError as exc:
        raise ValueError(_where(exc)) from None


def _where(exc: ValidationError) -> str:
    """The fields at fault, without the values (a line may carry anything)."""
    places = sorted({".".join(str(p) for p in e["loc"]) or "$" for e in exc.errors()})
    return "malformed event at " + ", ".join(places[:5])
