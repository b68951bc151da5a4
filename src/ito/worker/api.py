"""The worker's side of the worker API, over the one HTTP transport (:mod:`ito.transport`)
with a booking-bound worker key. Every failure is an :class:`~ito.core.errors.ItoError`: an
API refusal with its code, a transport failure with a retryable ``transport_*`` code (the caller
decides how long a silent API may last: the lease TTL)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ito.core.errors import ItoError
from ito.core.pipeline_events import ReportedEvent
from ito.core.text import escape_unsafe
from ito.core.worker_messages import (
    AttemptBody,
    CleanedBody,
    CleanupJob,
    CleanupJobs,
    FinishAnswer,
    FinishBody,
    HeartbeatAnswer,
    Lease,
    ProvenanceBody,
    ProvenanceBound,
)
from ito.transport import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, Transport

__all__ = ["WorkerApi", "report_batches"]

REPORT_MAX_EVENTS = 2000
REPORT_MAX_BYTES = 1 << 20
"""Per report request; the server refuses bodies past ``max_request_bytes`` (4 MiB default)."""


class WorkerApi:
    def __init__(
        self,
        api_url: str,
        key: str,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._transport = Transport(api_url, key, connect_timeout=connect_timeout, timeout=timeout)

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

    def lease(self) -> Lease | None:
        data = self._post("/v1/worker/lease")
        return _answer(Lease, data) if data else None

    def heartbeat(self, run_id: str, attempt: int) -> HeartbeatAnswer:
        return _answer(
            HeartbeatAnswer,
            self._post(
                f"/v1/worker/runs/{run_id}/heartbeat", AttemptBody(attempt=attempt).model_dump()
            ),
        )

    def report(self, run_id: str, attempt: int, events: Sequence[ReportedEvent]) -> None:
        """Send events in order, in batches well under the server's request bound (one request
        per batch of :func:`report_batches`; the first refusal raises)."""
        for batch in report_batches(events):
            self._post(f"/v1/worker/runs/{run_id}/report", {"attempt": attempt, "events": batch})

    def provenance(self, run_id: str, attempt: int, raw: bytes) -> ProvenanceBound:
        """Bind the data-preparation report (the exact bytes of ``provenance.json``) to the
        run; refused ``provenance_mismatch`` when another report is already bound."""
        body = ProvenanceBody(attempt=attempt, report_b64=base64.b64encode(raw).decode("ascii"))
        return _answer(
            ProvenanceBound,
            self._post(f"/v1/worker/runs/{run_id}/provenance", body.model_dump()),
        )

    def finish(
        self,
        run_id: str,
        attempt: int,
        status: str,
        *,
        failure_code: str | None = None,
        message: str = "",
    ) -> FinishAnswer:
        body = FinishBody.model_validate(
            {"attempt": attempt, "status": status, "failure_code": failure_code, "message": message}
        )
        return _answer(
            FinishAnswer, self._post(f"/v1/worker/runs/{run_id}/finish", body.model_dump())
        )

    def cleanups(self) -> list[CleanupJob]:
        return list(_answer(CleanupJobs, self._get("/v1/worker/cleanups")).cleanups)

    def cleaned(self, run_id: str, bytes_freed: int, paths: list[str]) -> None:
        body = CleanedBody(bytes_freed=bytes_freed, paths=paths)
        self._post(f"/v1/worker/runs/{run_id}/cleaned", body.model_dump())


def report_batches(events: Sequence[ReportedEvent]) -> list[list[dict[str, Any]]]:
    """The events as JSON objects, in order, cut into batches of at most
    ``REPORT_MAX_EVENTS`` events and about ``REPORT_MAX_BYTES``."""
    batches: list[list[dict[str, Any]]] = []
    batch: list[dict[str, Any]] = []
    size = 0
    for event in events:
        payload = event.model_dump(mode="json")
        cost = len(json.dumps(payload)) + 2
        if batch and (len(batch) >= REPORT_MAX_EVENTS or size + cost > REPORT_MAX_BYTES):
            batches.append(batch)
            batch, size = [], 0
        batch.append(payload)
        size += cost
    if batch:
        batches.append(batch)
    return batches


_AnswerT = TypeVar("_AnswerT", bound=BaseModel)


def _answer(model: type[_AnswerT], data: Any) -> _AnswerT:
    """The server's answer as its model: a worker acts on nothing it did not check."""
    try:
        return model.model_validate(data)
    except ValidationError:
        raise ItoError(
            "api_answer_invalid", f"the API's {model.__name__} answer does not match its model"
        ) from None
