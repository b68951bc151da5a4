"""Confirmations: requested by a requester, decided by a different, human approver."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ito.core.booking_views import ConfirmationView
from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.core.manifest import MANIFEST_MAX_BYTES
from ito.core.responses import Envelope
from ito.server.routers.deps import (
    Approver,
    Requester,
    RequesterOrApprover,
    State,
    decode_manifest_b64,
)
from ito.server.routers.route import OneHopRoute
from ito.server.services.confirmations import (
    confirmation_dict,
    decide_confirmation,
    get_confirmation,
    request_confirmation,
)

router = APIRouter(prefix="/v1/confirmations", route_class=OneHopRoute)


class ConfirmationRequest(BaseModel):
    # Strict: a number sent as a string ("ttl_seconds": "60") is refused, not coerced.
    model_config = ConfigDict(extra="forbid", strict=True)
    action: str
    booking_id: str | None = None
    manifest_id: str | None = None
    run_id: str | None = None
    checkpoint_step: int | None = Field(default=None, ge=0, le=2**63 - 1)
    ttl_seconds: int | None = Field(default=None, ge=1)
    """Shorter life than the server's ``confirmation_ttl_seconds``; a longer one is refused."""
    manifest_b64: str | None = Field(default=None, max_length=2 * MANIFEST_MAX_BYTES)
    """The manifest's bytes; stored with the confirmation if the server lacks them."""


@router.post("", response_model=Envelope[ConfirmationView])
def confirmations_create(
    body: ConfirmationRequest, caller: Requester, state: State
) -> dict[str, Any]:
    ttl = state.settings.confirmation_ttl_seconds
    if body.ttl_seconds is not None:
        if body.ttl_seconds > ttl:  # refused, never silently shortened
            raise ItoError(
                "invalid_arguments",
                f"ttl_seconds may be at most {ttl}",
                errors=[{"path": "body.ttl_seconds", "message": f"at most {ttl}"}],
            )
        ttl = body.ttl_seconds
    raw = decode_manifest_b64(body.manifest_b64) if body.manifest_b64 is not None else None
    with state.db.write() as session:
        confirmation = request_confirmation(
            session,
            caller,
            action=body.action,
            ttl_seconds=ttl,
            booking_id=body.booking_id,
            manifest_digest=body.manifest_id,
            run_id=body.run_id,
            checkpoint_step=body.checkpoint_step,
            manifest_raw=raw,
        )
        data = confirmation_dict(confirmation, state.settings.public_url)
    return ok_envelope(
        data,
        "confirmation requested and pending; a human approver must approve "
        "it out of band. The reference alone authorizes nothing",
    )


@router.get("/{ref}", response_model=Envelope[ConfirmationView])
def confirmations_show(ref: str, caller: RequesterOrApprover, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        data = confirmation_dict(
            get_confirmation(session, caller.account_id, ref), state.settings.public_url
        )
    return ok_envelope(data, f"confirmation {ref} is {data['state']}")


@router.post("/{ref}/approve", response_model=Envelope[ConfirmationView])
def confirmations_approve(ref: str, caller: Approver, state: State) -> dict[str, Any]:
    with state.db.write() as session:
        data = confirmation_dict(
            decide_confirmation(session, caller, state.pepper, ref, approve=True),
            state.settings.public_url,
        )
    return ok_envelope(data, "confirmation approved; it can be used once, before it expires")


@router.post("/{ref}/reject", response_model=Envelope[ConfirmationView])
def confirmations_reject(ref: str, caller: Approver, state: State) -> dict[str, Any]:
    with state.db.write() as session:
        data = confirmation_dict(
            decide_confirmation(session, caller, state.pepper, ref, approve=False),
            state.settings.public_url,
        )
    return ok_envelope(data, "confirmation rejected; it can never be used")
