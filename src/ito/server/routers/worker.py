"""The worker API: an ``ito-worker`` with a booking-bound worker key leases that booking's runs,
heartbeats, reports, finishes, and performs requested cleanups."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from fastapi import APIRouter, Depends

from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.core.responses import Envelope
from ito.core.worker_messages import (
    AttemptBody,
    CleanedAnswer,
    CleanedBody,
    CleanupJobs,
    FinishAnswer,
    FinishBody,
    HeartbeatAnswer,
    Lease,
    ProvenanceBody,
    ProvenanceBound,
    ReportBody,
    ReportCounts,
)
from ito.server.routers.deps import State, require
from ito.server.routers.route import OneHopRoute
from ito.server.services.credentials import AuthContext
from ito.server.services.leases import (
    LeaseSettings,
    finish_run,
    heartbeat,
    lease_next,
    report,
)
from ito.server.services.lifecycle import cleanup_jobs, mark_cleaned
from ito.server.services.provenance import bind_provenance
from ito.server.store.tables import utcnow

router = APIRouter(prefix="/v1/worker", route_class=OneHopRoute)
Worker = Depends(require("worker"))


def _lease_settings(state: Any) -> LeaseSettings:
    settings = state.settings
    return LeaseSettings(settings.lease_ttl_seconds, settings.heartbeat_seconds)


@router.post("/lease", response_model=Envelope[Lease | None])
def worker_lease(state: State, caller: AuthContext = Worker) -> dict[str, Any]:
    with state.db.write() as session:
        leased = lease_next(session, caller, _lease_settings(state), utcnow())
    if leased is None:
        return ok_envelope(None, "no run is waiting for this booking")
    return ok_envelope(leased, f"leased run {leased['run_id']} (attempt {leased['attempt']})")


@router.post("/runs/{run_id}/heartbeat", response_model=Envelope[HeartbeatAnswer])
def worker_heartbeat(
    run_id: str, body: AttemptBody, state: State, caller: AuthContext = Worker
) -> dict[str, Any]:
    with state.db.write() as session:
        data = heartbeat(session, caller, _lease_settings(state), run_id, body.attempt, utcnow())
    return ok_envelope(data, "lease renewed")


@router.post("/runs/{run_id}/report", response_model=Envelope[ReportCounts])
def worker_report(
    run_id: str, body: ReportBody, state: State, caller: AuthContext = Worker
) -> dict[str, Any]:
    # The body was validated against the event models on the way in: a malformed event
    # refuses the whole batch with ``invalid_arguments`` (422) before anything is written.
    with state.db.write() as session:
        counts = report(session, caller, run_id, body.attempt, body.events, now=utcnow())
    return ok_envelope(counts, "reported")


@router.post("/runs/{run_id}/provenance", response_model=Envelope[ProvenanceBound])
def worker_provenance(
    run_id: str, body: ProvenanceBody, state: State, caller: AuthContext = Worker
) -> dict[str, Any]:
    try:
        raw = base64.b64decode(body.report_b64, validate=True)
    except binascii.Error:
        raise ItoError("invalid_arguments", "report_b64 is not base64") from None
    with state.db.write() as session:
        data = bind_provenance(session, caller, run_id, body.attempt, raw)
    return ok_envelope(data, f"provenance {data['sha256']} bound to run {run_id}")


@router.post("/runs/{run_id}/finish", response_model=Envelope[FinishAnswer])
def worker_finish(
    run_id: str, body: FinishBody, state: State, caller: AuthContext = Worker
) -> dict[str, Any]:
    with state.db.write() as session:
        data = finish_run(
            session,
            caller,
            run_id,
            body.attempt,
            body.status,
            body.failure_code,
            body.message,
            now=utcnow(),
        )
    return ok_envelope(data, f"run {run_id} is {data['state']}")


@router.get("/cleanups", response_model=Envelope[CleanupJobs])
def worker_cleanups(state: State, caller: AuthContext = Worker) -> dict[str, Any]:
    with state.db.read() as session:
        jobs = cleanup_jobs(session, caller)
    return ok_envelope({"cleanups": jobs}, f"{len(jobs)} cleanup(s) requested")


@router.post("/runs/{run_id}/cleaned", response_model=Envelope[CleanedAnswer])
def worker_cleaned(
    run_id: str, body: CleanedBody, state: State, caller: AuthContext = Worker
) -> dict[str, Any]:
    with state.db.write() as session:
        data = mark_cleaned(session, caller, run_id, body.bytes_freed, body.paths)
    return ok_envelope(data, "cleanup recorded")
