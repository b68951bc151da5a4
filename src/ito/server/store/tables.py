"""The tables. Every row that belongs to a tenant carries ``account_id``; services filter on it.

Secrets are never stored: API keys, device codes and web session ids as peppered HMACs (keys
beside a short public prefix), confirmation capabilities as HMACs, approver passwords as argon2
hashes. Timestamps are UTC, stored naive and returned aware (:class:`UTCDateTime`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "Account",
    "ApiKey",
    "Base",
    "Booking",
    "Confirmation",
    "DeviceCode",
    "IdempotencyRecord",
    "ManifestRow",
    "Principal",
    "Run",
    "RunEvent",
    "UTCDateTime",
    "User",
    "WebSession",
    "table_of",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC)


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def table_of(model: type[Base]) -> Table:
    """A model's table, typed as one (SQLAlchemy types ``__table__`` as any ``FromClause``),
    for plain statements on a hot path that skip the ORM."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Principal(Base):
    """Who acts for a tenant: an agent or engineer (requester), a human approver, a worker.
    The desk is the platform's operator, not a tenant's principal
    (:class:`~ito.server.store.operator_tables.OperatorKey`)."""

    __tablename__ = "principals"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    role: Mapped[str] = mapped_column(String(20))
    name: Mapped[str] = mapped_column(String(200))
    booking_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principals.id"), index=True)
    prefix: Mapped[str] = mapped_column(String(40), unique=True)
    """Public part of the key (``ito_req_AbCdEfGh``): names the key in logs, never authorizes."""
    secret_hash: Mapped[str] = mapped_column(String(64))
    """HMAC-SHA256 of the whole key with the server pepper."""
    role: Mapped[str] = mapped_column(String(20))
    booking_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Booking(Base):
    __tablename__ = "bookings"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    state: Mapped[str] = mapped_column(String(20))
    gpu: Mapped[str] = mapped_column(String(20))
    nodes: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    gpu_memory_gb: Mapped[int] = mapped_column(Integer)
    region: Mapped[str] = mapped_column(String(64))
    fabric: Mapped[str] = mapped_column(String(20))
    term_start: Mapped[datetime] = mapped_column(UTCDateTime())
    term_end: Mapped[datetime] = mapped_column(UTCDateTime())
    storage_uri: Mapped[str | None] = mapped_column(String(2048), nullable=True)
    storage_quota_gb: Mapped[float] = mapped_column(Float)
    rate_usd_per_gpu_hour: Mapped[float] = mapped_column(Float)
    node_inventory: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ManifestRow(Base):
    """A reviewed manifest: immutable, content-addressed per account."""

    __tablename__ = "manifests"
    __table_args__ = (UniqueConstraint("account_id", "digest"),)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    digest: Mapped[str] = mapped_column(String(80))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(Integer)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Confirmation(Base):
    __tablename__ = "confirmations"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    """The opaque reference ``cfr_…``; it authorizes nothing by itself."""
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    requester_id: Mapped[str] = mapped_column(ForeignKey("principals.id"))
    action: Mapped[str] = mapped_column(String(40))
    target_kind: Mapped[str] = mapped_column(String(20))
    target_id: Mapped[str] = mapped_column(String(40))
    manifest_digest: Mapped[str | None] = mapped_column(String(80), nullable=True)
    cost_usd: Mapped[float] = mapped_column(Float)
    """The cost bound the approver agreed to."""
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(20))
    capability_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """HMAC of the bearer capability minted on approval; the capability never leaves the server."""
    approver_id: Mapped[str | None] = mapped_column(ForeignKey("principals.id"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    consumed_by_run_id: Mapped[str | None] = mapped_column(String(40), nullable=True)


class IdempotencyRecord(Base):
    __tablename__ = "idempotency_records"
    __table_args__ = (UniqueConstraint("account_id", "action", "key"),)
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    action: Mapped[str] = mapped_column(String(40))
    key: Mapped[str] = mapped_column(String(255))
    fingerprint: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        # The runs list (newest first) and the lookup by idempotency key, per account.
        Index("ix_runs_account_id_created_at", "account_id", "created_at"),
        Index("ix_runs_account_id_idempotency_key", "account_id", "idempotency_key"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    booking_id: Mapped[str] = mapped_column(ForeignKey("bookings.id"), index=True)
    manifest_digest: Mapped[str] = mapped_column(String(80))
    idempotency_key: Mapped[str] = mapped_column(String(255))
    confirmation_id: Mapped[str] = mapped_column(ForeignKey("confirmations.id"), unique=True)
    state: Mapped[str] = mapped_column(String(30))
    stage: Mapped[str | None] = mapped_column(String(30), nullable=True)
    cleanup_state: Mapped[str] = mapped_column(String(20), default="none")
    estimate: Mapped[dict[str, Any]] = mapped_column(JSON)
    checkpoint_uri: Mapped[str] = mapped_column(String(2048))
    created_by: Mapped[str] = mapped_column(ForeignKey("principals.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    failure_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    provenance_sha256: Mapped[str | None] = mapped_column(String(80), nullable=True)
    """The data-preparation report bound to the run (``run_provenance``), once uploaded."""
    cost_bound_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    """What the run may spend (held time × rate), approved by a human: the creating
    confirmation's cost bound, raised only by a ``run.raise_cost_bound`` confirmation."""


class RunEvent(Base):
    __tablename__ = "run_events"
    __table_args__ = (
        Index("ix_run_events_run_id_id", "run_id", "id"),
        # A run's events of one kind (its stages, its state changes) without its whole history.
        Index("ix_run_events_run_id_kind_id", "run_id", "kind", "id"),
    )
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(40))
    from_state: Mapped[str | None] = mapped_column(String(30), nullable=True)
    to_state: Mapped[str | None] = mapped_column(String(30), nullable=True)
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class User(Base):
    """A human who signs in to the web pages: one approver principal, one argon2 password."""

    __tablename__ = "users"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    principal_id: Mapped[str] = mapped_column(ForeignKey("principals.id"), unique=True)
    """The principal this human acts as (role ``approver``)."""
    email: Mapped[str] = mapped_column(String(254), unique=True)
    """Sign-in name, stored lower-case."""
    password_hash: Mapped[str] = mapped_column(String(255))
    """argon2id hash (PHC string) of the password; the password itself is never stored."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebSession(Base):
    """A signed-in browser. The cookie holds a random id; only its HMAC is stored."""

    __tablename__ = "web_sessions"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    """Public id (``wss_…``) that names the session in logs; never the cookie value."""
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """HMAC-SHA256 of the cookie value with the server pepper."""
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class DeviceCode(Base):
    """One device login (RFC 8628): pending until a signed-in approver decides, then exchanged
    for a requester key exactly once. Not a tenant row until an approver binds it to their
    account."""

    __tablename__ = "device_codes"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """HMAC-SHA256 of the device code with the server pepper; the code itself is never stored."""
    user_code: Mapped[str] = mapped_column(String(16), unique=True)
    """The short code a human types, normalised (no dash, upper case)."""
    client_name: Mapped[str | None] = mapped_column(String(100), nullable=True)
    state: Mapped[str] = mapped_column(String(20))
    """``pending``, ``approved``, ``denied`` or ``consumed`` (expiry is read from the time)."""
    interval_seconds: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_polled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    account_id: Mapped[str | None] = mapped_column(
        ForeignKey("accounts.id"), nullable=True, index=True
    )
    """Set by the decision: the approving user's account."""
    decided_by: Mapped[str | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)
    """The requester key minted when the device exchanged the approved code."""
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
