"""The worker's side of the worker API, over the one HTTP transport (:mod:`ito.transport`)
with a booking-bound worker key. Every failure is an :class:`~ito.core.errors.ItoError`: an
API refusal with its code, a transport failure with a retryable ``transport_*`` code (the caller
decides how long a silent API may last: the lease TTL)."""

from __future__ import annotations

import json
from typing import Any

from ito.core.text import escape_unsafe
from ito.transport import DEFAULT_TIMEOUT, Transport

__all__ = ["WorkerApi"]

REPORT_MAX_EVENTS = 2000
REPORT_MAX_BYTES = 1 << 20
"""Per report request; the server refuses bodies past ``max_request_bytes`` (4 MiB default)."""


class WorkerApi:
    def __init__(self, api_url: str, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._transport = Transport(api_url, key, timeout=timeout)

    def close(self) -> None:
        self._transport.close()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        # Log lines and messages come from training code (ANSI colours, \r progress bars): the
        # API refuses control characters, so they travel as visible escapes instead.
        return self._transport.request("POST", path, json=escape_unsafe(body or {})).get("data")

    def _get(self, path: str) -> Any:
        return self._transport.request("GET", path).get("data")

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
