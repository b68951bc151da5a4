"""``ito-mcp`` as a real process, driven by the official SDK's stdio client (DESIGN §6.4): the
tool list, the same envelope in every result, refusals before anything is sent, and the gated
flow confirm → (human approval, out of band) → train → status against the real server on
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from ito.client.operations import Operations
from ito.core.api_requests import ConfirmationRequest, RunActionBody, RunCreateBody
from ito.mcp.server import TOOLS, run_tool
from tests.support import BIN, Tenant

ITO_MCP = str(BIN / "ito-mcp")
EXPECTED_TOOLS = {
    "ito_auth",
    "ito_status",
    "ito_plan",
    "ito_confirm",
    "ito_train",
    "ito_runs",
    "ito_logs",
    "ito_metrics",
    "ito_checkpoints",
    "ito_cancel",
    "ito_cleanup",
    "ito_restart",
    "ito_raise_bound",
    "ito_telemetry",
    "ito_bookings",
}
_T = TypeVar("_T")


@dataclass
class Call:
    """One tool result: the envelope from its text content, checked against the structured one."""

    envelope: dict[str, Any]
    is_error: bool
    text: str

    @property
    def code(self) -> str | None:
        return None if self.envelope["ok"] else str(self.envelope["error"]["code"])

    @property
    def data(self) -> dict[str, Any]:
        assert self.envelope["ok"], self.envelope
        return dict(self.envelope["data"])


class Mcp:
    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, name: str, **arguments: Any) -> Call:
        result = await self.session.call_tool(name, arguments)
        assert len(result.content) == 1 and result.content[0].type == "text"
        text = result.content[0].text
        envelope = json.loads(text)
        assert set(envelope) >= {"ok", "live_api_contacted", "notice"}
        assert ("data" in envelope) is envelope["ok"]
        assert ("error" in envelope) is not envelope["ok"]
        assert result.structured_content == envelope
        assert result.is_error is (not envelope["ok"])
        return Call(envelope, result.is_error, text)


def with_mcp(env: dict[str, str], script: Callable[[Mcp], Awaitable[_T]]) -> _T:
    """Start ``ito-mcp`` over stdio with ``env``, initialize, run ``script``, shut down."""

    async def main() -> _T:
        params = StdioServerParameters(command=ITO_MCP, env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            info = await session.initialize()
            assert info.server_info.name == "ito-mcp"
            return await script(Mcp(session))

    return asyncio.run(main())


def tenant_env(tenant: Tenant, key: str | None) -> dict[str, str]:
    # A private token-file store under the tenant's empty ITO_HOME: no stored login exists, so
    # the only credential is ITO_API_KEY when given.
    return tenant.env(key) | {"ITO_ALLOW_FILE_TOKEN": "1"}


SilentApi = tuple[dict[str, str], Callable[[], bool]]


@pytest.fixture
def silent_api(tmp_path: Path) -> Iterator[SilentApi]:
    """An API URL on a loopback socket that listens but never answers, and a probe that says
    whether anything ever connected to it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    env |= {
        "ITO_API_URL": f"http://127.0.0.1:{port}",
        "ITO_HOME": str(tmp_path / "home"),
        "ITO_ALLOW_FILE_TOKEN": "1",
        "ITO_API_KEY": "not-a-real-key",
        "ITO_TIMEOUT": "2",
        "ITO_CONNECT_TIMEOUT": "1",
    }

    def contacted() -> bool:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    yield env, contacted
    listener.close()


# --- no API needed ---------------------------------------------------------------------------


def test_tool_list_is_exactly_the_design_set_and_offers_no_approval(silent_api: SilentApi) -> None:
    env, contacted = silent_api

    async def script(mcp: Mcp) -> list[Any]:
        return list((await mcp.session.list_tools()).tools)

    tools = with_mcp(env, script)
    names = {tool.name for tool in tools}
    assert names == EXPECTED_TOOLS
    for tool in tools:
        assert not any(word in tool.name for word in ("approve", "reject", "decide"))
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False
        assert tool.output_schema is not None
        assert tool.output_schema["required"] == ["ok", "live_api_contacted", "notice"]
    by_name = {tool.name: tool for tool in tools}
    assert set(by_name["ito_train"].input_schema["required"]) == {
        "booking",
        "manifest",
        "confirmation_ref",
        "idempotency_key",
    }
    assert set(by_name["ito_confirm"].input_schema["properties"]["action"]["enum"]) == {
        "train",
        "cancel",
        "cleanup",
        "restart",
        "raise-bound",
    }
    assert not contacted()


def test_a_tool_whose_operation_the_client_lacks_is_capability_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(Operations, "restart")
    envelope = asyncio.run(
        run_tool(
            "ito_restart",
            {"run": "run_" + "a" * 24, "confirmation_ref": "cfr_1", "idempotency_key": "k"},
        )
    )
    assert envelope["ok"] is False and envelope["error"]["code"] == "capability_unavailable"
    assert envelope["live_api_contacted"] is False


def test_every_tool_calls_an_operation_the_client_has() -> None:
    assert all(callable(getattr(Operations, spec.operation, None)) for spec in TOOLS)


def test_input_schemas_take_their_bounds_from_the_api_request_models() -> None:
    schemas = {spec.name: spec.input_schema() for spec in TOOLS}
    api = {
        model.__name__: model.model_json_schema()["properties"]
        for model in (ConfirmationRequest, RunActionBody, RunCreateBody)
    }

    def bounds(prop: dict[str, Any]) -> dict[str, Any]:
        variants = [v for v in prop.get("anyOf", [prop]) if v != {"type": "null"}]
        (only,) = variants
        return {k: v for k, v in only.items() if k not in ("title", "description", "default")}

    def own(prop: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in prop.items() if k != "description"}

    for tool in ("ito_cancel", "ito_cleanup", "ito_restart"):
        for field in ("confirmation_ref", "idempotency_key"):
            got = own(schemas[tool]["properties"][field])
            assert got == bounds(api["RunActionBody"][field]), (tool, field)
    train = schemas["ito_train"]["properties"]
    assert own(train["booking"]) == bounds(api["RunCreateBody"]["booking_id"])
    assert own(train["confirmation_ref"]) == bounds(api["RunCreateBody"]["confirmation_ref"])
    confirm = schemas["ito_confirm"]["properties"]
    api_confirm = api["ConfirmationRequest"]
    assert own(confirm["checkpoint"]) == bounds(api_confirm["checkpoint_step"])
    assert own(confirm["ttl_seconds"]) == bounds(api_confirm["ttl_seconds"])


def test_arguments_outside_the_schema_are_refused_before_anything_is_sent(
    silent_api: SilentApi,
) -> None:
    env, contacted = silent_api

    async def script(mcp: Mcp) -> list[Call]:
        return [
            await mcp.call("ito_runs", limit="ten"),
            await mcp.call("ito_runs", limit=True),
            await mcp.call("ito_runs", limit=0),
            await mcp.call("ito_status", colour="blue"),
            await mcp.call("ito_plan", booking="b"),
            await mcp.call("ito_confirm", action="approve", run="run_x"),
            await mcp.call("ito_approve", ref="c"),
            await mcp.call("ito_bookings", eligibility="yes"),
            await mcp.call("ito_logs", run="run_x", since="3"),
            await mcp.call("ito_restart", run="run_x", confirmation_ref="", idempotency_key="k"),
            await mcp.call("ito_confirm", action="restart", run="run_x", checkpoint=-1),
        ]

    for result in with_mcp(env, script):
        assert result.code == "invalid_arguments", result.envelope
        assert result.envelope["live_api_contacted"] is False
    assert not contacted()


def test_credentials_in_tool_arguments_are_refused_without_echo(silent_api: SilentApi) -> None:
    env, contacted = silent_api
    key = "ito_req_AbCdEfGh_" + "s3cr3t-value-that-must-not-leak-0123"

    async def script(mcp: Mcp) -> list[Call]:
        return [
            await mcp.call("ito_status", run=key),
            await mcp.call("ito_runs", booking=f"Bearer {key}"),
            await mcp.call("ito_auth", api_key="anything-at-all"),
            await mcp.call("ito_auth", token="anything-at-all"),
            await mcp.call("ito_status", **{key: "x"}),
        ]

    for result in with_mcp(env, script):
        assert result.code == "secret_in_arguments", result.envelope
        assert result.envelope["live_api_contacted"] is False
        assert "s3cr3t" not in result.text and "anything-at-all" not in result.text
    assert not contacted()


def test_server_imports_no_training_or_server_stack() -> None:
    heavy = {"torch", "transformers", "numpy", "sqlalchemy", "fastapi", "alembic", "psycopg"}
    code = (
        "import sys, ito.mcp.server; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"


# --- against the real server (SQLite and PostgreSQL) -----------------------------------------


@pytest.mark.slow
def test_auth_and_status_with_the_environment_key(tenant: Tenant) -> None:
    async def script(mcp: Mcp) -> tuple[Call, Call]:
        return await mcp.call("ito_auth"), await mcp.call("ito_status")

    auth, status = with_mcp(tenant_env(tenant, tenant.requester_key), script)
    assert auth.envelope["ok"] and auth.envelope["live_api_contacted"] is True
    assert auth.data["account_id"] == tenant.account_id
    assert status.envelope["ok"]


@pytest.mark.slow
def test_bookings_telemetry_and_restart_tools_reach_the_api(tenant: Tenant) -> None:
    run_id = tenant.train(tenant.manifest(), "mcp-restart-k")

    async def script(mcp: Mcp) -> dict[str, Call]:
        return {
            "bookings": await mcp.call("ito_bookings"),
            "one": await mcp.call("ito_bookings", booking=tenant.booking_id),
            "eligibility": await mcp.call(
                "ito_bookings", booking=tenant.booking_id, eligibility=True
            ),
            "telemetry": await mcp.call("ito_telemetry", run=run_id),
            "booking_telemetry": await mcp.call("ito_telemetry", booking=tenant.booking_id),
            "restart": await mcp.call(
                "ito_restart",
                run=run_id,
                confirmation_ref="cfr_" + "a" * 24,
                idempotency_key="mcp-restart-1",
            ),
        }

    out = with_mcp(tenant_env(tenant, tenant.requester_key), script)
    assert [b["booking_id"] for b in out["bookings"].data["bookings"]] == [tenant.booking_id]
    assert out["one"].data["booking_id"] == tenant.booking_id
    assert out["eligibility"].data["booking_id"] == tenant.booking_id
    assert out["telemetry"].data["run_id"] == run_id
    assert out["booking_telemetry"].data["booking_id"] == tenant.booking_id
    # A restart without an approved restart confirmation is the server's refusal, not the tool's.
    assert out["restart"].envelope["live_api_contacted"] is True
    assert out["restart"].code == "confirmation_not_found"


@pytest.mark.slow
def test_missing_credential_is_not_authenticated_and_sends_nothing(tenant: Tenant) -> None:
    manifest = tenant.manifest()

    async def script(mcp: Mcp) -> list[Call]:
        return [
            await mcp.call("ito_auth"),
            await mcp.call("ito_status"),
            await mcp.call("ito_plan", booking=tenant.booking_id, manifest=str(manifest)),
        ]

    for result in with_mcp(tenant_env(tenant, None), script):
        assert result.code == "not_authenticated", result.envelope
        assert result.envelope["live_api_contacted"] is False


@pytest.mark.slow
def test_plan_answers_and_creates_nothing(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    before = tenant.counts()

    async def script(mcp: Mcp) -> Call:
        return await mcp.call("ito_plan", booking=tenant.booking_id, manifest=str(manifest))

    plan = with_mcp(tenant_env(tenant, tenant.requester_key), script)
    assert plan.envelope["ok"] and plan.envelope["live_api_contacted"] is True
    assert plan.data["ready"] is True
    assert tenant.counts() == before


@pytest.mark.slow
def test_relative_manifest_path_is_refused_before_anything_is_sent(tenant: Tenant) -> None:
    before = tenant.counts()

    async def script(mcp: Mcp) -> list[Call]:
        return [
            await mcp.call("ito_plan", booking=tenant.booking_id, manifest="m/manifest.json"),
            await mcp.call(
                "ito_confirm", action="train", booking=tenant.booking_id, manifest="manifest.json"
            ),
            await mcp.call(
                "ito_train",
                booking=tenant.booking_id,
                manifest="./manifest.json",
                confirmation_ref="c",
                idempotency_key="mcp-relative",
            ),
        ]

    for result in with_mcp(tenant_env(tenant, tenant.requester_key), script):
        assert result.code == "manifest_path_not_absolute", result.envelope
        assert result.envelope["live_api_contacted"] is False
    assert tenant.counts() == before


@pytest.mark.slow
def test_confirm_then_human_approval_then_train_gives_one_run_found_by_its_key(
    tenant: Tenant,
) -> None:
    manifest = tenant.manifest()
    key = "mcp-flow-1"
    common = {"booking": tenant.booking_id, "manifest": str(manifest)}
    runs_after_refusal: list[int] = []

    async def script(mcp: Mcp) -> dict[str, Call]:
        out: dict[str, Call] = {}
        out["confirm"] = await mcp.call("ito_confirm", action="train", **common)
        ref = out["confirm"].data["confirmation_ref"]
        out["early"] = await mcp.call(
            "ito_train", confirmation_ref=ref, idempotency_key="mcp-too-early", **common
        )
        runs_after_refusal.append(tenant.counts()["runs"])
        # Approval is a human's act, out of band: the approver's own credential, not a tool.
        approved = tenant.api("POST", f"/v1/confirmations/{ref}/approve", key="approver")
        assert approved["ok"], approved
        out["train"] = await mcp.call(
            "ito_train", confirmation_ref=ref, idempotency_key=key, **common
        )
        out["replay"] = await mcp.call(
            "ito_train", confirmation_ref=ref, idempotency_key=key, **common
        )
        out["status"] = await mcp.call("ito_status", idempotency_key=key)
        out["runs"] = await mcp.call("ito_runs", booking=tenant.booking_id)
        out["one"] = await mcp.call("ito_runs", run=out["train"].data["run_id"])
        return out

    out = with_mcp(tenant_env(tenant, tenant.requester_key), script)
    assert out["confirm"].envelope["live_api_contacted"] is True
    assert out["early"].code == "confirmation_pending"
    assert runs_after_refusal == [0]
    run_id = out["train"].data["run_id"]
    assert out["train"].data["idempotency_key"] == key
    assert out["replay"].data["run_id"] == run_id
    assert out["status"].data["run_id"] == run_id
    assert [r["run_id"] for r in out["runs"].data["runs"]] == [run_id]
    assert out["one"].data["run_id"] == run_id
    # The run's stored stage plan and each stage's progress, the same as every other surface.
    plan = [s["name"] for s in out["one"].data["stage_plan"]["stages"]]
    assert plan == [
        "data_prep",
        *(s["stage"] for s in json.loads(manifest.read_bytes())["curriculum"]),
    ]
    assert [r["name"] for r in out["one"].data["progress"]] == plan
    assert {r["status"] for r in out["one"].data["progress"]} == {"pending"}
    assert tenant.counts()["runs"] == 1


@pytest.mark.slow
def test_status_of_an_unknown_idempotency_key_is_run_not_found(tenant: Tenant) -> None:
    async def script(mcp: Mcp) -> Call:
        return await mcp.call("ito_status", idempotency_key="mcp-never-used")

    result = with_mcp(tenant_env(tenant, tenant.requester_key), script)
    assert result.code == "run_not_found"
    assert result.envelope["live_api_contacted"] is True
