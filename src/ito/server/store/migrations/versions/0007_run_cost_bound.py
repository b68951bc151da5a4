"""run cost bound

The spending limit a human approved for a run (``runs.cost_bound_usd``): the cost bound of the
confirmation that created it, raised only through a ``run.raise_cost_bound`` confirmation.
Existing runs take their creating confirmation's bound.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cost_bound_usd", sa.Float(), nullable=True))
    op.execute(
        "UPDATE runs SET cost_bound_usd = "
        "(SELECT cost_usd FROM confirmations WHERE confirmations.id = runs.confirmation_id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("cost_bound_usd")
