"""What the API answers about itself and about the caller: the health check, ``/v1/me`` and
the account overview — the ``data`` of those routes, as models (see :mod:`ito.core.run_views`
for the rules)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ito.core.booking_views import BookingDetail
from ito.core.run_views import RunView

__all__ = ["AccountOverview", "Health", "Identity"]


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


class AccountOverview(BaseModel):
    """The caller's account at a glance: every booking and the most recent runs."""

    model_config = ConfigDict(extra="ignore")
    account_id: str
    bookings: list[BookingDetail]
    recent_runs: list[RunView]
    """The ten newest, newest first."""
