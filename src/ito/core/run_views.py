"""What the API answers about runs (DESIGN §5.7, §7): a run, its events, its log lines, metric
points and checkpoints — the ``data`` of the read routes, as models, so the OpenAPI document
describes them exactly and a reader (client, MCP) can check them. The server answers through
these models, so an answer holds exactly their fields (the document cannot drift from the
answers); a reader ignores fields a newer server adds.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ito.core.stage_plan import StagePlan, StageProgress

__all__ = [
    "CheckpointList",
    "CheckpointView",
    "ExportView",
    "GateList",
    "GateRecord",
    "LogLine",
    "LogPage",
    "MetricPage",
    "MetricPoint",
    "ProvenanceView",
    "RunActionResult",
    "RunCreated",
    "RunDetail",
    "RunEventPage",
    "RunEventView",
    "RunList",
    "RunView",
]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RunView(_View):
    run_id: str
    booking_id: str
    manifest_id: str
    """The manifest's digest."""
    idempotency_key: str
    state: str
    """One of the run states (:class:`ito.core.states.RunState`)."""
    stage: str | None
    """The curriculum stage running now (or last), once one started."""
    cleanup_state: str
    terminal: bool
    confirmation_ref: str
    estimate: dict[str, Any]
    """The cost estimate fixed at creation (cost, ceiling, hours)."""
    stage_plan: StagePlan
    """Exactly the stages the run executes, fixed at creation (rebuilt from the estimate for a
    run created before plans were stored: ``exact`` is then false)."""
    checkpoint_uri: str
    failure_code: str | None
    provenance_sha256: str | None = None
    cost_bound_usd: float | None = None
    """What the run may spend, as a human approved it (raised only by a new approval)."""
    """The data-preparation report bound to the run (``/v1/runs/{id}/provenance``), once the
    worker uploaded it."""
    created_at: str
    updated_at: str
    finished_at: str | None


class RunCreated(_View):
    """A run created behind the five gates, or the one its idempotency key already created."""

    booking_id: str
    run_id: str
    manifest_id: str
    idempotency_key: str
    state: str
    """The run's state now (a replay reads it afresh)."""
    stage: str | None
    replayed: bool
    """True when this idempotency key had already created the run: nothing new was created."""


class RunActionResult(_View):
    """A confirmed cancel, cleanup or restart of a run, or its replay."""

    run_id: str
    booking_id: str
    state: str
    """The run's state now (a replay reads it afresh)."""
    cleanup_state: str
    idempotency_key: str
    replayed: bool
    """True when this idempotency key had already requested the action: nothing new."""


class RunEventView(_View):
    id: int
    """Also the cursor of ``/events?after=``."""
    kind: str
    from_state: str | None
    to_state: str | None
    message: str
    data: dict[str, Any]
    at: str


class RunDetail(RunView):
    progress: list[StageProgress]
    """Each stage of :attr:`stage_plan` with its status and progress inside it."""
    events: list[RunEventView]
    """The run's first events (the rest: ``/events?after=``)."""
    latest_event: RunEventView | None = None
    """The run's newest event: how it ended, or what it waits for."""


class RunList(_View):
    runs: list[RunView]


class RunEventPage(_View):
    events: list[RunEventView]
    next_cursor: int


class LogLine(_View):
    cursor: int
    attempt: int
    level: str
    message: str
    at: str


class LogPage(_View):
    lines: list[LogLine]
    next_cursor: int


class MetricPoint(_View):
    cursor: int
    attempt: int
    stage: str
    step: int
    name: str
    value: float
    superseded: bool
    """Whether this step was reported again later (replayed after a restart): the later
    report is the step's value; series means and charts count each step once."""


class MetricPage(_View):
    points: list[MetricPoint]
    next_cursor: int


class CheckpointView(_View):
    stage: str
    step: int
    path: str
    bytes: int
    seconds: float
    attempt: int
    committed_at: str
    deleted: bool


class ExportView(_View):
    """A stage's final weights as a Hugging Face directory (``config.json``,
    ``model.safetensors``, the tokenizer) that ``from_pretrained`` loads."""

    stage: str
    step: int
    path: str
    bytes: int
    sha256: str
    """Of ``model.safetensors``."""
    seconds: float
    exported_at: str
    deleted: bool
    """Removed by the run's cleanup."""


class CheckpointList(_View):
    checkpoints: list[CheckpointView]
    exports: list[ExportView]


class GateRecord(_View):
    """One eval of a stage's battery as the engine measured it at the stage's end."""

    stage: str
    battery: str
    eval: str
    data: str
    value: float | None
    initial: float | None
    """The untrained model's value of the same eval at step 0."""
    threshold: float | None
    """The bound compared with (a relative one: its ratio times ``initial``)."""
    rule: str | None
    """The gate as the manifest states it."""
    passed: bool
    at: str
    reference: float | None = None
    """The ladder only: the reference run's value (``value``: the run with the custom data)."""


class LadderArmSecondsView(_View):
    reference: float
    with_custom: float


class LadderDecisionView(_View):
    """The ladder decision job's facts and verdict (DESIGN §7.4); its per-eval comparisons are
    the ``ladder`` stage's gate records."""

    proxy_size: str
    margin: float
    stage: str
    """The curriculum stage whose data and battery it compared."""
    reference_data: list[str]
    custom_data: list[str]
    tokens: int
    """Tokens each of the two proxy runs trained on."""
    steps: int
    seconds: LadderArmSecondsView
    passed: bool


class GateList(_View):
    run_id: str
    state: str
    failure_code: str | None = None
    """Why the run failed, when it did (a gate's failure is ``eval_gate_failed``)."""
    gates: list[GateRecord]
    ladder: LadderDecisionView | None = None


class ProvenanceView(_View):
    """The data-preparation report bound to a run (:mod:`ito.core.provenance`)."""

    run_id: str
    sha256: str
    """``sha256:`` of the report's exact bytes, bound to the run."""
    bytes: int
    attempt: int
    """The attempt that uploaded it."""
    created_at: str
    report: dict[str, Any]
