"""The desk-scoped API: the operator creates accounts, tenants' keys and bookings, moves
bookings' states, and reads its audit trail. This runtime never books, releases or pays for
capacity itself; it records what the desk says.

Only an operator credential passes (:data:`~ito.server.routers.deps.Desk`); every action is
recorded in the audit trail, refused ones included. Operator keys are not minted here: only
``ito-server key create --role desk`` on the database's host mints one, so no credential can
mint another operator.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ito.core.booking_views import BookingDetail
from ito.core.desk_views import AccountCreated, AuditLog, KeyCreated, KeyRevoked
from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.core.responses import Envelope
from ito.server.routers.deps import Desk, State
from ito.server.routers.route import OneHopRoute
from ito.server.services.accounts import create_account
from ito.server.services.audit import Actor, audit_dict, audited, list_audit
from ito.server.services.bookings import (
    NewBooking,
    booking_dict,
    create_booking,
    move_booking,
)
from ito.server.services.credentials import OPERATOR_ROLE, create_key, revoke_key

router = APIRouter(prefix="/v1/desk", route_class=OneHopRoute)


class _Body(BaseModel):
    # Strict: "nodes": "2" is refused, not coerced (times stay ISO 8601 strings).
    model_config = ConfigDict(extra="forbid", strict=True)


class AccountBody(_Body):
    name: str = Field(min_length=1, max_length=200)


class KeyBody(_Body):
    account_id: str | None = Field(default=None, min_length=1, max_length=64)
    """The tenant the key is for (required: every key minted here is a tenant's)."""
    role: str = Field(min_length=1, max_length=20)
    """A tenant's role (requester, approver, worker); anything else is refused and audited."""
    name: str | None = Field(default=None, max_length=200)
    booking_id: str | None = Field(default=None, max_length=64)


class BookingBody(_Body):
    account_id: str = Field(min_length=1, max_length=64)
    gpu: str
    nodes: int = Field(ge=1, le=4096)
    gpus_per_node: int = Field(ge=1, le=64)
    region: str = Field(min_length=1, max_length=64)
    fabric: str
    start: datetime = Field(strict=False)
    end: datetime = Field(strict=False)
    rate_usd_per_gpu_hour: float
    storage_uri: str | None = Field(default=None, max_length=2048)
    storage_quota_gb: float = 100.0
    state: Literal["pending", "completed"] = "pending"
    gpu_memory_gb: int | None = Field(default=None, ge=1, le=100_000)


class BookingStateBody(_Body):
    state: Literal["completed", "expired", "revoked", "released"]


@router.post("/accounts", response_model=Envelope[AccountCreated])
def desk_account_create(body: AccountBody, caller: Desk, state: State) -> dict[str, Any]:
    with audited(
        state.db,
        Actor.of(caller),
        "account.create",
        target_kind="account",
        details={"name": body.name},
    ) as (session, note):
        account = create_account(session, body.name)
        note.account_id = note.target_id = account.id
        data = {"account_id": account.id, "name": account.name}
    return ok_envelope(data, "account created")


@router.post("/keys", response_model=Envelope[KeyCreated])
def desk_key_create(body: KeyBody, caller: Desk, state: State) -> dict[str, Any]:
    with audited(
        state.db,
        Actor.of(caller),
        "key.create",
        account_id=body.account_id,
        target_kind="key",
        details={"role": body.role, "name": body.name, "booking_id": body.booking_id},
    ) as (session, note):
        if body.role == OPERATOR_ROLE:
            raise ItoError(
                "forbidden_scope",
                "operator keys are not minted through the API; "
                "the operator runs 'ito-server key create --role desk' on the "
                "server's host",
                role=body.role,
            )
        if body.account_id is None:
            raise ItoError("invalid_arguments", "a tenant key needs account_id")
        minted = create_key(
            session,
            state.pepper,
            account_id=body.account_id,
            role=body.role,
            name=body.name,
            booking_id=body.booking_id,
        )
        note.target_id = minted.key_id
        note.details["key_prefix"] = minted.prefix
    return ok_envelope(
        {
            "key_id": minted.key_id,
            "principal_id": minted.principal_id,
            "key_prefix": minted.prefix,
            "api_key": minted.api_key,
        },
        "key created; the api_key is shown once and never stored",
    )


@router.post("/keys/{key_id}/revoke", response_model=Envelope[KeyRevoked])
def desk_key_revoke(key_id: str, caller: Desk, state: State) -> dict[str, Any]:
    with audited(state.db, Actor.of(caller), "key.revoke", target_kind="key", target_id=key_id) as (
        session,
        note,
    ):
        key = revoke_key(session, key_id)
        note.details["key_prefix"] = key.prefix
        data = {"key_id": key.id, "key_prefix": key.prefix, "revoked": True}
    return ok_envelope(data, "key revoked")


@router.post("/bookings", response_model=Envelope[BookingDetail])
def desk_booking_create(body: BookingBody, caller: Desk, state: State) -> dict[str, Any]:
    with audited(
        state.db,
        Actor.of(caller),
        "booking.create",
        account_id=body.account_id,
        target_kind="booking",
    ) as (session, note):
        booking = create_booking(
            session,
            NewBooking(
                account_id=body.account_id,
                gpu=body.gpu,
                nodes=body.nodes,
                gpus_per_node=body.gpus_per_node,
                region=body.region,
                fabric=body.fabric,
                term_start=body.start,
                term_end=body.end,
                rate_usd_per_gpu_hour=body.rate_usd_per_gpu_hour,
                storage_uri=body.storage_uri,
                storage_quota_gb=body.storage_quota_gb,
                state=body.state,
                gpu_memory_gb=body.gpu_memory_gb,
            ),
        )
        note.target_id = booking.id
        note.details.update(state=booking.state)
        data = booking_dict(booking)
    return ok_envelope(data, "booking recorded")


@router.post("/bookings/{booking_id}/state", response_model=Envelope[BookingDetail])
def desk_booking_state(
    booking_id: str, body: BookingStateBody, caller: Desk, state: State
) -> dict[str, Any]:
    with audited(
        state.db,
        Actor.of(caller),
        "booking.set_state",
        target_kind="booking",
        target_id=booking_id,
        details={"to_state": body.state},
    ) as (session, note):
        booking, previous = move_booking(session, booking_id, body.state)
        note.details["from_state"] = previous
        data = booking_dict(booking)
    return ok_envelope(data, f"booking is now {data['state']}")


@router.get("/audit", response_model=Envelope[AuditLog])
def desk_audit(
    caller: Desk,
    state: State,
    account_id: str | None = Query(default=None, max_length=64),
    limit: int = Query(default=100, ge=1, le=1000),
) -> dict[str, Any]:
    with state.db.read() as session:
        rows = [audit_dict(r) for r in list_audit(session, account_id=account_id, limit=limit)]
    return ok_envelope({"events": rows}, f"{len(rows)} audit event(s), newest first")
