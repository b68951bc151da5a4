"""What the API answers about credentials a caller holds or is issued: the self-revocation and
the device login (RFC 8628 §3.2, §3.5) — the ``data`` of those routes, as models (see
:mod:`ito.core.run_views` for the rules)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["DeviceGrant", "DeviceToken", "SelfRevoked"]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SelfRevoked(_View):
    key_prefix: str
    revoked: bool


class DeviceGrant(_View):
    """A device login started (RFC 8628 §3.2): worth nothing until an approver approves the
    user code."""

    device_code: str
    """The device's secret for polling ``/v1/device/token``; never shown to a human."""
    user_code: str
    """What the human types (or checks) on the verification page."""
    verification_uri: str
    verification_uri_complete: str
    """The verification page with the user code filled in."""
    expires_in: int
    """Seconds until the device code expires."""
    interval: int
    """Seconds the device waits between polls."""


class DeviceToken(_View):
    """An approved device login, exchanged once for a new requester credential."""

    access_token: str
    """The new API key, in this answer only."""
    token_type: str
    """``bearer``."""
    key_prefix: str
    account_id: str
    role: str
    """``requester``."""
