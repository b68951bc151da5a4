"""Confirmations: requested by a requester, decided by a different, human approver."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ito.core.api_requests import ConfirmationRequest
from ito.core.booking_views import ConfirmationView
from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
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
            cost_bound_usd=body.cost_bound_usd,
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
