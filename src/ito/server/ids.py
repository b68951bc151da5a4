"""Public identifiers: a short type prefix and 24 random base32 characters (``run_…``); the
format is :mod:`ito.core.ids`, which the client checks ids against before using them."""

from __future__ import annotations

import base64
import secrets

from ito.core.ids import ID_RANDOM_BYTES

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    body = base64.b32encode(secrets.token_bytes(ID_RANDOM_BYTES)).decode().lower()
    return f"{prefix}_{body}"
