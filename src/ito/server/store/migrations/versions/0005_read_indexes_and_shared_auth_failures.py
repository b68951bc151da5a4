"""read indexes and shared auth failures

Indexes for the hot reads (the runs list newest first, a run by idempotency key, a run's
metrics in cursor order) and ``auth_failures``, the failed-authentication window that every
server process shares (``ito-server serve --workers N``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 14:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import ito.server.store.tables

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "auth_failures",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("at", ito.server.store.tables.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_auth_failures")),
    )
    with op.batch_alter_table("auth_failures", schema=None) as batch_op:
        batch_op.create_index("ix_auth_failures_key_at", ["key", "at"], unique=False)
        batch_op.create_index("ix_auth_failures_at", ["at"], unique=False)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_account_id_created_at", ["account_id", "created_at"], unique=False
        )
        batch_op.create_index(
            "ix_runs_account_id_idempotency_key", ["account_id", "idempotency_key"], unique=False
        )
    with op.batch_alter_table("run_metrics", schema=None) as batch_op:
        batch_op.create_index("ix_run_metrics_run_id_id", ["run_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("run_metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_run_metrics_run_id_id")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_account_id_idempotency_key")
        batch_op.drop_index("ix_runs_account_id_created_at")
    with op.batch_alter_table("auth_failures", schema=None) as batch_op:
        batch_op.drop_index("ix_auth_failures_at")
        batch_op.drop_index("ix_auth_failures_key_at")
    op.drop_table("auth_failures")
