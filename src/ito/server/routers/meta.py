"""Health, the published manifest schema, who-am-I and the account overview."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ito import __version__
from ito.core.envelope import ok_envelope
from ito.core.manifest import manifest_json_schema
from ito.server.routers.deps import Caller, Requester, State
from ito.server.services.bookings import booking_dict, list_bookings
from ito.server.services.runs import list_runs, run_dict

router = APIRouter(prefix="/v1")


@router.get("/health")
def health() -> dict[str, Any]:
    return ok_envelope({"status": "ok", "version": __version__}, "the API is up")


@router.get("/schemas/manifest")
def manifest_schema() -> dict[str, Any]:
    return ok_envelope(manifest_json_schema(), "schema ito.training.manifest.v1")


@router.get("/me")
def me(caller: Caller) -> dict[str, Any]:
    return ok_envelope({"account_id": caller.account_id, "principal_id": caller.principal_id,
                        "role": caller.role, "key_prefix": caller.key_prefix,
                        "booking_id": caller.booking_id}, "the credential is valid")


@router.get("/status")
def status(caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        bookings = [booking_dict(b) for b in list_bookings(session, caller.account_id)]
        runs = [run_dict(r) for r in list_runs(session, caller.account_id, limit=10)]
    return ok_envelope({"account_id": caller.account_id, "bookings": bookings,
                        "recent_runs": runs},
                       f"{len(bookings)} booking(s), {len(runs)} recent run(s)")
