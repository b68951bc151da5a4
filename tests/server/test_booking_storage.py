"""The desk cannot record a booking whose checkpoint storage no worker may write — the file
system's root, a system directory, an ill-formed or relative URI, a scheme no backend writes —
through the API or ``ito-server booking create``; the refusal creates nothing (DESIGN §5.2,
§5.8 gate 5), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.support import ITO_SERVER, Server, Tenant

pytestmark = pytest.mark.slow

BAD = {
    "filesystem-root": "file:///",
    "etc": "file:///etc",
    "inside-usr": "file:///usr/lib/ito",
    "proc": "file:///proc/self/cwd",
    "var-lib": "file:///var/lib",
    "relative": "file:storage",
    "no-scheme": "/srv/ito/storage",
    "dotdot": "file:///srv/ito/../../etc",
    "s3": "s3://bucket/bkg",
}


def _bookings(server: Server) -> int:
    with server.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM bookings")).scalar_one())


def _body(tenant: Tenant, storage_uri: str) -> dict[str, Any]:
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
        "storage_uri": storage_uri,
        "storage_quota_gb": 10.0,
        "state": "completed",
    }


def test_the_desk_api_refuses_unusable_booking_storage_and_creates_nothing(
    tenant: Tenant,
) -> None:
    server = tenant.server
    before = _bookings(server)
    for name, uri in BAD.items():
        response = httpx.post(
            server.url + "/v1/desk/bookings",
            json=_body(tenant, uri),
            timeout=30,
            headers={"authorization": f"Bearer {server.desk_key}"},
        )
        envelope = response.json()
        assert response.status_code == 422 and not envelope["ok"], (name, envelope)
        assert envelope["error"]["code"] == "checkpoint_storage_invalid", (name, envelope)
        assert _bookings(server) == before, name
    accepted = server.desk(
        "/v1/desk/bookings", _body(tenant, f"file://{tenant.workdir}/other-storage")
    )
    assert accepted["storage_uri"] == f"file://{tenant.workdir}/other-storage"
    assert _bookings(server) == before + 1


def test_booking_create_on_the_command_line_refuses_unusable_storage_and_creates_nothing(
    tenant: Tenant,
) -> None:
    server = tenant.server
    before = _bookings(server)
    body = _body(tenant, "")
    argv = [
        ITO_SERVER,
        "booking",
        "create",
        "--account",
        tenant.account_id,
        "--gpu",
        "cpu",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--region",
        "local",
        "--fabric",
        "ethernet",
        "--start",
        body["start"],
        "--end",
        body["end"],
        "--rate-usd-per-gpu-hour",
        "0.5",
        "--json",
    ]
    for name, uri in {k: BAD[k] for k in ("filesystem-root", "etc", "relative", "s3")}.items():
        result = subprocess.run(
            [*argv, "--storage-uri", uri],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        assert json.loads(result.stdout)["error"]["code"] == "checkpoint_storage_invalid", name
        assert _bookings(server) == before, name
    ok = subprocess.run(
        [*argv, "--storage-uri", f"file://{tenant.workdir}/cli-storage"],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert _bookings(server) == before + 1
