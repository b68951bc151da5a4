"""What the API answers about the desk's actions (DESIGN §5.1, §5.10): an account or a key it
created or revoked, its audit trail, and what a tenant sees of the desk's actions on its own
account — the ``data`` of those routes, as models (see :mod:`ito.core.run_views` for the
rules)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AccountCreated",
    "AccountEvent",
    "AccountEventList",
    "AuditEventView",
    "AuditLog",
    "KeyCreated",
    "KeyRevoked",
]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AccountCreated(_View):
    account_id: str
    name: str


class KeyCreated(_View):
    """A tenant's key, minted by the desk."""

    key_id: str
    principal_id: str
    key_prefix: str
    """The key's public part: how logs, the trail and the desk name it."""
    api_key: str
    """The whole secret, in this answer only: the server keeps a hash of it."""


class KeyRevoked(_View):
    key_id: str
    key_prefix: str
    revoked: bool


class AuditEventView(_View):
    """One desk action in the operator's trail, successful or refused."""

    id: int
    at: str
    actor: str
    """``key:<operator key prefix>`` or ``cli:<os user>``; never a secret."""
    actor_key_id: str | None
    action: str
    """``account.create``, ``key.create``, ``key.revoke``, ``booking.create``, ..."""
    account_id: str | None
    """The tenant the action touched, if any."""
    target_kind: str | None
    target_id: str | None
    outcome: str
    """``ok`` or ``refused``."""
    error_code: str | None
    details: dict[str, Any]


class AuditLog(_View):
    events: list[AuditEventView]
    """Newest first."""


class AccountEvent(_View):
    """A successful desk action on the tenant's own account, as the tenant sees it."""

    id: int
    at: str
    actor: str
    """Always ``desk``: the operator's own key is not shown to a tenant."""
    action: str
    target_kind: str | None
    target_id: str | None
    details: dict[str, Any]


class AccountEventList(_View):
    events: list[AccountEvent]
    """Newest first."""
