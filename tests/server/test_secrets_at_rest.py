"""Nothing secret at rest or in logs (real ``ito-server`` processes): a key misplaced in a query
string or path never reaches the server's log, headers are never logged, no log line holds a raw
control character, and every file the server creates is private — the SQLite database and its
siblings 0600 even inside an ``$ITO_HOME`` that already existed open to others, which is
tightened to 0700 at start with a warning."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support import ITO_SERVER, Server, Tenant, run_cli, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _log_after(server: Server, marker: str) -> str:
    """The server's log once the request for ``marker`` has been logged (lines are written in
    order, so every earlier request's line is there too)."""
    httpx.get(server.url + f"/v1/{marker}", timeout=30)

    def logged() -> str | None:
        text = server.log_path.read_text(errors="replace")
        return text if marker in text else None

    return str(wait_until(logged, timeout=30))


def test_a_key_sent_anywhere_in_a_request_never_reaches_the_log(tenant: Tenant) -> None:
    key = tenant.requester_key
    secret = key.split("_", 3)[3]
    url = tenant.server.url
    answers = [
        httpx.get(url + "/v1/runs", params={"api_key": key}, timeout=30),
        httpx.get(url + "/v1/runs", params={"token": key, "limit": "5"}, timeout=30),
        httpx.get(url + f"/v1/runs/{key}", timeout=30),
        httpx.get(url + "/v1/runs", headers={"authorization": f"Bearer {key}"}, timeout=30),
        httpx.get(
            url + "/v1/me",
            params={"access_token": secret},
            timeout=30,
            headers={"authorization": f"Bearer {key}"},
        ),
    ]
    assert all(r.status_code < 500 for r in answers)
    log = _log_after(tenant.server, f"marker-{uuid.uuid4().hex}")
    assert "/v1/runs" in log  # the requests were logged...
    assert secret not in log and secret[:12] not in log and secret[-12:] not in log
    assert "Bearer" not in log  # ...and no header was


def test_no_log_line_holds_a_raw_control_character(server: Server) -> None:
    for path in (
        "/v1/runs/a%00b",
        "/v1/runs/a%0aFAKE%20LINE",
        "/v1/bookings/%1b%5b31m",
        "/v1/runs?booking_id=%E2%80%AEevil",
        "/ui/confirmations/x%0d%0aInjected",
    ):
        response = httpx.get(
            server.url + path, timeout=30, headers={"authorization": f"Bearer {server.desk_key}"}
        )
        assert response.status_code < 500
    log = _log_after(server, f"marker-{uuid.uuid4().hex}")
    for line in log.splitlines():
        assert not any(
            (ord(c) < 32 and c != "\t")
            or 0x7F <= ord(c) <= 0x9F
            or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
            for c in line
        ), repr(line)
    assert "FAKE LINE" not in [line.strip() for line in log.splitlines()]
    assert not any(line.startswith("Injected") for line in log.splitlines())


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)
def test_the_database_and_its_siblings_are_private_in_a_home_open_to_others(
    backend_url: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    srv = start_server(f"sqlite:///{home / 'ito.db'}", home)
    try:
        # A write, so that the write-ahead log and its index exist while the server runs.
        srv.desk("/v1/desk/accounts", {"name": "private"})
        assert _mode(home) == 0o700
        files = [p for p in home.iterdir() if p.name.startswith("ito.db")]
        assert {p.name for p in files} >= {"ito.db", "ito.db-wal", "ito.db-shm"}
        for path in [*files, *home.glob("*pepper*")]:
            assert _mode(path) == 0o600, path
    finally:
        stop_server(srv)


def test_a_world_open_home_and_database_are_tightened_at_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    database = home / "ito.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    env |= {"ITO_HOME": str(home)}  # the embedded default: SQLite under $ITO_HOME
    first = run_cli([ITO_SERVER, "migrate", "--json"], env)
    assert first.rc == 0, first.stderr
    os.chmod(home, 0o777)
    os.chmod(database, 0o644)
    again = run_cli([ITO_SERVER, "migrate", "--json"], env)
    assert again.rc == 0 and again.envelope is not None and again.envelope["ok"]
    assert _mode(home) == 0o700
    assert _mode(database) == 0o600
    assert str(home) in again.stderr and str(database) in again.stderr  # warned, once each
    assert _mode(home / "server-pepper") == 0o600
