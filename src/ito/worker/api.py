"""The worker's side of the worker API, over HTTP with a booking-bound worker key."""

from __future__ import annotations

import json
from typing import Any

import httpx

from ito.core.errors import REGISTRY, ItoError
from ito.core.text import escape_unsafe

__all__ = ["WorkerApi"]

REPORT_MAX_EVENTS = 2000
REPORT_MAX_BYTES = 1 << 20
"""Per report request; the server refuses bodies past ``max_request_bytes`` (4 MiB default)."""


class WorkerApi:
    def __init__(self, api_url: str, key: str, *, timeout: float = 30.0) -> None:
        self._client = httpx.Client(base_url=api_url.rstrip("/"), timeout=timeout,
                                    headers={"authorization": f"Bearer {key}"},
                                    trust_env=False)

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError:
            # Retryable: the caller decides how long a silent API may last (the lease TTL).
            raise ItoError("transport_timeout", "the API could not be reached") from None
        return self._envelope(response)

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        # Log lines and messages come from training code (ANSI colours, \r progress bars): the
        # API refuses control characters, so they travel as visible escapes instead.
        return self._request("POST", path, json=escape_unsafe(body or {}))

    def _get(self, path: str) -> Any:
        return self._request("GET", path)

    @staticmethod
    def _envelope(response: httpx.Response) -> Any:
        try:
            envelope = response.json()
        except ValueError:
            raise ItoError("internal_error", "the API's answer was not JSON") from None
        if not envelope.get("ok"):
            error = envelope.get("error", {})
            code = error.get("code", "internal_error")
            raise ItoError(code if code in REGISTRY else "internal_error",
                           error.get("message"))
        return envelope.get("data")

    def me(self) -> dict[str, Any]:
        return dict(self._get("/v1/me"))

    def lease(self) -> dict[str, Any] | None:
        data = self._post("/v1/worker/lease")
        return dict(data) if data else None

    def heartbeat(self, run_id: str, attempt: int) -> dict[str, Any]:
        return dict(self._post(f"/v1/worker/runs/{run_id}/heartbeat", {"attempt": attempt}))

    def report(self, run_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        """Send events in order, in batches well under the server's request bound."""
        batch: list[dict[str, Any]] = []
        size = 0
        for event in events:
            cost = len(json.dumps(event)) + 2
            if batch and (len(batch) >= REPORT_MAX_EVENTS or size + cost > REPORT_MAX_BYTES):
                self._post(f"/v1/worker/runs/{run_id}/report",
                           {"attempt": attempt, "events": batch})
                batch, size = [], 0
            batch.append(event)
            size += cost
        if batch:
            self._post(f"/v1/worker/runs/{run_id}/report", {"attempt": attempt, "events": batch})

    def finish(self, run_id: str, attempt: int, status: str, *, failure_code: str | None = None,
               message: str = "") -> dict[str, Any]:
        return dict(self._post(f"/v1/worker/runs/{run_id}/finish",
                               {"attempt": attempt, "status": status,
                                "failure_code": failure_code, "message": message}))

    def cleanups(self) -> list[dict[str, Any]]:
        return list(self._get("/v1/worker/cleanups")["cleanups"])

    def cleaned(self, run_id: str, bytes_freed: int, paths: list[str]) -> None:
        self._post(f"/v1/worker/runs/{run_id}/cleaned",
                   {"bytes_freed": bytes_freed, "paths": paths})
