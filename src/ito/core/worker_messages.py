"""The worker API's messages (DESIGN §7.1): the lease the server hands a worker, the heartbeat
and its answer, the report batch, the finish, and the cleanups — one model each, shared by the
server's routes (which validate what a worker sends: unknown fields refused, every string,
list and number bounded) and the worker (which validates what the server answers before it
acts on it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ito.core.pipeline_events import ReportedEvent

__all__ = [
    "REPORT_MAX_EVENTS",
    "AttemptBody",
    "CleanedAnswer",
    "CleanedBody",
    "CleanupJob",
    "CleanupJobs",
    "FinishAnswer",
    "FinishBody",
    "HeartbeatAnswer",
    "Lease",
    "LeaseBooking",
    "ProvenanceBody",
    "ProvenanceBound",
    "ReportBody",
    "ReportCounts",
    "RestartPoint",
]

REPORT_MAX_EVENTS = 5000
"""Events in one report request (the worker sends at most 2000)."""
_ATTEMPT_MAX = 2**31 - 1

Attempt = Annotated[int, Field(ge=1, le=_ATTEMPT_MAX)]
RunId = Annotated[str, Field(min_length=1, max_length=64)]
Uri = Annotated[str, Field(min_length=1, max_length=2048)]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Inbound(BaseModel):
    """What a worker sends: exactly these fields, exactly these types."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _Answer(BaseModel):
    """What the server answers: checked by the worker, tolerant of fields a newer server
    adds."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# ---- lease -------------------------------------------------------------------------------------


class RestartPoint(_Answer):
    """A human-approved restart: resume from this checkpoint, skipping a data window."""

    step: Annotated[int, Field(ge=0, le=_ATTEMPT_MAX)]
    skip_steps: Annotated[int, Field(ge=0, le=_ATTEMPT_MAX)]


class LeaseBooking(_Answer):
    booking_id: Annotated[str, Field(min_length=1, max_length=64)]
    gpu: Annotated[str, Field(min_length=1, max_length=20)]
    nodes: Annotated[int, Field(ge=1, le=100_000)]
    gpus_per_node: Annotated[int, Field(ge=1, le=1024)]
    node_inventory: list[dict[str, Any]]
    storage_uri: Uri | None


class Lease(_Answer):
    """One attempt of a run, now held by the worker that leased it."""

    run_id: RunId
    attempt: Attempt
    resuming: bool
    """The run was ``recovering``: this attempt resumes from the last committed checkpoint."""
    restart_from: RestartPoint | None
    manifest_b64: Annotated[str, Field(min_length=1, max_length=4 << 20)]
    """The manifest's exact bytes, base64."""
    manifest_id: Annotated[str, Field(min_length=1, max_length=128)]
    checkpoint_uri: Uri
    booking: LeaseBooking
    lease_ttl_s: Seconds
    heartbeat_s: Seconds
    parallelism: dict[str, Any] | None = None
    """The run's accepted parallelism plan, as gate 5 stored it with the run's estimate
    (:meth:`ito.core.run_plan.RunPlan.to_dict`); ``None`` for runs created before it was."""
    initial_weights: dict[str, Any] | None = None
    """The run's resolved initial weights (:class:`ito.core.revisions.InitialWeights`, as
    plan/create recorded them in its estimate); ``None``: random initialisation."""
    provenance_sha256: Annotated[str, Field(max_length=80)] | None = None
    """The data-preparation report already bound to the run (an earlier attempt uploaded it):
    this attempt's preparation must reproduce it."""
    recorded_checkpoints: Annotated[
        list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]], Field(max_length=10_000)
    ] = []
    """Digests of the run's checkpoints the server recorded (still on disk): the only ones this
    attempt may resume from."""


# ---- heartbeat -----------------------------------------------------------------------------


class AttemptBody(_Inbound):
    """The heartbeat's body: the attempt this worker holds."""

    attempt: Attempt


class HeartbeatAnswer(_Answer):
    run_id: RunId
    state: Annotated[str, Field(max_length=32)]
    stop: Literal["cancel", "budget", "booking", "cost_bound"] | None
    """Set when the run must stop: cancelled, the next interval would cross the budget ceiling,
    the booking can no longer be used, or the next interval would cross the cost bound a human
    approved (the run then waits for a new one: ``cost_bound_reached``)."""
    stop_code: Annotated[str, Field(max_length=64)] | None
    """The error code of a budget or booking stop."""
    lease_expires_at: Annotated[str, Field(max_length=64)]
    cost_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)]


# ---- provenance ----------------------------------------------------------------------------


class ProvenanceBody(_Inbound):
    """The data-preparation report: the exact bytes of ``provenance.json``, base64 (so the
    digest the server binds is the digest of the file training checks its shards against)."""

    attempt: Attempt
    report_b64: Annotated[str, Field(min_length=1, max_length=3 * 1024 * 1024)]


class ProvenanceBound(_Answer):
    run_id: RunId
    sha256: Annotated[str, Field(max_length=80)]
    """``sha256:`` of the report's bytes, now bound to the run."""
    bytes: Annotated[int, Field(ge=0)]
    replayed: bool
    """True when this digest was already bound (a repeated upload): nothing new was stored."""


# ---- report --------------------------------------------------------------------------------


class ReportBody(_Inbound):
    attempt: Attempt
    events: Annotated[list[ReportedEvent], Field(max_length=REPORT_MAX_EVENTS)]


class ReportCounts(_Answer):
    logs: Annotated[int, Field(ge=0)]
    metrics: Annotated[int, Field(ge=0)]
    checkpoints: Annotated[int, Field(ge=0)]
    events: Annotated[int, Field(ge=0)]


# ---- finish --------------------------------------------------------------------------------


class FinishBody(_Inbound):
    attempt: Attempt
    status: Literal["succeeded", "failed", "gate_failed", "cancelled", "awaiting_approval"]
    """``awaiting_approval``: only with ``failure_code`` ``cost_bound_reached`` — the attempt
    stopped at the approved cost bound, its checkpoint committed."""
    failure_code: Annotated[str, Field(max_length=64)] | None = None
    message: Annotated[str, Field(max_length=2000)] = ""


class FinishAnswer(_Answer):
    run_id: RunId
    state: Annotated[str, Field(max_length=32)]


# ---- cleanups ------------------------------------------------------------------------------


class CleanupJob(_Answer):
    run_id: RunId
    checkpoint_uri: Uri
    storage_uri: Uri | None
    """The booking's storage root: the worker re-checks that what it deletes lies inside."""


class CleanupJobs(_Answer):
    cleanups: list[CleanupJob]


class CleanedBody(_Inbound):
    bytes_freed: Annotated[int, Field(ge=0, le=2**63 - 1)]
    paths: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=1000)] = Field(
        default_factory=list
    )


class CleanedAnswer(_Answer):
    run_id: RunId
    cleanup_state: Annotated[str, Field(max_length=32)]
    bytes_freed: Annotated[int, Field(ge=0)]
