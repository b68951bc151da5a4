"""The request bodies the API accepts for the requester's mutations (DESIGN §5.5, §5.8, §5.9) —
one definition, used by the API's routers to parse a request and by ``ito-mcp`` to generate the
input schema of the tools that send it, so a bound checked by the server is the bound a tool
advertises.

Strict models: unknown fields are refused, and a number sent as a string (``"ttl_seconds":
"60"``) is refused, not coerced.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ito.core.manifest import MANIFEST_MAX_BYTES

__all__ = ["ConfirmationRequest", "RunActionBody", "RunCreateBody"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ConfirmationRequest(_Body):
    action: str
    """``train.create``, ``run.cancel``, ``run.cleanup``, ``run.restart_from_checkpoint`` or
    ``run.raise_cost_bound``."""
    booking_id: str | None = None
    manifest_id: str | None = None
    run_id: str | None = None
    checkpoint_step: int | None = Field(default=None, ge=0, le=2**63 - 1)
    """The committed checkpoint a restart resumes from."""
    cost_bound_usd: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    """The new cost bound, in USD, a ``run.raise_cost_bound`` confirmation approves: what the
    whole run may spend, spent so far included."""
    ttl_seconds: int | None = Field(default=None, ge=1)
    """Shorter life than the server's ``confirmation_ttl_seconds``; a longer one is refused."""
    manifest_b64: str | None = Field(default=None, max_length=2 * MANIFEST_MAX_BYTES)
    """The manifest's bytes; stored with the confirmation if the server lacks them."""


class RunCreateBody(_Body):
    booking_id: str = Field(min_length=1, max_length=64)
    manifest_id: str = Field(min_length=1, max_length=80)
    confirmation_ref: str = Field(min_length=1, max_length=64)
    idempotency_key: str
    """Checked by the gates (1–255 printable characters, ``idempotency_key_invalid``)."""
    manifest_b64: str | None = Field(default=None, max_length=2 * MANIFEST_MAX_BYTES)


class RunActionBody(_Body):
    """Cancel, cleanup, restart and a raised cost bound of a run: each behind its own
    confirmation and key."""

    confirmation_ref: str = Field(min_length=1, max_length=64)
    idempotency_key: str
