"""Telemetry for the desk and the tenant (JSON), and Prometheus metrics at ``/metrics`` (desk
credential required: it spans every tenant; written by :mod:`ito.server.services.prometheus`).

A tenant reads its own runs and bookings. The desk reads any, and each such read of a tenant's
figures is recorded in the audit trail (and so shown to that tenant). ``/metrics`` scrapes are
not: a scraper polls every few seconds and would drown the trail; the key that may scrape is
an operator key, and its creation is audited.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from sqlalchemy.orm import Session

from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.core.responses import Envelope
from ito.core.telemetry_views import BookingTelemetry, RunTelemetry
from ito.server.routers.deps import Desk, RequesterOrDesk, State
from ito.server.routers.route import OneHopRoute
from ito.server.services.audit import Actor, audited
from ito.server.services.credentials import OperatorContext
from ito.server.services.prometheus import CONTENT_TYPE, exposition
from ito.server.services.telemetry import booking_telemetry, run_telemetry

router = APIRouter(route_class=OneHopRoute)


@router.get("/v1/telemetry", response_model=Envelope[RunTelemetry | BookingTelemetry])
def telemetry(
    state: State, caller: RequesterOrDesk, booking_id: str | None = None, run_id: str | None = None
) -> dict[str, Any]:
    if (booking_id is None) == (run_id is None):
        raise ItoError("invalid_arguments", "give exactly one of booking_id or run_id")

    def compute(session: Session, scope: str | None) -> dict[str, Any]:
        if run_id is not None:
            return run_telemetry(session, scope, run_id)
        assert booking_id is not None
        return booking_telemetry(session, scope, booking_id)

    if isinstance(caller, OperatorContext):
        kind, target = ("run", run_id) if run_id is not None else ("booking", booking_id)
        with audited(
            state.db, Actor.of(caller), "telemetry.read", target_kind=kind, target_id=target
        ) as (session, _):
            data = compute(session, None)
    else:
        with state.db.read() as session:
            data = compute(session, caller.account_id)
    return ok_envelope(data, "telemetry computed from what the runs reported")


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(state: State, caller: Desk) -> PlainTextResponse:
    with state.db.read() as session:
        body = exposition(session)
    return PlainTextResponse(body, media_type=CONTENT_TYPE)
