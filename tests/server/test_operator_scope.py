"""The desk is the platform's operator, not a tenant (DESIGN §5.1): its keys belong to no
account and are minted only by ``ito-server`` on the server's host; tenant keys reach no desk
route and desk keys no tenant route; every desk action is audited — who, what, which account,
outcome — and never with a secret; a tenant sees the desk's actions on its own account and runs,
and nothing of another's. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from fastapi.routing import APIRoute
from sqlalchemy import text

from ito.server.routers import bookings as booking_routes
from ito.server.routers import confirmations as confirmation_routes
from ito.server.routers import desk as desk_routes
from ito.server.routers import manifests as manifest_routes
from ito.server.routers import runs as run_routes
from ito.server.routers import worker as worker_routes
from tests.support import ITO_SERVER, Result, Server, Tenant, database_text, run_cli

UNUSED_IDS = {
    "{key_id}": "key_" + "a" * 24,
    "{run_id}": "run_" + "a" * 24,
    "{ref}": "cfr_" + "a" * 24,
    "{digest}": "sha256-0",
}


def server_cli(server: Server, *args: str) -> Result:
    return run_cli([ITO_SERVER, *args, "--json"], server.env)


def call(server: Server, method: str, path: str, key: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(
        method, server.url + path, timeout=30, headers={"authorization": f"Bearer {key}"}, **kwargs
    )


def code_of(response: httpx.Response) -> str | None:
    body = response.json()
    return None if body["ok"] else str(body["error"]["code"])


def scalar(server: Server, sql: str, **params: Any) -> Any:
    with server.engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def key_rows(server: Server) -> dict[str, int]:
    """Every credential row there is: a refusal must leave these unchanged."""
    return {
        table: int(scalar(server, f"SELECT count(*) FROM {table}"))  # noqa: S608
        for table in ("principals", "api_keys", "operator_keys")
    }


def audit(server: Server, **query: Any) -> list[dict[str, Any]]:
    response = call(server, "GET", "/v1/desk/audit", server.desk_key, params=query)
    assert response.status_code == 200, response.text
    return list(response.json()["data"]["events"])


def booking_body(tenant: Tenant, **overrides: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "account_id": tenant.account_id,
        "gpu": "cpu",
        "nodes": 1,
        "gpus_per_node": 2,
        "region": "local",
        "fabric": "ethernet",
        "start": (now - timedelta(hours=1)).isoformat(),
        "end": (now + timedelta(days=2)).isoformat(),
        "rate_usd_per_gpu_hour": 0.5,
        "storage_uri": f"file://{tenant.workdir}/storage",
        "storage_quota_gb": 10.0,
        "state": "completed",
    } | overrides


def create_run(tenant: Tenant) -> str:
    return tenant.train(tenant.manifest(), "operator-scope")


def routes(module: Any) -> list[tuple[str, str]]:
    return [
        (method, route.path)
        for route in module.router.routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods or ())
    ]


def concrete(path: str, tenant: Tenant) -> str:
    for placeholder, value in UNUSED_IDS.items():
        path = path.replace(placeholder, value)
    return path.replace("{booking_id}", tenant.booking_id)


def test_desk_key_for_an_account_is_refused_and_creates_nothing(tenant: Tenant) -> None:
    server = tenant.server
    before = key_rows(server)
    for args in (
        ["--account", tenant.account_id, "--role", "desk"],
        ["--account", tenant.account_id, "--role", "desk", "--name", "takeover"],
        ["--role", "desk", "--booking", tenant.booking_id],
        ["--role", "requester"],
        ["--role", "approver"],
    ):
        result = server_cli(server, "key", "create", *args)
        assert result.rc == 1 and result.code == "invalid_arguments", (args, result.stdout)
        assert "api_key" not in result.stdout
    assert key_rows(server) == before
    refused = [
        e
        for e in audit(server, account_id=tenant.account_id)
        if e["action"] == "key.create" and e["outcome"] == "refused"
    ]
    assert len(refused) == 2
    assert all(
        e["error_code"] == "invalid_arguments"
        and e["actor"].startswith("cli:")
        and e["details"]["role"] == "desk"
        and e["actor_key_id"] is None
        for e in refused
    )


def test_operator_key_belongs_to_no_account_and_reaches_no_tenant_route(tenant: Tenant) -> None:
    server = tenant.server
    minted = server_cli(server, "key", "create", "--role", "desk", "--name", "second operator")
    assert minted.rc == 0 and minted.data["account_id"] is None
    operator_key = str(minted.data["api_key"])
    me = call(server, "GET", "/v1/me", operator_key).json()["data"]
    assert me["account_id"] is None and me["role"] == "desk"
    assert scalar(server, "SELECT count(*) FROM principals WHERE role = 'desk'") == 0
    assert scalar(server, "SELECT count(*) FROM api_keys WHERE role = 'desk'") == 0
    assert (
        scalar(
            server,
            "SELECT count(*) FROM operator_keys WHERE prefix = :p",
            p=minted.data["key_prefix"],
        )
        == 1
    )

    tenant_routes = [
        *routes(booking_routes),
        *routes(run_routes),
        *routes(manifest_routes),
        *routes(confirmation_routes),
        *routes(worker_routes),
        ("GET", "/v1/status"),
        ("GET", "/v1/account/events"),
    ]
    for desk_key in (server.desk_key, operator_key):
        for method, path in tenant_routes:
            response = call(
                server,
                method,
                concrete(path, tenant),
                desk_key,
                **({"json": {}} if method == "POST" else {}),
            )
            assert response.status_code == 403 and code_of(response) == "forbidden_scope", (
                method,
                path,
                response.text,
            )


def test_tenant_keys_get_forbidden_scope_on_every_desk_route(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    server = tenant.server
    worker = server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )["api_key"]
    desk_routes_all = [*routes(desk_routes), ("GET", "/metrics")]
    assert {
        ("POST", "/v1/desk/keys"),
        ("GET", "/v1/desk/audit"),
        ("POST", "/v1/desk/bookings/{booking_id}/state"),
    } <= set(desk_routes_all)
    # Bodies a desk key would succeed with: the refusal is the key's scope, nothing else.
    bodies = {
        "/v1/desk/accounts": {"name": "intruder"},
        "/v1/desk/keys": {"account_id": other_tenant.account_id, "role": "requester"},
        "/v1/desk/bookings": booking_body(other_tenant),
        "/v1/desk/bookings/{booking_id}/state": {"state": "revoked"},
    }
    rows_before, audit_before = key_rows(server), len(audit(server, limit=1000))
    for key in (tenant.requester_key, tenant.approver_key, worker):
        for method, path in desk_routes_all:
            response = call(
                server,
                method,
                concrete(path, tenant),
                key,
                **({"json": bodies.get(path, {})} if method == "POST" else {}),
            )
            assert response.status_code == 403 and code_of(response) == "forbidden_scope", (
                method,
                path,
                response.text,
            )
    assert key_rows(server) == rows_before
    assert len(audit(server, limit=1000)) == audit_before
    assert tenant.api("GET", f"/v1/bookings/{tenant.booking_id}")["data"]["state"] == "completed"


def test_takeover_of_another_tenant_through_desk_keys_fails(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    """The review's scenario: from account B, mint a desk key and use it against account A's
    keys, bookings and telemetry, with a run in A."""
    server, victim, attacker = tenant.server, tenant, other_tenant
    run_id = create_run(victim)
    victim_key = server.desk(
        "/v1/desk/keys", {"account_id": victim.account_id, "role": "requester"}
    )
    rows_before, victim_before = key_rows(server), victim.counts()

    # No desk key "of account B": not from the host's CLI, not through the desk API.
    old_style = server_cli(
        server, "key", "create", "--account", attacker.account_id, "--role", "desk"
    )
    assert old_style.rc == 1 and old_style.code == "invalid_arguments"
    for body in ({"account_id": attacker.account_id, "role": "desk"}, {"role": "desk"}):
        response = call(server, "POST", "/v1/desk/keys", server.desk_key, json=body)
        assert response.status_code == 403 and code_of(response) == "forbidden_scope"
    # B's own credentials act on nothing of A's.
    for key in (attacker.requester_key, attacker.approver_key):
        for method, path, body in [
            ("POST", "/v1/desk/keys", {"account_id": victim.account_id, "role": "requester"}),
            ("POST", "/v1/desk/keys", {"account_id": victim.account_id, "role": "approver"}),
            ("POST", f"/v1/desk/keys/{victim_key['key_id']}/revoke", {}),
            ("POST", f"/v1/desk/bookings/{victim.booking_id}/state", {"state": "revoked"}),
            ("POST", "/v1/desk/bookings", booking_body(victim)),
        ]:
            response = call(server, method, path, key, json=body)
            assert code_of(response) == "forbidden_scope", (path, response.text)
        for query in ({"run_id": run_id}, {"booking_id": victim.booking_id}):
            response = call(server, "GET", "/v1/telemetry", key, params=query)
            assert code_of(response) in ("run_not_found", "booking_not_found", "forbidden_scope"), (
                response.text
            )
            assert response.status_code in (403, 404)
    # A worker key for A's booking cannot be minted into B.
    response = call(
        server,
        "POST",
        "/v1/desk/keys",
        server.desk_key,
        json={"account_id": attacker.account_id, "role": "worker", "booking_id": victim.booking_id},
    )
    assert code_of(response) == "booking_not_found"

    assert key_rows(server) == rows_before
    assert victim.counts() == victim_before
    assert victim.api("GET", "/v1/me", key=victim_key["api_key"])["ok"]
    assert victim.api("GET", f"/v1/bookings/{victim.booking_id}")["data"]["state"] == "completed"
    assert victim.api("GET", f"/v1/runs/{run_id}")["data"]["state"] == "queued"


def test_desk_api_refuses_to_mint_desk_keys_and_records_the_attempt(tenant: Tenant) -> None:
    server = tenant.server
    before = key_rows(server)
    response = call(
        server,
        "POST",
        "/v1/desk/keys",
        server.desk_key,
        json={"account_id": tenant.account_id, "role": "desk", "name": "x"},
    )
    assert response.status_code == 403 and code_of(response) == "forbidden_scope"
    response = call(
        server,
        "POST",
        "/v1/desk/keys",
        server.desk_key,
        json={"account_id": tenant.account_id, "role": "admin"},
    )
    assert code_of(response) == "invalid_arguments"
    assert key_rows(server) == before
    refused = {
        e["details"]["role"]: e
        for e in audit(server, account_id=tenant.account_id)
        if e["outcome"] == "refused"
    }
    assert refused["desk"]["error_code"] == "forbidden_scope"
    assert refused["admin"]["error_code"] == "invalid_arguments"
    assert refused["desk"]["actor"].startswith("key:ito_dsk_")


def test_every_desk_action_is_audited_with_who_what_and_account_and_no_secret(
    tenant: Tenant, tmp_path: Path
) -> None:
    server = tenant.server
    me = call(server, "GET", "/v1/me", server.desk_key).json()["data"]
    secrets = [server.desk_key, tenant.requester_key, tenant.approver_key]

    # Through the desk API.
    account = server.desk("/v1/desk/accounts", {"name": "audited"})["account_id"]
    minted = server.desk(
        "/v1/desk/keys", {"account_id": account, "role": "requester", "name": "agent"}
    )
    secrets.append(minted["api_key"])
    server.desk(f"/v1/desk/keys/{minted['key_id']}/revoke", {})
    holder = Tenant(
        server=server,
        account_id=account,
        requester_key="",
        approver_key="",
        booking_id="",
        workdir=tmp_path,
    )
    booking = server.desk("/v1/desk/bookings", booking_body(holder, state="pending"))
    server.desk(f"/v1/desk/bookings/{booking['booking_id']}/state", {"state": "completed"})
    telemetry = call(
        server,
        "GET",
        "/v1/telemetry",
        server.desk_key,
        params={"booking_id": booking["booking_id"]},
    )
    assert telemetry.status_code == 200
    # A key pasted where an id belongs is refused and recorded without it.
    pasted = call(server, "POST", f"/v1/desk/keys/{minted['api_key']}/revoke", server.desk_key)
    assert code_of(pasted) == "key_not_found"

    # Through the host's CLI.
    cli_key = server_cli(server, "key", "create", "--account", account, "--role", "approver")
    secrets.append(str(cli_key.data["api_key"]))
    assert server_cli(server, "key", "revoke", str(cli_key.data["key_id"])).rc == 0
    cli_booking = server_cli(
        server,
        "booking",
        "create",
        "--account",
        account,
        "--gpu",
        "cpu",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--region",
        "local",
        "--fabric",
        "ethernet",
        "--start",
        "2026-01-01T00:00:00Z",
        "--end",
        "2036-01-01T00:00:00Z",
        "--rate-usd-per-gpu-hour",
        "1",
        "--storage-uri",
        f"file://{tmp_path}/s",
    ).data["booking_id"]
    assert server_cli(server, "booking", "set-state", cli_booking, "--state", "expired").rc == 0

    events = audit(server, account_id=account)
    by_api = [
        (e["action"], e["target_id"], e["outcome"])
        for e in events
        if e["actor"] == f"key:{me['key_prefix']}"
    ]
    assert list(reversed(by_api)) == [
        ("account.create", account, "ok"),
        ("key.create", minted["key_id"], "ok"),
        ("key.revoke", minted["key_id"], "ok"),
        ("booking.create", booking["booking_id"], "ok"),
        ("booking.set_state", booking["booking_id"], "ok"),
        ("telemetry.read", booking["booking_id"], "ok"),
    ]
    assert all(
        e["actor_key_id"] == me["principal_id"] and e["account_id"] == account
        for e in events
        if e["actor"].startswith("key:")
    )
    by_cli = [(e["action"], e["outcome"]) for e in events if e["actor"].startswith("cli:")]
    assert list(reversed(by_cli)) == [
        ("key.create", "ok"),
        ("key.revoke", "ok"),
        ("booking.create", "ok"),
        ("booking.set_state", "ok"),
    ]
    moved = next(
        e for e in events if e["action"] == "booking.set_state" and e["target_id"] == cli_booking
    )
    assert moved["details"] == {"to_state": "expired", "from_state": "pending"}
    created = next(
        e for e in events if e["action"] == "key.create" and e["target_id"] == minted["key_id"]
    )
    assert created["details"]["key_prefix"] == minted["key_prefix"]
    assert created["details"]["role"] == "requester"
    now = datetime.now(UTC)
    assert all(now - timedelta(minutes=10) < datetime.fromisoformat(e["at"]) <= now for e in events)
    redacted = [
        e
        for e in audit(server, limit=50)
        if e["action"] == "key.revoke"
        and e["outcome"] == "refused"
        and e["error_code"] == "key_not_found"
    ]
    assert redacted and redacted[0]["target_id"] == "<redacted>"

    # No secret anywhere: not in the API's audit, the CLI's, nor in any stored audit row.
    outputs = [
        json.dumps(audit(server, limit=1000)),
        server_cli(server, "audit", "--limit", "1000").stdout,
    ]
    with server.engine.connect() as conn:
        outputs.append(repr(conn.execute(text("SELECT * FROM audit_events")).all()))
    for output in outputs:
        for secret in secrets:
            assert secret not in output
            assert secret.split("_", 3)[3] not in output
    stored = database_text(server)
    assert not any(secret.encode() in stored for secret in secrets)


def test_ito_server_audit_json_lists_newest_first_by_account_and_limit(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    server = tenant.server
    tenant.set_booking_state(tenant.booking_id, "released")
    result = server_cli(server, "audit", "--account", tenant.account_id, "--limit", "2")
    assert result.rc == 0 and result.envelope is not None
    assert result.envelope["live_api_contacted"] is False and result.envelope["notice"]
    events = result.data["events"]
    assert len(events) == 2
    assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)
    assert all(e["account_id"] == tenant.account_id for e in events)
    assert events[0]["action"] == "booking.set_state"
    assert events[0]["details"] == {"to_state": "released", "from_state": "completed"}
    everything = server_cli(server, "audit", "--limit", "1000").data["events"]
    assert {tenant.account_id, other_tenant.account_id} <= {e["account_id"] for e in everything}
    assert server_cli(server, "audit", "--limit", "0").rc == 2


def test_tenant_sees_the_desks_booking_change_on_the_booking_and_its_runs_and_only_its_own(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    run_id = create_run(tenant)
    tenant.set_booking_state(tenant.booking_id, "revoked")

    run = tenant.api("GET", f"/v1/runs/{run_id}")["data"]
    desk_events = [e for e in run["events"] if e["kind"] == "desk"]
    assert len(desk_events) == 1
    assert desk_events[0]["data"] == {
        "booking_id": tenant.booking_id,
        "booking_from_state": "completed",
        "booking_to_state": "revoked",
    }
    shown = tenant.ito("runs", "show", run_id).data
    assert any(e["kind"] == "desk" for e in shown["events"])

    on_booking = tenant.api("GET", f"/v1/bookings/{tenant.booking_id}/events")["data"]["events"]
    assert [e["action"] for e in on_booking] == ["booking.set_state", "booking.create"]
    assert on_booking[0]["details"] == {"to_state": "revoked", "from_state": "completed"}
    assert all(e["actor"] == "desk" and "actor_key_id" not in e for e in on_booking)

    for key in ("requester", "approver"):
        feed = tenant.api("GET", "/v1/account/events", key=key)["data"]["events"]
        actions = [(e["action"], e["target_kind"]) for e in feed]
        assert ("booking.set_state", "booking") in actions
        assert actions.count(("key.create", "key")) == 2  # the requester and approver keys
        assert all(e["target_id"] != other_tenant.booking_id for e in feed)

    other_feed = other_tenant.api("GET", "/v1/account/events")["data"]["events"]
    assert tenant.booking_id not in {e["target_id"] for e in other_feed}
    assert all(e["target_id"] != tenant.booking_id for e in other_feed)
    foreign = other_tenant.api("GET", f"/v1/bookings/{tenant.booking_id}/events")
    assert foreign["error"]["code"] == "booking_not_found"
    foreign_run = other_tenant.api("GET", f"/v1/runs/{run_id}/events")
    assert foreign_run["error"]["code"] == "run_not_found"
