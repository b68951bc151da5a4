"""The desk-scoped API: the operator creates accounts, keys and bookings and moves bookings'
states. This runtime never books, releases or pays for capacity itself; it records what the desk
says."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ito.core.envelope import ok_envelope
from ito.server.routers.deps import Desk, State
from ito.server.services.accounts import create_account
from ito.server.services.bookings import (
    NewBooking,
    booking_dict,
    create_booking,
    set_booking_state,
)
from ito.server.services.credentials import create_key, revoke_key

router = APIRouter(prefix="/v1/desk")


class _Body(BaseModel):
    # Strict: "nodes": "2" is refused, not coerced (times stay ISO 8601 strings).
    model_config = ConfigDict(extra="forbid", strict=True)


class AccountBody(_Body):
    name: str = Field(min_length=1, max_length=200)


class KeyBody(_Body):
    account_id: str
    role: Literal["requester", "approver", "worker", "desk"]
    name: str | None = Field(default=None, max_length=200)
    booking_id: str | None = None


class BookingBody(_Body):
    account_id: str
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


@router.post("/accounts")
def desk_account_create(body: AccountBody, caller: Desk, state: State) -> dict[str, Any]:
    with state.db.write() as session:
        account = create_account(session, body.name)
        data = {"account_id": account.id, "name": account.name}
    return ok_envelope(data, "account created")


@router.post("/keys")
def desk_key_create(body: KeyBody, caller: Desk, state: State) -> dict[str, Any]:
    with state.db.write() as session:
        minted = create_key(session, state.pepper, account_id=body.account_id, role=body.role,
                            name=body.name, booking_id=body.booking_id)
    return ok_envelope({"key_id": minted.key_id, "principal_id": minted.principal_id,
                        "key_prefix": minted.prefix, "api_key": minted.api_key},
                       "key created; the api_key is shown once and never stored")


@router.post("/keys/{key_id}/revoke")
def desk_key_revoke(key_id: str, caller: Desk, state: State) -> dict[str, Any]:
    with state.db.write() as session:
        key = revoke_key(session, key_id)
        data = {"key_id": key.id, "key_prefix": key.prefix, "revoked": True}
    return ok_envelope(data, "key revoked")


@router.post("/bookings")
def desk_booking_create(body: BookingBody, caller: Desk, state: State) -> dict[str, Any]:
    with state.db.write() as session:
        booking = create_booking(session, NewBooking(
            account_id=body.account_id, gpu=body.gpu, nodes=body.nodes,
            gpus_per_node=body.gpus_per_node, region=body.region, fabric=body.fabric,
            term_start=body.start, term_end=body.end,
            rate_usd_per_gpu_hour=body.rate_usd_per_gpu_hour, storage_uri=body.storage_uri,
            storage_quota_gb=body.storage_quota_gb, state=body.state,
            gpu_memory_gb=body.gpu_memory_gb))
        data = booking_dict(booking)
    return ok_envelope(data, "booking recorded")


@router.post("/bookings/{booking_id}/state")
def desk_booking_state(booking_id: str, body: BookingStateBody, caller: Desk,
                       state: State) -> dict[str, Any]:
    with state.db.write() as session:
        data = booking_dict(set_booking_state(session, booking_id, body.state))
    return ok_envelope(data, f"booking is now {data['state']}")
