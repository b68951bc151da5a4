"""Tables of the platform's operator (the desk): its keys and the audit trail of its actions.

The desk is not a tenant. Its keys live apart from the tenants' ``api_keys`` and carry no
``account_id`` at all, so no tenant row, query or credential can be bound to the operator, and
no operator credential to a tenant. Every desk action (through the desk API or ``ito-server``)
appends one :class:`AuditEvent`: who, what, which account, which target, when, and the outcome.
An audit row never holds a secret: keys appear only by their public prefix.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from ito.server.store.tables import Base, UTCDateTime, utcnow

__all__ = ["AuditEvent", "AuthFailure", "OperatorKey"]


class OperatorKey(Base):
    """A desk credential. Minted only by ``ito-server key create --role desk`` on the host that
    holds the database; never through the API, never for an account."""

    __tablename__ = "operator_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    prefix: Mapped[str] = mapped_column(String(40), unique=True)
    """Public part of the key (``ito_dsk_AbCdEfGh``): names the key in logs and the audit."""
    secret_hash: Mapped[str] = mapped_column(String(64))
    """HMAC-SHA256 of the whole key with the server pepper."""
    name: Mapped[str] = mapped_column(String(200))
    """Who holds it, as the operator labelled it."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AuditEvent(Base):
    """One desk action, recorded whether it succeeded or was refused. Append-only."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_account_id_id", "account_id", "id"),)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    actor: Mapped[str] = mapped_column(String(200))
    """Who acted: ``key:<operator key prefix>`` or ``cli:<os user>``; never a secret."""
    actor_key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """The operator key that acted (``None`` for ``ito-server`` on the host)."""
    action: Mapped[str] = mapped_column(String(40))
    """``account.create``, ``key.create``, ``key.revoke``, ``booking.create``, ..."""
    account_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    """The tenant the action touched (``None`` when it touched none). Not a foreign key: a
    refused action against an account that does not exist is recorded as asked."""
    target_kind: Mapped[str | None] = mapped_column(String(20), nullable=True)
    target_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    outcome: Mapped[str] = mapped_column(String(20))
    """``ok`` or ``refused``."""
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class AuthFailure(Base):
    """One failed authentication, counted against a key (a source address, a key's public
    prefix, an email): the failure window every server process shares
    (:mod:`ito.server.services.auth_failures`). Rows older than the window are deleted as new
    ones arrive. Holds no secret: keys are addresses, public prefixes and hashed emails."""

    __tablename__ = "auth_failures"
    __table_args__ = (
        Index("ix_auth_failures_key_at", "key", "at"),
        Index("ix_auth_failures_at", "at"),
    )
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    key: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
