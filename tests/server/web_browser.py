"""Helpers for the device-login and web-page tests: an approver made through the real
``ito-server user create`` CLI, a cookie-keeping HTTP "browser" that fills the real forms
(CSRF field included), token polling at the server's interval, and a second server process for
settings the session server does not have."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support import ITO_SERVER, Server

CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]*)"')


def csrf_field(html: str) -> str:
    match = CSRF_FIELD.search(html)
    assert match, "the page has no CSRF field"
    return match.group(1)


@dataclass
class Approver:
    email: str
    password: str
    user_id: str
    principal_id: str


def user_create(
    server: Server, account_id: str, email: str, password: str, role: str = "approver", *extra: str
) -> tuple[int, dict[str, Any], str]:
    """``ito-server user create … --password-stdin --json``: (exit code, envelope, all output)."""
    proc = subprocess.run(
        [
            ITO_SERVER,
            "user",
            "create",
            "--account",
            account_id,
            "--role",
            role,
            "--email",
            email,
            "--password-stdin",
            *extra,
            "--json",
        ],
        env=server.env,
        input=password + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout), proc.stdout + proc.stderr


def make_approver(server: Server, account_id: str) -> Approver:
    email = f"approver-{uuid.uuid4().hex[:10]}@example.test"
    password = "pw-" + uuid.uuid4().hex
    rc, envelope, output = user_create(server, account_id, email, password)
    assert rc == 0 and envelope["ok"], output
    assert password not in output
    return Approver(
        email=email,
        password=password,
        user_id=envelope["data"]["user_id"],
        principal_id=envelope["data"]["principal_id"],
    )


class Browser:
    """Keeps cookies like a browser and never follows redirects on its own."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, follow_redirects=False, timeout=30)

    def close(self) -> None:
        self.client.close()

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def post(self, path: str, data: dict[str, str], **kwargs: Any) -> httpx.Response:
        return self.client.post(path, data=data, **kwargs)

    def sign_in(self, email: str, password: str, next_url: str | None = None) -> httpx.Response:
        page = self.get("/ui/login", params={"next": next_url} if next_url else None)
        assert page.status_code == 200
        return self.post(
            "/ui/login",
            {
                "email": email,
                "password": password,
                "csrf_token": csrf_field(page.text),
                "next": next_url or "",
            },
        )

    def session_cookie(self) -> str | None:
        return self.client.cookies.get("ito_session")

    def decide_device(self, user_code: str, decision: str) -> httpx.Response:
        page = self.get("/ui/device", params={"user_code": user_code})
        assert page.status_code == 200, page.text
        return self.post(
            "/ui/device",
            {"user_code": user_code, "decision": decision, "csrf_token": csrf_field(page.text)},
        )


@contextmanager
def browser(url: str) -> Iterator[Browser]:
    b = Browser(url)
    try:
        yield b
    finally:
        b.close()


def signed_in(server: Server, approver: Approver) -> Browser:
    b = Browser(server.url)
    response = b.sign_in(approver.email, approver.password)
    assert response.status_code == 303, response.text
    return b


def device_code(url: str, client_name: str | None = "test device") -> dict[str, Any]:
    response = httpx.post(url + "/v1/device/code", json={"client_name": client_name}, timeout=30)
    assert response.status_code == 200, response.text
    return dict(response.json()["data"])


def poll(url: str, code: str) -> httpx.Response:
    return httpx.post(url + "/v1/device/token", json={"device_code": code}, timeout=30)


def error_code(response: httpx.Response) -> str | None:
    envelope = response.json()
    return None if envelope["ok"] else str(envelope["error"]["code"])


def poll_until_decided(url: str, grant: dict[str, Any], timeout: float = 30.0) -> httpx.Response:
    """Poll as a well-behaved device does (waiting the interval between polls) until the
    answer is anything but ``authorization_pending``."""
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(grant["interval"])  # RFC 8628 §3.5: the device waits the interval
        response = poll(url, grant["device_code"])
        if error_code(response) != "authorization_pending":
            return response
        assert time.monotonic() < deadline, "still pending at the deadline"
