"""The JSON envelope every API response, ``--json`` output and MCP result uses (DESIGN §4)."""

from __future__ import annotations

from typing import Any

from ito.core.errors import ItoError

__all__ = ["error_envelope", "ok_envelope"]


def ok_envelope(data: Any, notice: str, *, live_api_contacted: bool = True) -> dict[str, Any]:
    return {"ok": True, "live_api_contacted": live_api_contacted, "notice": notice, "data": data}


def error_envelope(
    error: ItoError, notice: str | None = None, *, live_api_contacted: bool
) -> dict[str, Any]:
    if notice is None:
        notice = (
            "the API refused the request; nothing was created or changed"
            if live_api_contacted
            else "nothing was sent"
        )
    return {
        "ok": False,
        "live_api_contacted": live_api_contacted,
        "notice": notice,
        "error": error.to_error_body(),
    }
