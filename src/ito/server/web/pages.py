"""Rendering of the web pages: one autoescaping Jinja2 environment, strict security headers,
and the HTML error page that stands in for the JSON envelope under ``/ui``.

Every value reaches a page through autoescaping; no page ever receives a secret (session id,
device code, token, password or pepper) — only the CSRF token, which is derived from the session
id by an HMAC and reveals nothing about it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ito.core.errors import ItoError

__all__ = ["DASHBOARD_HEADERS", "SECURITY_HEADERS", "error_page", "render"]

TEMPLATES = Path(__file__).parent / "templates"

SECURITY_HEADERS = {
    # No script at all; inline styles only; forms post only back here; never framed.
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # /ui/device?user_code=… must not travel to another site in a Referer header.
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
DASHBOARD_HEADERS = SECURITY_HEADERS | {
    # The dashboard's pages load one script of ours (/ui/static/dashboard.js, no inline
    # script) that re-fetches their live part from this origin.
    "content-security-policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
}


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(
    template: str, status: int = 200, *, headers: dict[str, str] | None = None, **context: Any
) -> HTMLResponse:
    context.setdefault("user", None)
    context.setdefault("csrf_token", "")
    html = _environment().get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=headers or SECURITY_HEADERS)


def error_page(
    error: ItoError, *, user: Any = None, csrf_token: str = "", sign_in_url: str | None = None
) -> HTMLResponse:
    """The page for a refusal: its stable code, its safe message, and the right status."""
    return render(
        "error.html",
        error.status,
        error=error,
        user=user,
        csrf_token=csrf_token,
        sign_in_url=sign_in_url,
    )
