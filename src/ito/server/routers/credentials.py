"""What a credential may do to itself: revoke it (``ito logout``)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from ito.core.credential_views import SelfRevoked
from ito.core.envelope import ok_envelope
from ito.core.responses import Envelope
from ito.server.routers.deps import Caller, State
from ito.server.routers.route import OneHopRoute
from ito.server.services.audit import Actor, audited
from ito.server.services.credentials import OperatorContext, revoke_key

router = APIRouter(prefix="/v1/credentials", route_class=OneHopRoute)
log = logging.getLogger("ito.server.credentials")


@router.post("/self/revoke", response_model=Envelope[SelfRevoked])
def revoke_self(caller: Caller, state: State) -> dict[str, Any]:
    if isinstance(caller, OperatorContext):  # an operator credential changing is a desk action
        with audited(
            state.db,
            Actor.of(caller),
            "key.revoke",
            target_kind="key",
            target_id=caller.key_id,
            details={"key_prefix": caller.key_prefix, "self": True},
        ) as (session, _):
            key = revoke_key(session, caller.key_id)
    else:
        with state.db.write() as session:
            key = revoke_key(session, caller.key_id)
    data = {"key_prefix": key.prefix, "revoked": True}
    log.info("key %s revoked by its holder", caller.key_prefix)
    return ok_envelope(data, "this credential is revoked; its next request gets credential_revoked")
