"""Device login endpoints (RFC 8628 §3.1-3.5), unauthenticated by design: the device has no
credential yet. What they hand out is worth nothing until a signed-in approver approves the
user code on ``/ui/device``."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from ito.core.credential_views import DeviceGrant, DeviceToken
from ito.core.envelope import ok_envelope
from ito.core.responses import Envelope
from ito.server.routers.deps import State, source_of
from ito.server.routers.route import OneHopRoute
from ito.server.services.device_auth import poll_device_code, start_device_login
from ito.server.store.tables import utcnow

router = APIRouter(prefix="/v1/device", route_class=OneHopRoute)
log = logging.getLogger("ito.server.device")


class DeviceCodeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    client_name: str | None = Field(default=None, max_length=100)
    """Shown to the approver (e.g. ``ito on build-host``); never trusted for anything."""


class DeviceTokenBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    device_code: str = Field(min_length=1, max_length=200)
    grant_type: Literal["urn:ietf:params:oauth:grant-type:device_code"] | None = None
    """Optional, as RFC 8628 §3.4 names it; any other grant is refused."""


@router.post("/code", response_model=Envelope[DeviceGrant])
def device_code(
    request: Request, state: State, body: Annotated[DeviceCodeBody | None, Body()] = None
) -> dict[str, Any]:
    # Unauthenticated and it writes a row: bounded per source address like a credential.
    state.limits.admit("device-code " + source_of(request))
    settings = state.settings
    with state.db.write() as session:
        grant = start_device_login(
            session,
            state.pepper,
            client_name=body.client_name if body else None,
            ttl_seconds=settings.device_code_ttl_seconds,
            interval_seconds=settings.device_poll_interval_seconds,
            now=utcnow(),
        )
    verification_uri = f"{settings.public_url.rstrip('/')}/ui/device"
    return ok_envelope(
        {
            "device_code": grant.device_code,
            "user_code": grant.user_code,
            "verification_uri": verification_uri,
            "verification_uri_complete": f"{verification_uri}?user_code={grant.user_code}",
            "expires_in": grant.expires_in,
            "interval": grant.interval,
        },
        "device login started; a signed-in approver must approve the user code",
    )


@router.post("/token", response_model=Envelope[DeviceToken])
def device_token(body: DeviceTokenBody, state: State) -> dict[str, Any]:
    with state.db.write() as session:
        outcome = poll_device_code(session, state.pepper, body.device_code, utcnow())
    # Raised after the commit, so the recorded poll time (for slow_down) is kept.
    if outcome.error is not None:
        raise outcome.error
    minted = outcome.minted
    assert minted is not None
    log.info(
        "device login exchanged for requester key %s (account %s)",
        minted.prefix,
        outcome.account_id,
    )
    return ok_envelope(
        {
            "access_token": minted.api_key,
            "token_type": "bearer",
            "key_prefix": minted.prefix,
            "account_id": outcome.account_id,
            "role": "requester",
        },
        "device login approved; a new requester credential was issued once",
    )
