"""The worker API: an ``ito-worker`` with a booking-bound worker key leases that booking's runs,
heartbeats, reports, finishes, and performs requested cleanups."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.server.routers.deps import State, require
from ito.server.services.credentials import AuthContext
from ito.server.services.leases import (
    LeaseSettings,
    finish_run,
    heartbeat,
    lease_next,
    report,
)
from ito.server.services.lifecycle import cleanup_jobs, mark_cleaned
from ito.server.store.tables import utcnow

router = APIRouter(prefix="/v1/worker")
Worker = Depends(require("worker"))


def _lease_settings(state: Any) -> LeaseSettings:
    settings = state.settings
    return LeaseSettings(settings.lease_ttl_seconds, settings.heartbeat_seconds)


class Attempt(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    attempt: int = Field(ge=1, le=2**31 - 1)


class ReportBody(Attempt):
    events: list[dict[str, Any]] = Field(max_length=5000)


class FinishBody(Attempt):
    status: Literal["succeeded", "failed", "gate_failed", "cancelled"]
    failure_code: str | None = Field(default=None, max_length=64)
    message: str = Field(default="", max_length=2000)


class CleanedBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    bytes_freed: int = Field(ge=0)
    paths: list[str] = Field(default_factory=list, max_length=1000)


@router.post("/lease")
def worker_lease(state: State, caller: AuthContext = Worker) -> dict[str, Any]:
    with state.db.write() as session:
        leased = lease_next(session, caller, _lease_settings(state), utcnow())
    if leased is None:
        return ok_envelope(None, "no run is waiting for this booking")
    return ok_envelope(leased, f"leased run {leased['run_id']} (attempt {leased['attempt']})")


@router.post("/runs/{run_id}/heartbeat")
def worker_heartbeat(run_id: str, body: Attempt, state: State,
                     caller: AuthContext = Worker) -> dict[str, Any]:
    with state.db.write() as session:
        data = heartbeat(session, caller, _lease_settings(state), run_id, body.attempt,
                         utcnow())
    return ok_envelope(data, "lease renewed")


@router.post("/runs/{run_id}/report")
def worker_report(run_id: str, body: ReportBody, state: State,
                  caller: AuthContext = Worker) -> dict[str, Any]:
    try:
        with state.db.write() as session:
            counts = report(session, caller, run_id, body.attempt, body.events)
    except (KeyError, ValueError, TypeError, AttributeError):
        # Events are free-form dicts: one missing or mistyped field refuses the batch (rolled
        # back whole), never a 500.
        raise ItoError("invalid_arguments", "a reported event is malformed") from None
    return ok_envelope(counts, "reported")


@router.post("/runs/{run_id}/finish")
def worker_finish(run_id: str, body: FinishBody, state: State,
                  caller: AuthContext = Worker) -> dict[str, Any]:
    with state.db.write() as session:
        data = finish_run(session, caller, run_id, body.attempt, body.status,
                          body.failure_code, body.message)
    return ok_envelope(data, f"run {run_id} is {data['state']}")


@router.get("/cleanups")
def worker_cleanups(state: State, caller: AuthContext = Worker) -> dict[str, Any]:
    with state.db.read() as session:
        jobs = cleanup_jobs(session, caller)
    return ok_envelope({"cleanups": jobs}, f"{len(jobs)} cleanup(s) requested")


@router.post("/runs/{run_id}/cleaned")
def worker_cleaned(run_id: str, body: CleanedBody, state: State,
                   caller: AuthContext = Worker) -> dict[str, Any]:
    with state.db.write() as session:
        data = mark_cleaned(session, caller, run_id, body.bytes_freed, body.paths)
    return ok_envelope(data, "cleanup recorded")
