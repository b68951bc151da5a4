"""run provenance

The data-preparation report a worker uploads for a run (``run_provenance``: its exact bytes and
digest, once per run) and the digest bound on the run itself (``runs.provenance_sha256``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import ito.server.store.tables

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_provenance",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("sha256", sa.String(length=80), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("created_at", ito.server.store.tables.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_run_provenance_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_provenance_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_provenance")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("provenance_sha256", sa.String(length=80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("provenance_sha256")
    op.drop_table("run_provenance")
