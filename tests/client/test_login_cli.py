"""``ito login`` / ``auth`` / ``logout`` as real processes against a real server: the device code
is approved through the server's real web form (cookie + CSRF), the token lands in a private
file (``ITO_ALLOW_FILE_TOKEN=1``) or the keyring, and logout revokes remotely before deleting."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.server.web_browser import make_approver, signed_in
from tests.support import ITO, Tenant, run_cli

pytestmark = pytest.mark.slow
USER_CODE = re.compile(r"code ([A-Z0-9]{4}-[A-Z0-9]{4})")


def _client_env(tenant: Tenant, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    return env | {"ITO_API_URL": tenant.server.url, "ITO_HOME": str(home)} | extra


def _login(tenant: Tenant, env: dict[str, str], decision: str = "approve"):  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        [ITO, "login", "--no-browser", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    announced = ""
    while not USER_CODE.search(announced):
        line = proc.stderr.readline()
        assert line, "ito login ended without showing a user code"
        announced += line
    code = USER_CODE.search(announced).group(1)  # type: ignore[union-attr]
    approver = make_approver(tenant.server, tenant.account_id)
    browser = signed_in(tenant.server, approver)
    try:
        assert browser.decide_device(code, decision).status_code in (200, 303)
    finally:
        browser.close()
    stdout, _ = proc.communicate(timeout=60)
    return proc.returncode, json.loads(stdout)


def test_login_stores_a_private_token_and_logout_revokes_it(tenant: Tenant, tmp_path: Path) -> None:
    env = _client_env(tenant, tmp_path / "home", ITO_ALLOW_FILE_TOKEN="1")
    rc, envelope = _login(tenant, env)
    assert rc == 0 and envelope["ok"], envelope
    assert envelope["data"]["stored_in"] == "file"
    token_files = list((tmp_path / "home" / "credentials").glob("*.token"))
    assert len(token_files) == 1
    assert token_files[0].stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "home" / "credentials").stat().st_mode & 0o777 == 0o700
    token = token_files[0].read_text().strip()
    assert token not in json.dumps(envelope)

    auth = run_cli([ITO, "auth", "--json"], env)
    assert auth.rc == 0 and auth.data["role"] == "requester"
    assert auth.data["account_id"] == tenant.account_id

    out = run_cli([ITO, "logout", "--json"], env)
    assert out.rc == 0 and out.data["logged_out"] is True
    assert not token_files[0].exists()
    # The token is dead on the server too, not just forgotten here.
    revoked = run_cli([ITO, "auth", "--json"], env | {"ITO_API_KEY": token})
    assert revoked.rc == 1 and revoked.code == "credential_revoked"
    assert run_cli([ITO, "auth", "--json"], env).code == "not_authenticated"


def test_denied_login_stores_nothing(tenant: Tenant, tmp_path: Path) -> None:
    env = _client_env(tenant, tmp_path / "home", ITO_ALLOW_FILE_TOKEN="1")
    rc, envelope = _login(tenant, env, decision="deny")
    assert rc == 1 and envelope["error"]["code"] == "access_denied"
    assert not list((tmp_path / "home").rglob("*.token"))


def test_logout_keeps_the_token_when_remote_revocation_fails(
    tenant: Tenant, tmp_path: Path
) -> None:
    env = _client_env(tenant, tmp_path / "home", ITO_ALLOW_FILE_TOKEN="1")
    rc, _ = _login(tenant, env)
    assert rc == 0
    stored = next((tmp_path / "home" / "credentials").glob("*.token"))
    tenant.server.process.send_signal(signal.SIGSTOP)  # the API stops answering
    try:
        out = run_cli(
            [ITO, "logout", "--json"], env | {"ITO_TIMEOUT": "2", "ITO_CONNECT_TIMEOUT": "1"}
        )
    finally:
        tenant.server.process.send_signal(signal.SIGCONT)
    assert out.rc == 1 and out.code in ("transport_ambiguous", "transport_unreachable")
    assert stored.exists()  # kept: the client cannot know the server revoked it


def test_auth_rejects_no_browser_and_never_logs_in(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    result = run_cli([ITO, "auth", "--no-browser", "--json"], env | {"ITO_HOME": str(tmp_path)})
    assert result.rc == 2 and result.code == "invalid_arguments"
    plain = run_cli(
        [ITO, "auth", "--json"],
        env | {"ITO_HOME": str(tmp_path), "ITO_API_URL": "http://127.0.0.1:9"},
    )
    assert plain.rc == 1 and plain.code == "not_authenticated"
    assert plain.envelope is not None and plain.envelope["live_api_contacted"] is False


def test_revoked_login_token_stops_status_at_once(tenant: Tenant, tmp_path: Path) -> None:
    env = _client_env(tenant, tmp_path / "home", ITO_ALLOW_FILE_TOKEN="1")
    rc, envelope = _login(tenant, env)
    assert rc == 0
    prefix = envelope["data"]["key_prefix"]
    with tenant.server.engine.connect() as conn:
        from sqlalchemy import text

        key_id = conn.execute(
            text("SELECT id FROM api_keys WHERE prefix = :p"), {"p": prefix}
        ).scalar_one()
    tenant.server.desk(f"/v1/desk/keys/{key_id}/revoke", {})
    for args in (["status"], ["runs", "list"], ["runs", "watch", "run_" + "a" * 24]):
        result = run_cli([ITO, *args, "--json"], env, timeout=30)
        assert result.rc == 1 and result.code == "credential_revoked", args
