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
}
LIFECYCLE = {
    "ito_logs": "logs",
    "ito_metrics": "metrics",
    "ito_checkpoints": "checkpoints",
    "ito_cancel": "cancel",
    "ito_cleanup": "cleanup",
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
    }
    assert not contacted()


def test_lifecycle_tools_without_a_client_operation_are_capability_unavailable_and_send_nothing(
    silent_api: SilentApi,
) -> None:
    env, contacted = silent_api
    arguments = {
        "ito_logs": {"run": "run_x"},
        "ito_metrics": {"run": "run_x"},
        "ito_checkpoints": {"run": "run_x"},
        "ito_cancel": {"run": "run_x", "confirmation_ref": "c", "idempotency_key": "k"},
        "ito_cleanup": {"run": "run_x", "confirmation_ref": "c", "idempotency_key": "k"},
    }

    async def script(mcp: Mcp) -> dict[str, Call]:
        return {name: await mcp.call(name, **args) for name, args in arguments.items()}

    results = with_mcp(env, script)
    missing = {tool for tool, op in LIFECYCLE.items() if not hasattr(Operations, op)}
    for tool, result in results.items():
        if tool in missing:
            assert result.code == "capability_unavailable", result.envelope
            assert result.envelope["live_api_contacted"] is False
        else:
            # The runtime added the operation: the tool is live now and no longer refuses.
            assert result.code != "capability_unavailable"
    if missing == set(LIFECYCLE):
        assert not contacted()


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
    assert tenant.counts()["runs"] == 1


@pytest.mark.slow
def test_status_of_an_unknown_idempotency_key_is_run_not_found(tenant: Tenant) -> None:
    async def script(mcp: Mcp) -> Call:
        return await mcp.call("ito_status", idempotency_key="mcp-never-used")

    result = with_mcp(tenant_env(tenant, tenant.requester_key), script)
    assert result.code == "run_not_found"
    assert result.envelope["live_api_contacted"] is True
