"""``ito-mcp`` shares the client's id checks: no tool argument can steer a request to another
endpoint (approval is never a tool, not even through a crafted run id), against the real server
on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.mcp.test_mcp_tools import Call, Mcp, tenant_env, with_mcp
from tests.support import Tenant

pytestmark = pytest.mark.slow


def test_a_crafted_run_id_reaches_nothing(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    ).data["confirmation_ref"]
    before = tenant.counts()
    crafted = f"../confirmations/{ref}/approve#"
    action = {"confirmation_ref": "cfr_" + "a" * 24, "idempotency_key": "k-1"}
    calls: list[tuple[str, dict[str, Any]]] = [
        ("ito_cancel", {"run": crafted, **action}),
        ("ito_cleanup", {"run": crafted, **action}),
        ("ito_status", {"run": crafted}),
        ("ito_runs", {"run": crafted}),
        ("ito_logs", {"run": crafted}),
        ("ito_metrics", {"run": crafted}),
        ("ito_checkpoints", {"run": crafted}),
    ]

    async def script(mcp: Mcp) -> list[Call]:
        return [await mcp.call(name, **arguments) for name, arguments in calls]

    # The worst case: the MCP process holds an approver key.
    for (name, _), result in zip(
        calls, with_mcp(tenant_env(tenant, tenant.approver_key), script), strict=True
    ):
        assert result.code == "invalid_arguments", (name, result.envelope)
        assert result.envelope["live_api_contacted"] is False, name
        assert crafted not in result.text
    assert tenant.counts() == before
    assert tenant.api("GET", f"/v1/confirmations/{ref}")["data"]["state"] == "pending"
