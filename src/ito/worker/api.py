"""The worker's side of the worker API, over HTTP with a booking-bound worker key."""

from __future__ import annotations

from typing import Any

import httpx

from ito.core.errors import REGISTRY, ItoError

__all__ = ["WorkerApi"]


class WorkerApi:
    def __init__(self, api_url: str, key: str, *, timeout: float = 30.0) -> None:
        self._client = httpx.Client(base_url=api_url.rstrip("/"), timeout=timeout,
                                    headers={"authorization": f"Bearer {key}"},
                                    trust_env=False)

    def close(self) -> None:
        self._client.close()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._envelope(self._client.post(path, json=body or {}))

    def _get(self, path: str) -> Any:
        return self._envelope(self._client.get(path))

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
        for start in range(0, len(events), 2000):
            self._post(f"/v1/worker/runs/{run_id}/report",
                       {"attempt": attempt, "events": events[start:start + 2000]})

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
