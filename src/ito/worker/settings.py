"""The worker's settings: how to reach the API (:class:`~ito.connection.ApiConnection`: URL,
key, timeouts, ``ITO_HOME``) plus the fault injection of tests and drills."""

from __future__ import annotations

import json
from typing import Any

from pydantic import field_validator

from ito.connection import ApiConnection
from ito.core.run_spec import FAULT_INJECTION_FIELDS

__all__ = ["WorkerSettings"]


class WorkerSettings(ApiConnection):
    fault_injection: dict[str, Any] | None = None
    """``ITO_FAULT_INJECTION`` (JSON: ``error_at``, ``fail_at``, ``loss_spike_at``,
    ``max_steps_per_stage``, ``min_step_seconds``, ``pause_at_step``) for tests and drills; never
    settable through the API."""

    @field_validator("fault_injection", mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = json.loads(value)
        if value is not None and (
            not isinstance(value, dict) or not set(value) <= FAULT_INJECTION_FIELDS
        ):
            raise ValueError(f"takes only {sorted(FAULT_INJECTION_FIELDS)}")
        return value
