"""Client configuration, from the environment only (never from arguments: no secret there).

``ITO_API_URL`` (default ``http://127.0.0.1:8000``), ``ITO_CONNECT_TIMEOUT`` (seconds,
default 5) and ``ITO_TIMEOUT`` (overall deadline of one request in seconds, default 30). The
credential is resolved separately (:mod:`ito.client.credentials`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ito.core.errors import ItoError

__all__ = ["ClientConfig", "load_config"]

DEFAULT_API_URL = "http://127.0.0.1:8000"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    connect_timeout: float
    timeout: float


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ItoError("client_not_configured", f"{name} must be a number of seconds") from None
    if not 0 < value <= 3600:
        raise ItoError("client_not_configured", f"{name} must be within (0, 3600] seconds")
    return value


def load_config() -> ClientConfig:
    url = os.environ.get("ITO_API_URL") or DEFAULT_API_URL
    if not url.startswith(("http://", "https://")):
        raise ItoError("client_not_configured", "ITO_API_URL must be an http(s) URL")
    connect = _seconds("ITO_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT)
    overall = _seconds("ITO_TIMEOUT", DEFAULT_TIMEOUT)
    return ClientConfig(api_url=url.rstrip("/"), connect_timeout=connect,
                        timeout=max(overall, connect))
