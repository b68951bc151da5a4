"""Run creation behind the five gates, and tenant-scoped run reads."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from ito.core.api_requests import RunActionBody, RunCreateBody
from ito.core.envelope import ok_envelope
from ito.core.responses import Envelope
from ito.core.run_views import (
    CheckpointList,
    GateList,
    LogPage,
    MetricPage,
    ProvenanceView,
    RunActionResult,
    RunCreated,
    RunDetail,
    RunEventPage,
    RunList,
)
from ito.server.routers.deps import Requester, State, decode_manifest_b64
from ito.server.routers.route import OneHopRoute
from ito.server.services.gates import gates_of
from ito.server.services.lifecycle import (
    apply_run_action,
    checkpoint_dict,
    list_checkpoints,
    list_exports,
    list_logs,
    list_metrics,
)
from ito.server.services.provenance import provenance_of
from ito.server.services.runs import (
    CreateRunRequest,
    create_run,
    event_dict,
    list_events,
    list_runs,
    run_dict,
    run_status,
)

router = APIRouter(prefix="/v1/runs", route_class=OneHopRoute)
CURSOR_MAX = 2**63 - 1
"""Cursors are row ids (64-bit); a larger one is refused, not passed to the store."""


@router.post("", response_model=Envelope[RunCreated])
def runs_create(body: RunCreateBody, caller: Requester, state: State) -> dict[str, Any]:
    result = create_run(
        state.db,
        caller,
        state.pepper,
        CreateRunRequest(
            booking_id=body.booking_id,
            manifest_digest=body.manifest_id,
            confirmation_ref=body.confirmation_ref,
            idempotency_key=body.idempotency_key,
            manifest_raw=decode_manifest_b64(body.manifest_b64)
            if body.manifest_b64 is not None
            else None,
        ),
    )
    data = result.data | {"replayed": result.replayed}
    if result.replayed:
        notice = "replay: this idempotency key already created this run; nothing new was created"
    else:
        notice = "run created and queued; the confirmation was consumed"
    return ok_envelope(data, notice)


@router.get("", response_model=Envelope[RunList])
def runs_list(
    caller: Requester,
    state: State,
    idempotency_key: str | None = Query(default=None, max_length=255),
    booking_id: str | None = None,
    limit: int = Query(default=50, ge=1, le=500),
) -> dict[str, Any]:
    with state.db.read() as session:
        runs = [
            run_dict(r)
            for r in list_runs(
                session,
                caller.account_id,
                idempotency_key=idempotency_key,
                booking_id=booking_id,
                limit=limit,
            )
        ]
    return ok_envelope({"runs": runs}, f"{len(runs)} run(s)")


@router.get("/{run_id}", response_model=Envelope[RunDetail])
def runs_show(run_id: str, caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read_rows() as connection:
        data = run_status(connection, caller.account_id, run_id)
    return ok_envelope(data, f"run {run_id} is {data['state']}")


@router.get("/{run_id}/events", response_model=Envelope[RunEventPage])
def runs_events(
    run_id: str,
    caller: Requester,
    state: State,
    after: int = Query(default=0, ge=0, le=CURSOR_MAX),
    limit: int = Query(default=200, ge=1, le=1000),
) -> dict[str, Any]:
    with state.db.read() as session:
        events = [
            event_dict(e)
            for e in list_events(session, caller.account_id, run_id, after=after, limit=limit)
        ]
    cursor = events[-1]["id"] if events else after
    return ok_envelope({"events": events, "next_cursor": cursor}, f"{len(events)} event(s)")


def _action(
    run_id: str, action: str, body: RunActionBody, caller: Requester, state: State
) -> dict[str, Any]:
    data, replayed = apply_run_action(
        state.db,
        caller,
        state.pepper,
        run_id=run_id,
        action=action,
        confirmation_ref=body.confirmation_ref,
        idempotency_key=body.idempotency_key,
    )
    verb = {
        "run.cancel": "cancel",
        "run.cleanup": "cleanup",
        "run.restart_from_checkpoint": "restart",
        "run.raise_cost_bound": "new cost bound",
    }[action]
    if replayed:
        notice = f"replay: this idempotency key already requested the {verb}; nothing new"
    else:
        notice = f"{verb} confirmed and applied; the confirmation was consumed"
    return ok_envelope(data | {"replayed": replayed}, notice)


@router.post("/{run_id}/cancel", response_model=Envelope[RunActionResult])
def runs_cancel(
    run_id: str, body: RunActionBody, caller: Requester, state: State
) -> dict[str, Any]:
    return _action(run_id, "run.cancel", body, caller, state)


@router.post("/{run_id}/cleanup", response_model=Envelope[RunActionResult])
def runs_cleanup(
    run_id: str, body: RunActionBody, caller: Requester, state: State
) -> dict[str, Any]:
    return _action(run_id, "run.cleanup", body, caller, state)


@router.post("/{run_id}/restart", response_model=Envelope[RunActionResult])
def runs_restart(
    run_id: str, body: RunActionBody, caller: Requester, state: State
) -> dict[str, Any]:
    return _action(run_id, "run.restart_from_checkpoint", body, caller, state)


@router.post("/{run_id}/raise-bound", response_model=Envelope[RunActionResult])
def runs_raise_bound(
    run_id: str, body: RunActionBody, caller: Requester, state: State
) -> dict[str, Any]:
    return _action(run_id, "run.raise_cost_bound", body, caller, state)


@router.get("/{run_id}/logs", response_model=Envelope[LogPage])
def runs_logs(
    run_id: str,
    caller: Requester,
    state: State,
    since: int = Query(default=0, ge=0, le=CURSOR_MAX),
    limit: int = Query(default=500, ge=1, le=5000),
) -> dict[str, Any]:
    with state.db.lookup() as connection:  # one statement
        lines, cursor = list_logs(connection, caller.account_id, run_id, since=since, limit=limit)
    return ok_envelope({"lines": lines, "next_cursor": cursor}, f"{len(lines)} line(s)")


@router.get("/{run_id}/metrics", response_model=Envelope[MetricPage])
def runs_metrics(
    run_id: str,
    caller: Requester,
    state: State,
    name: str | None = Query(default=None, max_length=64),
    since: int = Query(default=0, ge=0, le=CURSOR_MAX),
    limit: int = Query(default=5000, ge=1, le=50000),
) -> dict[str, Any]:
    with state.db.lookup() as connection:  # one statement
        points, cursor = list_metrics(
            connection, caller.account_id, run_id, name=name, since=since, limit=limit
        )
    return ok_envelope({"points": points, "next_cursor": cursor}, f"{len(points)} point(s)")


@router.get("/{run_id}/provenance", response_model=Envelope[ProvenanceView])
def runs_provenance(run_id: str, caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        data = provenance_of(session, caller.account_id, run_id)
    return ok_envelope(data, f"data-preparation report {data['sha256']}")


@router.get("/{run_id}/gates", response_model=Envelope[GateList])
def runs_gates(run_id: str, caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        data = gates_of(session, caller.account_id, run_id)
    failed = sum(not g["passed"] for g in data["gates"])
    notice = f"{len(data['gates'])} gate record(s), {failed} failed"
    if data["state"] in ("failed", "cancelled") and not failed:
        # No gate failed, yet the run did not succeed: say so, with its code.
        notice += f"; the run {data['state']} outside any gate ({data['failure_code']})"
    return ok_envelope(data, notice)


@router.get("/{run_id}/checkpoints", response_model=Envelope[CheckpointList])
def runs_checkpoints(run_id: str, caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        rows = [checkpoint_dict(r) for r in list_checkpoints(session, caller.account_id, run_id)]
        exports = list_exports(session, caller.account_id, run_id)
    return ok_envelope(
        {"checkpoints": rows, "exports": exports},
        f"{len(rows)} checkpoint(s), {len(exports)} export(s)",
    )
