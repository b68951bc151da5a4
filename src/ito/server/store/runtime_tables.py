"""Tables of the runtime: who holds a run (the lease), and what the run reports — log lines,
metrics, checkpoints — plus lifecycle requests (cancel, cleanup). Every row carries
``account_id`` like the rest of the store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from ito.server.store.tables import Base, UTCDateTime, utcnow

__all__ = [
    "CheckpointRow",
    "RunLease",
    "RunLog",
    "RunMetric",
    "RunMetricBucket",
    "RunProvenance",
]

_ID = BigInteger().with_variant(Integer, "sqlite")


class RunLease(Base):
    """One row per run: the current holder, the attempt, and what the run has asked for."""

    __tablename__ = "run_leases"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    booking_id: Mapped[str] = mapped_column(ForeignKey("bookings.id"), index=True)
    worker_principal_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    cleanup_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    proposal: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """A human-gated action the run proposes (loss spike: restart from checkpoint S)."""
    busy_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    """Wall seconds the run held the booking's accelerators, over all attempts — outages
    included (a dead attempt's last beat to the next lease); not a human's wait after a spike."""
    productive_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    """Training seconds whose progress survived into the committed state."""
    interruptions: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    bytes_freed: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RunLog(Base):
    __tablename__ = "run_logs"
    __table_args__ = (Index("ix_run_logs_run_id_id", "run_id", "id"),)
    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    level: Mapped[str] = mapped_column(String(10))
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RunMetric(Base):
    __tablename__ = "run_metrics"
    __table_args__ = (
        Index("ix_run_metrics_run_id_name", "run_id", "name", "id"),
        # A step's earlier reports (a replay after a restart), found as a report arrives.
        Index("ix_run_metrics_run_id_name_step", "run_id", "name", "step"),
        # Every series of a run in cursor order (no name filter).
        Index("ix_run_metrics_run_id_id", "run_id", "id"),
    )
    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str] = mapped_column(String(30))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RunMetricBucket(Base):
    """A run's metric series summarised per bucket of ``width`` global steps (one row per
    series, stage, width and bucket), kept as points are reported: the run page draws a fixed
    number of buckets whatever the history, instead of every point
    (:mod:`ito.server.services.metric_buckets`)."""

    __tablename__ = "run_metric_buckets"
    __table_args__ = (
        Index(
            "ux_run_metric_buckets_key", "run_id", "name", "width", "bucket", "stage", unique=True
        ),
    )
    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    name: Mapped[str] = mapped_column(String(64))
    stage: Mapped[str] = mapped_column(String(30))
    width: Mapped[int] = mapped_column(Integer)
    bucket: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int] = mapped_column(Integer)
    min_value: Mapped[float] = mapped_column(Float)
    max_value: Mapped[float] = mapped_column(Float)
    last_value: Mapped[float] = mapped_column(Float)
    """The value reported last in the bucket (a replayed step's newer value included)."""
    count: Mapped[int] = mapped_column(Integer)
    sum_value: Mapped[float] = mapped_column(Float)
    """The sum of the values reported in the bucket (a series' mean is Σ sums ÷ Σ counts)."""
    surviving_sum: Mapped[float] = mapped_column(Float)
    """The sum of each step's value as last reported (a step replayed after a restart counts
    once, with its newest value): telemetry's productive time and tokens."""


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (Index("ix_checkpoints_run_id_step", "run_id", "step"),)
    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    attempt: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str] = mapped_column(String(30))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(2048))
    bytes: Mapped[int] = mapped_column(BigInteger)
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class RunProvenance(Base):
    """The data-preparation report bound to a run: its exact bytes, once per run (a later
    upload must carry the same digest; :mod:`ito.server.services.provenance`)."""

    __tablename__ = "run_provenance"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    sha256: Mapped[str] = mapped_column(String(80))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    bytes: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
