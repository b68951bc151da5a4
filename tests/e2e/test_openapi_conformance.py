"""The checking proxy itself (:mod:`tests.openapi_conformance`): it sees the real answers, and it
would fail a test whose answer does not match the server's OpenAPI document. And a walk through
every documented operation, each answering a success, so every route's model is checked against
a real answer on both backends."""

from __future__ import annotations

import base64
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.provenance import provenance_digest
from ito.pipeline.data_prep import prepare_data
from ito.server.services.audit import (
    account_event_dict,
    audit_dict,
    list_account_events,
    list_audit,
)
from ito.server.services.bookings import booking_dict, eligibility, get_booking, list_bookings
from ito.server.services.gates import gates_of
from ito.server.services.manifests import load_manifest, manifest_dict
from ito.server.services.plans import plan_run
from ito.server.services.provenance import provenance_of
from ito.server.services.runs import list_runs, run_dict
from ito.server.services.telemetry import booking_telemetry, run_telemetry
from ito.server.store.tables import IdempotencyRecord
from tests.openapi_conformance import PROXIES
from tests.server.web_browser import device_code, make_approver, poll_until_decided, signed_in
from tests.support import Server, Tenant, make_tenant


def test_the_proxy_checks_real_answers_and_catches_one_that_does_not_match(
    server: Server,
    tenant: Tenant,
) -> None:
    proxy = PROXIES[server.url]
    before = proxy.checked
    health = httpx.get(server.url + "/v1/health", timeout=30)
    assert health.status_code == 200 and health.json()["ok"] is True
    missing = tenant.api("GET", "/v1/runs/run_doesnotexist")
    assert missing["error"]["code"] == "run_not_found"
    assert proxy.checked >= before + 2

    def check(path: str, status: int, body: object, method: str = "GET") -> str | None:
        return proxy.check(method, path, status, "application/json", json.dumps(body).encode())

    assert check("/v1/health", 200, health.json()) is None
    assert check("/v1/runs/run_x", 404, missing) is None
    # Each of these would fail the test that got it.
    assert check("/v1/health", 200, {"ok": True, "notice": "up", "data": {}}) is not None
    assert check("/v1/health", 200, {**health.json(), "surprise": 1}) is not None
    assert check("/v1/runs/run_x", 404, {**missing, "ok": True}) is not None
    assert (
        check("/v1/worker/lease", 200, {**health.json(), "data": {"run_id": "r"}}, method="POST")
        is not None
    )
    assert proxy.check("GET", "/v1/health", 200, "text/html", b"<p>up</p>") is not None


# ---- every operation, answered for real ---------------------------------------------------------
#
# The proxy checks each answer against the document, so a view model with a field the server does
# not return (or of another type) fails. A view ignores what it does not list, so a field the
# model lacks would be dropped silently: the answers are also compared with what the services
# build, read in this process from the same database, key for key.


def ok(envelope: Any) -> dict[str, Any]:
    assert envelope["ok"] is True, envelope
    return dict(envelope["data"])


def built(server: Server, make: Callable[[Session], Any]) -> Any:
    """What a service builds from the database now, as JSON would carry it."""
    with Session(server.engine) as session:
        return json.loads(json.dumps(make(session)))


def same_keys(answer: Any, service: Any, where: str = "data") -> None:
    """``answer`` has exactly the keys the service built, all the way down (for answers holding
    times of their own making, which cannot be equal)."""
    if isinstance(service, dict):
        assert isinstance(answer, dict), where
        assert set(answer) == set(service), (where, sorted(set(answer) ^ set(service)))
        for key, value in service.items():
            same_keys(answer[key], value, f"{where}.{key}")
    elif isinstance(service, list):
        assert isinstance(answer, list) and len(answer) == len(service), where
        for i, (a, b) in enumerate(zip(answer, service, strict=True)):
            same_keys(a, b, f"{where}[{i}]")


def stored_response(t: Tenant, key: str) -> dict[str, Any]:
    """What the service recorded as the answer of this idempotency key (before ``replayed``)."""
    response = built(
        t.server,
        lambda s: s.scalar(
            select(IdempotencyRecord.response).where(
                IdempotencyRecord.account_id == t.account_id, IdempotencyRecord.key == key
            )
        ),
    )
    assert isinstance(response, dict)
    return response


def desk_get(server: Server, path: str, **params: str) -> dict[str, Any]:
    answer = httpx.get(
        server.url + path,
        params=params,
        timeout=30,
        headers={"authorization": f"Bearer {server.desk_key}"},
    )
    return ok(answer.json())


def confirmed(t: Tenant, **request: Any) -> str:
    """A confirmation requested by the requester and approved by the approver."""
    ref = str(ok(t.api("POST", "/v1/confirmations", json=request))["confirmation_ref"])
    assert ok(t.api("POST", f"/v1/confirmations/{ref}/approve", key="approver"))["state"] == (
        "approved"
    )
    return ref


def _desk_and_account(t: Tenant) -> str:
    """Keys minted and revoked, a booking recorded and moved; the trail and what the tenant
    sees of it. Returns the moved booking: revoked, and short of the accelerators the manifest
    needs."""
    server = t.server
    minted = server.desk("/v1/desk/keys", {"account_id": t.account_id, "role": "requester"})
    revoked = server.desk(f"/v1/desk/keys/{minted['key_id']}/revoke", {})
    assert revoked == {
        "key_id": minted["key_id"],
        "key_prefix": minted["key_prefix"],
        "revoked": True,
    }
    spare = t.booking(gpus_per_node=1)
    moved = server.desk(f"/v1/desk/bookings/{spare}/state", {"state": "revoked"})
    booking = built(server, lambda s: booking_dict(get_booking(s, t.account_id, spare)))
    assert moved == booking and booking["state"] == "revoked"
    assert ok(t.api("GET", f"/v1/bookings/{spare}")) == booking

    trail = desk_get(server, "/v1/desk/audit", account_id=t.account_id)["events"]
    assert trail == built(
        server, lambda s: [audit_dict(r) for r in list_audit(s, account_id=t.account_id)]
    )
    assert [e["action"] for e in trail[:3]] == ["booking.set_state", "booking.create", "key.revoke"]
    assert trail[0]["details"] == {"to_state": "revoked", "from_state": "completed"}
    seen = ok(t.api("GET", "/v1/account/events"))["events"]
    assert seen == built(
        server, lambda s: [account_event_dict(e) for e in list_account_events(s, t.account_id)]
    )
    assert [e["action"] for e in seen] == [e["action"] for e in trail]
    assert {e["actor"] for e in seen} == {"desk"}
    on_spare = ok(t.api("GET", f"/v1/bookings/{spare}/events"))["events"]
    assert [(e["action"], e["target_id"]) for e in on_spare] == [
        ("booking.set_state", spare),
        ("booking.create", spare),
    ]
    assert on_spare == seen[:2]

    assert ok(t.api("GET", "/v1/me"))["account_id"] == t.account_id
    listed = ok(t.api("GET", "/v1/bookings"))["bookings"]
    assert {b["booking_id"] for b in listed} == {t.booking_id, spare}
    eligible = ok(t.api("GET", f"/v1/bookings/{t.booking_id}/eligibility"))
    same_keys(eligible, built(server, lambda s: eligibility(s, t.account_id, t.booking_id)))
    assert eligible["eligible"] is True and eligible["term"]["end"] > eligible["checked_at"]
    assert ok(t.api("GET", "/v1/schemas/manifest"))["$id"]
    return spare


def _manifest_and_plans(t: Tenant, spare: str) -> str:
    """The manifest stored once, read back, and planned on a usable and an unusable booking.
    Returns its digest."""
    raw = t.manifest().read_bytes()
    stored = ok(t.api("POST", "/v1/manifests", content=raw))
    assert stored["created"] is True and stored["size_bytes"] == len(raw)
    assert ok(t.api("POST", "/v1/manifests", content=raw)) == stored | {"created": False}
    shown = ok(t.api("GET", f"/v1/manifests/{stored['digest']}"))
    row = built(
        t.server, lambda s: manifest_dict(load_manifest(s, t.account_id, stored["digest"])[0])
    )
    assert shown == row == {k: v for k, v in stored.items() if k != "created"}
    assert shown["summary"]["model"]["parameters"] > 0

    plan = ok(t.api("POST", "/v1/plans", params={"booking_id": t.booking_id}, content=raw))
    same_keys(plan, built(t.server, lambda s: plan_run(s, t.account_id, t.booking_id, raw)))
    assert plan["ready"] is True and plan["refusals"] == []
    assert plan["validation"] == {"ok": True, "schema": "ito.training.manifest.v1"}
    assert plan["eligibility"]["eligible"] is True and plan["checks"]["ok"] is True
    assert plan["summary"] == stored["summary"]
    assert plan["cost"]["within_ceiling"] is True
    refused = ok(t.api("POST", "/v1/plans", params={"booking_id": spare}, content=raw))
    same_keys(refused, built(t.server, lambda s: plan_run(s, t.account_id, spare, raw)))
    assert refused["ready"] is False
    assert refused["eligibility"]["error"]["code"] == "booking_revoked"
    assert refused["checks"]["error"]["code"] == "capacity_insufficient"
    assert [r["code"] for r in refused["refusals"]] == ["booking_revoked", "capacity_insufficient"]
    return str(stored["digest"])


def _create(t: Tenant, digest: str, key: str) -> dict[str, Any]:
    ref = confirmed(t, action="train.create", booking_id=t.booking_id, manifest_id=digest)
    assert ok(t.api("GET", f"/v1/confirmations/{ref}"))["state"] == "approved"
    body = {
        "booking_id": t.booking_id,
        "manifest_id": digest,
        "confirmation_ref": ref,
        "idempotency_key": key,
    }
    created = ok(t.api("POST", "/v1/runs", json=body))
    assert created == stored_response(t, key) | {"replayed": False}
    assert created["state"] == "queued"
    replay = ok(t.api("POST", "/v1/runs", json=body))
    assert replay == created | {"replayed": True}
    return created


def _act(t: Tenant, run_id: str, verb: str, action: str, **extra: Any) -> dict[str, Any]:
    ref = confirmed(t, action=action, run_id=run_id, **extra)
    key = f"{verb}-{run_id}"
    body = {"confirmation_ref": ref, "idempotency_key": key}
    done = ok(t.api("POST", f"/v1/runs/{run_id}/{verb}", json=body))
    assert done == stored_response(t, key) | {"replayed": False}
    assert ok(t.api("POST", f"/v1/runs/{run_id}/{verb}", json=body)) == done | {"replayed": True}
    return done


def _run_through_a_worker(t: Tenant, digest: str) -> None:
    """A run leased by a worker, reporting until a loss spike; restarted by a confirmed human,
    finished, measured and cleaned up."""
    run_id = _create(t, digest, "walk-1")["run_id"]
    worker = t.server.desk(
        "/v1/desk/keys", {"account_id": t.account_id, "role": "worker", "booking_id": t.booking_id}
    )["api_key"]

    def work(path: str, body: dict[str, Any] | None = None) -> Any:
        return t.api("POST" if body is not None else "GET", path, key=worker, json=body)

    lease = ok(work("/v1/worker/lease", {}))
    assert (lease["run_id"], lease["attempt"], lease["restart_from"]) == (run_id, 1, None)
    beat = ok(work(f"/v1/worker/runs/{run_id}/heartbeat", {"attempt": 1}))
    assert beat["state"] == "running" and beat["stop"] is None
    with Session(t.server.engine) as session:
        manifest = load_manifest(session, t.account_id, digest)[1]
    with tempfile.TemporaryDirectory() as scratch:
        prepare_data(manifest, Path(scratch))
        report = (Path(scratch) / "prepared" / "provenance.json").read_bytes()
    upload = {"attempt": 1, "report_b64": base64.b64encode(report).decode()}
    bound = ok(work(f"/v1/worker/runs/{run_id}/provenance", upload))
    assert bound == {
        "run_id": run_id,
        "sha256": provenance_digest(report),
        "bytes": len(report),
        "replayed": False,
    }
    served = ok(t.api("GET", f"/v1/runs/{run_id}/provenance"))
    assert served == built(t.server, lambda s: provenance_of(s, t.account_id, run_id))
    assert served["report"] == json.loads(report)
    events = [
        {"type": "stage", "stage": "s1", "status": "started"},
        {"type": "log", "level": "info", "message": "step 1"},
        {
            "type": "metric",
            "stage": "s1",
            "step": 1,
            "values": {"step_seconds": 2.0, "tokens_per_s": 500.0, "mfu": 0.25},
        },
        {
            "type": "checkpoint",
            "stage": "s1",
            "step": 1,
            "path": "ckpt/1",
            "bytes": 4000,
            "seconds": 2.0,
        },
        {
            "type": "spike",
            "stage": "s1",
            "step": 2,
            "loss": 9.5,
            "z": 7.0,
            "checkpoint_step": 1,
            "skip_steps": 1,
        },
    ]
    counts = ok(work(f"/v1/worker/runs/{run_id}/report", {"attempt": 1, "events": events}))
    assert counts == {"logs": 1, "metrics": 3, "checkpoints": 1, "events": 2}
    assert ok(t.api("GET", f"/v1/runs/{run_id}"))["state"] == "awaiting_approval"
    lines = ok(t.api("GET", f"/v1/runs/{run_id}/logs"))["lines"]
    assert [line["message"] for line in lines] == ["step 1"]
    points = ok(t.api("GET", f"/v1/runs/{run_id}/metrics", params={"name": "mfu"}))["points"]
    assert [p["value"] for p in points] == [0.25]
    gates = ok(t.api("GET", f"/v1/runs/{run_id}/gates"))
    assert gates == built(t.server, lambda s: gates_of(s, t.account_id, run_id))
    checkpoints = ok(t.api("GET", f"/v1/runs/{run_id}/checkpoints"))["checkpoints"]
    assert [(c["step"], c["bytes"], c["deleted"]) for c in checkpoints] == [(1, 4000, False)]

    restarted = _act(t, run_id, "restart", "run.restart_from_checkpoint", checkpoint_step=1)
    assert restarted["state"] == "recovering"
    lease = ok(work("/v1/worker/lease", {}))
    assert lease["attempt"] == 2 and lease["restart_from"] == {"step": 1, "skip_steps": 1}
    # The attempt stops at the approved cost bound; a human approves a new one.
    waiting = {"attempt": 2, "status": "awaiting_approval", "failure_code": "cost_bound_reached"}
    assert ok(work(f"/v1/worker/runs/{run_id}/finish", waiting))["state"] == "awaiting_approval"
    run = ok(t.api("GET", f"/v1/runs/{run_id}"))
    assert run["latest_event"]["data"]["reason"] == "cost_bound_reached"
    limit = min(run["estimate"]["ceiling_usd"], run["estimate"]["max_incremental_cost_usd"])
    assert run["cost_bound_usd"] < limit
    raised = _act(t, run_id, "raise-bound", "run.raise_cost_bound", cost_bound_usd=limit)
    assert raised["state"] == "recovering"
    lease = ok(work("/v1/worker/lease", {}))
    assert lease["attempt"] == 3 and lease["restart_from"] is None
    finished = ok(work(f"/v1/worker/runs/{run_id}/finish", {"attempt": 3, "status": "succeeded"}))
    assert finished == {"run_id": run_id, "state": "succeeded"}
    kinds = [e["kind"] for e in ok(t.api("GET", f"/v1/runs/{run_id}/events"))["events"]]
    assert kinds[0] == "created" and "checkpoint" in kinds

    figures = ok(t.api("GET", "/v1/telemetry", params={"run_id": run_id}))
    assert figures == built(t.server, lambda s: run_telemetry(s, t.account_id, run_id))
    assert (figures["run_id"], figures["state"]) == (run_id, "succeeded")
    assert (figures["checkpoint_bytes"], figures["mfu"]) == (4000, 0.25)
    assert figures["checkpoint_bandwidth_bytes_per_s"] == 2000.0
    booking = ok(t.api("GET", "/v1/telemetry", params={"booking_id": t.booking_id}))
    assert booking == built(t.server, lambda s: booking_telemetry(s, t.account_id, t.booking_id))
    assert booking["runs"] == 1 and booking["per_run"] == [figures]
    scraped = t.server.get_text("/metrics")
    assert f'ito_run_mfu{{booking="{t.booking_id}",run="{run_id}",' in scraped

    cleaning = _act(t, run_id, "cleanup", "run.cleanup")
    assert cleaning["cleanup_state"] == "cleaning"
    jobs = ok(work("/v1/worker/cleanups"))["cleanups"]
    assert [j["run_id"] for j in jobs] == [run_id]
    cleaned = ok(work(f"/v1/worker/runs/{run_id}/cleaned", {"bytes_freed": 4000}))
    assert cleaned == {"run_id": run_id, "cleanup_state": "cleaned", "bytes_freed": 4000}
    assert ok(t.api("GET", "/v1/telemetry", params={"run_id": run_id}))["bytes_freed"] == 4000


def _cancelled_run(t: Tenant, digest: str) -> None:
    run_id = _create(t, digest, "walk-2")["run_id"]
    assert _act(t, run_id, "cancel", "run.cancel")["state"] == "cancelled"
    overview = ok(t.api("GET", "/v1/status"))
    assert overview == built(
        t.server,
        lambda s: {
            "account_id": t.account_id,
            "bookings": [booking_dict(b) for b in list_bookings(s, t.account_id)],
            "recent_runs": [run_dict(r) for r in list_runs(s, t.account_id, limit=10)],
        },
    )
    assert overview["recent_runs"][0]["run_id"] == run_id
    listed = ok(t.api("GET", "/v1/runs"))["runs"]
    assert [r["state"] for r in listed] == ["cancelled", "succeeded"]
    request = {"action": "run.cleanup", "run_id": run_id}
    ref = ok(t.api("POST", "/v1/confirmations", json=request))["confirmation_ref"]
    decided = ok(t.api("POST", f"/v1/confirmations/{ref}/reject", key="approver"))
    assert decided["state"] == "rejected"


def _device_login_and_self_revocation(t: Tenant) -> None:
    server = t.server
    grant = device_code(server.url, "conformance walk")
    assert set(grant) == {
        "device_code",
        "user_code",
        "verification_uri",
        "verification_uri_complete",
        "expires_in",
        "interval",
    }
    approver = make_approver(server, t.account_id)
    web = signed_in(server, approver)
    try:
        assert web.decide_device(grant["user_code"], "approve").status_code == 200
    finally:
        web.close()
    token = ok(poll_until_decided(server.url, grant).json())
    assert token["account_id"] == t.account_id and token["role"] == "requester"
    assert token["access_token"].startswith(token["key_prefix"] + "_")
    revoked = ok(t.api("POST", "/v1/credentials/self/revoke", key=token["access_token"]))
    assert revoked == {"key_prefix": token["key_prefix"], "revoked": True}
    refused = t.api("GET", "/v1/me", key=token["access_token"])
    assert refused["error"]["code"] == "credential_revoked"


@pytest.mark.slow
def test_every_documented_operation_answers_a_success_that_matches_its_model(
    server: Server, tmp_path: Path
) -> None:
    """Every operation of the OpenAPI document called for real, each with a success to give, and
    every answer checked against the document by the proxy."""
    proxy = PROXIES[server.url]
    with proxy._lock:
        proxy.answered.clear()
    t = make_tenant(server, tmp_path / "walk", "conformance-walk")
    assert httpx.get(server.url + "/v1/health", timeout=30).status_code == 200
    spare = _desk_and_account(t)
    digest = _manifest_and_plans(t, spare)
    _run_through_a_worker(t, digest)
    _cancelled_run(t, digest)
    _device_login_and_self_revocation(t)
    documented = {o.label for o in proxy.operations}
    assert documented - proxy.answered == set()
