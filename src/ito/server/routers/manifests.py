"""Manifest upload (content-addressed, idempotent) and the side-effect-free plan."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.core.manifest import MANIFEST_MAX_BYTES, manifest_digest
from ito.core.manifest_views import ManifestStored, ManifestView, Plan
from ito.core.responses import Envelope
from ito.server.routers.deps import Requester, State, read_bounded_body
from ito.server.routers.route import OneHopRoute
from ito.server.services.manifests import find_manifest, manifest_dict, store_manifest
from ito.server.services.plans import plan_run

router = APIRouter(prefix="/v1", route_class=OneHopRoute)


@router.post("/manifests", response_model=Envelope[ManifestStored])
async def manifests_upload(request: Request, caller: Requester, state: State) -> dict[str, Any]:
    raw = await read_bounded_body(request, MANIFEST_MAX_BYTES, "manifest_too_large")

    def work() -> tuple[dict[str, Any], bool]:
        with state.db.read() as session:
            known = find_manifest(session, caller.account_id, manifest_digest(raw))
            if known is not None:
                return manifest_dict(known), False
        with state.db.write() as session:
            row, created = store_manifest(session, caller.account_id, raw)
            return manifest_dict(row), created

    data, created = await run_in_threadpool(work)
    notice = "manifest stored" if created else "manifest already stored; nothing changed"
    return ok_envelope(data | {"created": created}, notice)


@router.get("/manifests/{digest}", response_model=Envelope[ManifestView])
def manifests_show(digest: str, caller: Requester, state: State) -> dict[str, Any]:
    with state.db.read() as session:
        row = find_manifest(session, caller.account_id, digest)
        if row is None:
            raise ItoError("manifest_not_found")
        return ok_envelope(manifest_dict(row), "manifest found")


# Unset fields left out: a refusal's ``details`` is absent when it has none, as in every error.
@router.post("/plans", response_model=Envelope[Plan], response_model_exclude_unset=True)
async def plans_create(
    booking_id: str, request: Request, caller: Requester, state: State
) -> dict[str, Any]:
    raw = await read_bounded_body(request, MANIFEST_MAX_BYTES, "manifest_too_large")

    def work() -> dict[str, Any]:
        with state.db.read() as session:
            return plan_run(session, caller.account_id, booking_id, raw)

    data = await run_in_threadpool(work)
    if data["ready"]:
        notice = "plan only: the run would pass every gate; nothing was created"
    else:
        codes = ", ".join(r["code"] for r in data["refusals"])
        notice = f"plan only: the run would be refused ({codes}); nothing was created"
    return ok_envelope(data, notice)
