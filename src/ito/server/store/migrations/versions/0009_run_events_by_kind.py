"""run events by kind

An index on (run_id, kind, id): the run page reads a run's stage and state events and its
latest events, never the whole history (checkpoint events grow with the steps).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 12:40:00
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_run_events_run_id_kind_id", ["run_id", "kind", "id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.drop_index("ix_run_events_run_id_kind_id")
