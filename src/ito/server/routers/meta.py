"""Health, the published manifest schema, who-am-I, the account overview and what the desk
did to the account."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from ito import __version__
from ito.core.desk_views import AccountEventList
from ito.core.envelope import ok_envelope
from ito.core.manifest import manifest_json_schema
from ito.core.meta_views import AccountOverview, Health, Identity
from ito.core.responses import Envelope, Open
from ito.server.routers.deps import Caller, Requester, RequesterOrApprover, State
from ito.server.routers.route import OneHopRoute
from ito.server.services.audit import account_event_dict, list_account_events
from ito.server.services.bookings import booking_dict, list_bookings
from ito.server.services.runs import list_runs, run_dict

router = APIRouter(prefix="/v1", route_class=OneHopRoute)


@router.get("/health", response_model=Envelope[Health])
def health() -> dict[str, Any]:
    return ok_envelope({"status": "ok", "version": __version__}, "the API is up")


@router.get("/schemas/manifest", response_model=Envelope[Open])
def manifest_schema() -> dict[str, Any]:
    """The manifest's JSON Schema (draft 2020-12). Its ``data`` stays an open object on
    purpose: it *is* a schema document, whose shape JSON Schema's own meta-schema defines."""
    return ok_envelope(manifest_json_schema(), "schema ito.training.manifest.v1")


@router.get("/me", response_model=Envelope[Identity])
def me(caller: Caller) -> dict[str, Any]:
    """Who this credential is; the operator's ``account_id`` is ``null`` (it is no tenant)."""
    return ok_envelope(
        {
            "account_id": caller.account_id,
            "principal_id": caller.principal_id,
            "role": caller.role,
            "key_prefix": caller.key_prefix,
            "booking_id": caller.booking_id,
        },
        "the credential is valid",
    )


@router.get("/status", response_model=Envelope[AccountOverview])
def status(caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        bookings = [booking_dict(b) for b in list_bookings(session, caller.account_id)]
        runs = [run_dict(r) for r in list_runs(session, caller.account_id, limit=10)]
    return ok_envelope(
        {"account_id": caller.account_id, "bookings": bookings, "recent_runs": runs},
        f"{len(bookings)} booking(s), {len(runs)} recent run(s)",
    )


@router.get("/account/events", response_model=Envelope[AccountEventList])
def account_events(
    caller: RequesterOrApprover, state: State, limit: int = Query(default=100, ge=1, le=1000)
) -> dict[str, Any]:
    """The desk's actions on this account (keys minted or revoked, bookings recorded or moved,
    telemetry read), newest first; never another account's."""
    with state.db.read() as session:
        events = [
            account_event_dict(e)
            for e in list_account_events(session, caller.account_id, limit=limit)
        ]
    return ok_envelope({"events": events}, f"{len(events)} desk action(s) on this account")
