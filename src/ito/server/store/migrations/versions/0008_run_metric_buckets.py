"""run metric buckets

Each run's metric series summarised per bucket of 16, 256, 4096, 65536 and 1048576 global steps
(min, max, last value, count, sum), kept as points are reported, so the run page draws a fixed number
of buckets whatever the history. Existing runs' points are summarised here once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 09:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

WIDTHS = (16, 256, 4096, 65536, 1 << 20)


def upgrade() -> None:
    op.create_table(
        "run_metric_buckets",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("stage", sa.String(length=30), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Float(), nullable=False),
        sa.Column("max_value", sa.Float(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("sum_value", sa.Float(), nullable=False),
        sa.Column("surviving_sum", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_run_metric_buckets_account_id_accounts"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_metric_buckets_run_id_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_metric_buckets")),
    )
    op.create_index(
        "ux_run_metric_buckets_key",
        "run_metric_buckets",
        ["run_id", "name", "width", "bucket", "stage"],
        unique=True,
    )
    op.create_index(
        "ix_run_metrics_run_id_name_step", "run_metrics", ["run_id", "name", "step"], unique=False
    )
    for width in WIDTHS:
        # The last value of a bucket is that of its newest point (highest id); its surviving
        # sum counts each step once, with the value reported last.
        op.execute(
            sa.text(
                "INSERT INTO run_metric_buckets (run_id, account_id, name, stage, width, bucket, "
                "first_step, last_step, min_value, max_value, last_value, count, sum_value, "
                "surviving_sum) "
                "SELECT g.run_id, g.account_id, g.name, g.stage, :w, g.b, g.f_step, g.l_step, "
                "g.mn, g.mx, l.value, g.n, g.total, g.surviving FROM ("
                "SELECT m.run_id, m.account_id, m.name, m.stage, m.step / :w AS b, "
                "MIN(m.step) AS f_step, MAX(m.step) AS l_step, MIN(m.value) AS mn, "
                "MAX(m.value) AS mx, MAX(m.id) AS newest, COUNT(*) AS n, SUM(m.value) AS total, "
                "SUM(CASE WHEN m.id = k.newest_of_step THEN m.value ELSE 0.0 END) AS surviving "
                "FROM run_metrics m JOIN ("
                "SELECT run_id, name, stage, step, MAX(id) AS newest_of_step FROM run_metrics "
                "GROUP BY run_id, name, stage, step"
                ") k ON k.run_id = m.run_id AND k.name = m.name AND k.stage = m.stage "
                "AND k.step = m.step "
                "GROUP BY m.run_id, m.account_id, m.name, m.stage, m.step / :w"
                ") g JOIN run_metrics l ON l.id = g.newest"
            ).bindparams(w=width)
        )


def downgrade() -> None:
    op.drop_index("ix_run_metrics_run_id_name_step", table_name="run_metrics")
    op.drop_index("ux_run_metric_buckets_key", table_name="run_metric_buckets")
    op.drop_table("run_metric_buckets")
