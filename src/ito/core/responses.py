"""The §4 envelope as models: what every API response body is, for the routes' response models
(so the OpenAPI document describes the real answers) and for anyone reading an answer.

``Envelope[Data]`` is a success whose ``data`` is ``Data``; :class:`ErrorEnvelope` is every
refusal. The dict builders in :mod:`ito.core.envelope` produce exactly these shapes.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = ["Envelope", "ErrorBody", "ErrorEnvelope", "Open", "ReasonBody"]

DataT = TypeVar("DataT")

Open = dict[str, Any]
"""Any JSON object: the ``data`` of an answer that is itself an open document (the manifest's
JSON Schema at ``/v1/schemas/manifest``); every other route's ``data`` has its own model."""


class Envelope(BaseModel, Generic[DataT]):
    """A success (``ok`` true)."""

    model_config = ConfigDict(extra="forbid")
    ok: Literal[True]
    live_api_contacted: bool
    """True once any byte of the request may have reached the canonical API."""
    notice: str
    """One human sentence saying what did or did not happen."""
    data: DataT


class ReasonBody(BaseModel):
    """One reason of a refusal that has several (``plan_refused``)."""

    model_config = ConfigDict(extra="forbid")
    code: str
    """Stable snake_case code of the reason (e.g. ``memory_exceeded``)."""
    message: str


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str
    """Stable snake_case code from the registry (:mod:`ito.core.errors`)."""
    message: str
    retryable: bool
    details: dict[str, Any] | None = None
    reasons: list[ReasonBody] | None = None
    """Every reason, for a refusal that has several (``plan_refused``)."""


class ErrorEnvelope(BaseModel):
    """A refusal (``ok`` false): every status other than 2xx."""

    model_config = ConfigDict(extra="forbid")
    ok: Literal[False]
    live_api_contacted: bool
    notice: str
    error: ErrorBody
