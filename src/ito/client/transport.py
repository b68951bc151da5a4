"""HTTP to the canonical API with a bounded connect timeout and a bounded overall deadline
(DESIGN §6.2), and an honest account of whether anything reached it.

* The connection failed before any byte was sent → ``transport_unreachable``,
  ``live_api_contacted = false``.
* Anything after the request may have left (timeout, reset, garbled answer) → the request may
  have been applied: ``transport_ambiguous`` for mutations, ``transport_timeout`` for reads,
  ``live_api_contacted = true``.
* An error envelope from the API → :class:`ApiRefusal` carrying it unchanged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from ito import __version__
from ito.client.config import ClientConfig
from ito.core.errors import ItoError

__all__ = ["ApiClient", "ApiRefusal", "TransportFailure"]


class TransportFailure(Exception):
    def __init__(self, error: ItoError, *, live_api_contacted: bool) -> None:
        super().__init__(error.code)
        self.error = error
        self.live_api_contacted = live_api_contacted


@dataclass
class ApiRefusal(Exception):
    envelope: dict[str, Any]

    @property
    def code(self) -> str:
        return str(self.envelope.get("error", {}).get("code", "internal_error"))


class ApiClient:
    def __init__(self, config: ClientConfig, token: str | None) -> None:
        self.config = config
        self.token = token

    def request(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                params: dict[str, Any] | None = None, mutation: bool = False) -> dict[str, Any]:
        """The API's ok envelope, or raise ApiRefusal / TransportFailure."""
        return asyncio.run(self._send(method, path, json, content, params, mutation))

    async def _send(self, method: str, path: str, json: Any, content: bytes | None,
                    params: dict[str, Any] | None, mutation: bool) -> dict[str, Any]:
        cfg = self.config
        headers = {"user-agent": f"ito/{__version__}", "accept": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        if content is not None:
            headers["content-type"] = "application/octet-stream"
        timeout = httpx.Timeout(cfg.timeout, connect=cfg.connect_timeout)
        try:
            async with httpx.AsyncClient(base_url=cfg.api_url, timeout=timeout,
                                         follow_redirects=False, trust_env=False) as client:
                response = await asyncio.wait_for(
                    client.request(method, path, json=json, content=content, params=params,
                                   headers=headers),
                    timeout=cfg.timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol,
                httpx.PoolTimeout):
            raise TransportFailure(ItoError("transport_unreachable"),
                                   live_api_contacted=False) from None
        except (TimeoutError, httpx.TimeoutException):
            code = "transport_ambiguous" if mutation else "transport_timeout"
            raise TransportFailure(ItoError(code), live_api_contacted=True) from None
        except httpx.HTTPError:
            code = "transport_ambiguous" if mutation else "transport_timeout"
            raise TransportFailure(ItoError(code, "the connection broke after the request was "
                                            "sent"), live_api_contacted=True) from None
        try:
            body = response.json()
            ok = body["ok"]
        except (ValueError, KeyError, TypeError):
            code = "transport_ambiguous" if mutation else "transport_timeout"
            raise TransportFailure(ItoError(code, "the API's answer was not an envelope"),
                                   live_api_contacted=True) from None
        if not ok:
            raise ApiRefusal(body)
        if not isinstance(body, dict):
            raise TransportFailure(ItoError("transport_timeout"), live_api_contacted=True)
        return body
