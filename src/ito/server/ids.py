"""Public identifiers: a short type prefix and 20 random base32 characters (``run_…``)."""

from __future__ import annotations

import base64
import secrets

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    body = base64.b32encode(secrets.token_bytes(15)).decode().lower()
    return f"{prefix}_{body}"
