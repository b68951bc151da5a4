"""What the API answers about itself and about the caller: the health check and ``/v1/me`` —
the ``data`` of those routes, as models (see :mod:`ito.core.run_views` for the rules)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Health", "Identity"]


class Health(BaseModel):
    model_config = ConfigDict(extra="ignore")
    status: str
    version: str


class Identity(BaseModel):
    """Who a credential is. Never carries the secret: only its public prefix."""

    model_config = ConfigDict(extra="ignore")
    account_id: str | None
    """``None`` for the operator (desk) credential: it is no tenant."""
    principal_id: str
    role: str
    key_prefix: str
    booking_id: str | None
    """The booking a worker credential is bound to."""
