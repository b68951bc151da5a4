"""Helpers for driving the web pages in a real headless Chromium through Playwright: Debian's
``/usr/bin/chromium`` (installed by ``scripts/test``; never a browser downloaded by
``playwright install``), a page wrapper that signs in and submits the real forms by clicking
their buttons, and ``ito login --no-browser`` as a real process whose user code is read from
what it prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, Playwright, Response

from tests.support import ITO, Tenant, wait_until

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking switches Chromium's own connections are refused on a
# closed network; the pages need none of them.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USER_CODE = re.compile(r"code ([A-Z0-9]{4}-[A-Z0-9]{4})")
VERIFICATION_URL = re.compile(r"\(or open (\S+)\)")


def launch_chromium(playwright: Playwright) -> Browser:
    """Debian's Chromium; missing is a failure, not a skip (CI installs it)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
    )


@dataclass
class WebPage:
    """One Chromium tab on the server; remembers the HTML of every document it was served,
    so a test can check that no secret was ever in it."""

    page: Page
    base_url: str
    served: list[str] = field(default_factory=list)

    def _record(self, response: Response | None) -> Response:
        assert response is not None, "no document was loaded"
        self.served.append(response.text())
        self.served.append(self.page.content())
        return response

    def goto(self, path: str) -> Response:
        return self._record(self.page.goto(self.base_url + path))

    def submit(self, button: Locator) -> Response:
        """Click a form's submit button; the document it leads to (after redirects)."""
        with self.page.expect_navigation() as navigation:
            button.click()
        return self._record(navigation.value)

    def button(self, decision: str) -> Locator:
        return self.page.locator(f"main form button[name=decision][value={decision}]")

    def path(self) -> str:
        return self.page.url.removeprefix(self.base_url)

    def fill_sign_in(self, email: str, password: str) -> Response:
        """Fill the sign-in form this tab shows and submit it."""
        self.page.locator("#email").fill(email)
        self.page.locator("#password").fill(password)
        return self.submit(self.page.locator("main form[action='/ui/login'] button[type=submit]"))

    def sign_in(self, email: str, password: str) -> Response:
        page = self.goto("/ui/login")
        assert page.status == 200
        return self.fill_sign_in(email, password)

    def sign_out(self) -> Response:
        return self.submit(self.page.locator("header form[action='/ui/logout'] button"))


@dataclass
class LoginProcess:
    """``ito login --no-browser --json`` running; its output goes to files so that reading the
    announced code never blocks."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def _announced(self, pattern: re.Pattern[str]) -> str:
        def found() -> str | None:
            match = pattern.search(self.stderr.read_text())
            if match is None:
                assert self.process.poll() is None, (
                    "ito login ended early:\n" + self.stderr.read_text() + self.stdout.read_text()
                )
            return match.group(1) if match else None

        return str(wait_until(found, timeout=60))

    def user_code(self) -> str:
        return self._announced(USER_CODE)

    def verification_url(self) -> str:
        return self._announced(VERIFICATION_URL)

    def finish(self, timeout: float = 60) -> tuple[int, dict[str, Any]]:
        rc = self.process.wait(timeout=timeout)
        return rc, json.loads(self.stdout.read_text())


def client_env(tenant: Tenant, home: Path) -> dict[str, str]:
    """A client with no API key: only what ``ito login`` stores, in a private file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    return env | {
        "ITO_API_URL": tenant.server.url,
        "ITO_HOME": str(home),
        "ITO_ALLOW_FILE_TOKEN": "1",
    }


@contextmanager
def ito_login(env: dict[str, str], directory: Path) -> Iterator[LoginProcess]:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stdout, stderr = directory / "login.stdout", directory / "login.stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [ITO, "login", "--no-browser", "--json"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    try:
        yield LoginProcess(process, stdout, stderr)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
