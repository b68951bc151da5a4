"""Dependencies shared by the routers: app state, the caller's identity, role checks, bodies.

The pure ones (state, role checks) are coroutines: FastAPI runs a plain ``def`` dependency in
the thread pool, a hand-off that costs more than their work. Authentication reads the store and
stays a plain ``def`` (one trip to the pool)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from ito.core.errors import ErrorCode, ItoError
from ito.core.manifest import MANIFEST_MAX_BYTES
from ito.server.services.credentials import (
    AuthContext,
    Credential,
    OperatorContext,
    authenticate,
)
from ito.server.state import AppState

__all__ = [
    "Approver",
    "Caller",
    "Desk",
    "Requester",
    "RequesterOrApprover",
    "RequesterOrDesk",
    "State",
    "decode_manifest_b64",
    "read_bounded_body",
    "require",
    "source_of",
]


async def _state(request: Request) -> AppState:
    state: AppState = request.app.state.ito
    return state


State = Annotated[AppState, Depends(_state)]


def source_of(request: Request) -> str:
    """The address a request came from: the socket's peer. ``X-Forwarded-For`` counts only
    from the proxies named in ``ITO_TRUSTED_PROXIES``, which ``ito-server serve`` hands to
    uvicorn; never by reading headers here."""
    return f"ip:{request.client.host if request.client else 'unknown'}"


def _key_prefix(token: str) -> str | None:
    """The public prefix (``ito_req_AbCdEfGh``) of something shaped like one of our keys."""
    parts = token.split("_", 3)
    if (
        len(parts) == 4
        and parts[0] == "ito"
        and len(parts[1]) == 3
        and len(parts[2]) == 8
        and parts[2].isalnum()
        and parts[2].isascii()
    ):
        return "_".join(parts[:3])
    return None


def _caller(request: Request, state: State) -> Credential:
    """Authenticate the bearer key. A key that verifies is admitted whatever its address's
    failures; one that does not costs its address (and its public prefix) a try, and past the
    limit is answered ``rate_limited`` instead of ``not_authenticated``
    (:meth:`ito.server.state.Limits.key_failed`)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ItoError("not_authenticated")
    try:
        with state.db.lookup() as session:  # one SELECT: no transaction around it
            caller = authenticate(session, state.pepper, token.strip())
    except ItoError as exc:
        if exc.code == "not_authenticated":  # an unknown key: guessing costs a try
            state.limits.key_failed(source_of(request), _key_prefix(token.strip()))
        raise
    state.limits.admit(caller.principal_id)
    return caller


Caller = Annotated[Credential, Depends(_caller)]
"""Any valid credential: a tenant's principal or the operator."""


def require(*roles: str) -> Callable[[Credential], Awaitable[AuthContext]]:
    """A dependency that admits only a tenant's principal holding one of ``roles``. The
    operator is never admitted here: tenant routes trust ``account_id``, which it has not."""
    assert "desk" not in roles, "the operator is admitted by Desk, never by require()"

    async def check(caller: Caller) -> AuthContext:
        if not isinstance(caller, AuthContext) or caller.role not in roles:
            raise ItoError("forbidden_scope", required=list(roles), role=caller.role)
        return caller

    return check


async def _desk(caller: Caller) -> OperatorContext:
    if not isinstance(caller, OperatorContext):
        raise ItoError("forbidden_scope", required=["desk"], role=caller.role)
    return caller


async def _requester_or_desk(caller: Caller) -> AuthContext | OperatorContext:
    if isinstance(caller, OperatorContext) or caller.role == "requester":
        return caller
    raise ItoError("forbidden_scope", required=["requester", "desk"], role=caller.role)


Requester = Annotated[AuthContext, Depends(require("requester"))]
Approver = Annotated[AuthContext, Depends(require("approver"))]
Desk = Annotated[OperatorContext, Depends(_desk)]
"""The platform's operator; it acts for no tenant."""
RequesterOrApprover = Annotated[AuthContext, Depends(require("requester", "approver"))]
RequesterOrDesk = Annotated[AuthContext | OperatorContext, Depends(_requester_or_desk)]


def decode_manifest_b64(value: str) -> bytes:
    """Manifest bytes sent inside a JSON body, bounded like an upload."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ItoError("invalid_arguments", "manifest bytes are not base64") from None
    if len(raw) > MANIFEST_MAX_BYTES:
        raise ItoError("manifest_too_large", max_bytes=MANIFEST_MAX_BYTES)
    return raw


async def read_bounded_body(request: Request, limit: int, code: ErrorCode) -> bytes:
    """The request body, refusing with ``code`` as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ItoError(code, max_bytes=limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ItoError(code, max_bytes=limit)
        chunks.append(chunk)
    return b"".join(chunks)
