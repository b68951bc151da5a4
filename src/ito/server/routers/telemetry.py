"""Telemetry for the desk and the tenant (JSON), and Prometheus text at ``/metrics`` (desk
credential required: it spans every tenant)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse

from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.server.routers.deps import State, require
from ito.server.services.credentials import AuthContext
from ito.server.services.telemetry import booking_telemetry, prometheus_text, run_telemetry

router = APIRouter()


@router.get("/v1/telemetry")
def telemetry(state: State, booking_id: str | None = None, run_id: str | None = None,
              caller: AuthContext = Depends(require("requester", "desk"))) -> dict[str, Any]:
    if (booking_id is None) == (run_id is None):
        raise ItoError("invalid_arguments", "give exactly one of booking_id or run_id")
    scope = None if caller.role == "desk" else caller.account_id
    with state.db.read() as session:
        if run_id is not None:
            data = run_telemetry(session, scope, run_id)
        else:
            assert booking_id is not None
            data = booking_telemetry(session, scope, booking_id)
    return ok_envelope(data, "telemetry computed from what the runs reported")


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(state: State, caller: AuthContext = Depends(require("desk"))) -> PlainTextResponse:
    with state.db.read() as session:
        text = prometheus_text(session)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
