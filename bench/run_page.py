"""Run-page bench: the time to assemble one run's page (``ito.server.web.dashboard.run_page``,
everything the page shows, charts drawn) for a run with ``--points`` metric points in each of
three series (loss, tokens/s, MFU), ÷ the same for a run with 100 points each — measured in the
same process, on the same store, so the ratio says how the page's cost grows with history.

Issue 26's goal: at one million points per series the page renders in ≤ 0.3 s (before the
bucket summaries, 21–27 s). The long run's points are written with one ``INSERT … SELECT`` per
series and its buckets with the migration's own backfill statement (the report route's
incremental path would take minutes to write a million points); the short run goes through
``record_points`` like a report.

It prints both medians over ``--reps`` renders, the ratio, and, last, one JSON line. A real
server on SQLite in a temporary directory creates the account, booking and runs (through the
gates); the page is assembled in this process from the same store.

Usage: ``.venv/bin/python bench/run_page.py [--points 1000000] [--reps 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' server helpers

from ito.server.services.metric_buckets import WIDTHS, record_points
from ito.server.store.db import Database
from ito.server.web.dashboard import run_page
from tests.support import Server, Tenant, make_tenant, start_server, stop_server

SERIES = ("loss", "tokens_per_s", "mfu", "step_seconds", "tokens")
"""What the engine reports every step (the run page charts three, telemetry reads the others)."""


def _seed(workdir: Path) -> tuple[Server, Tenant, str, str]:
    """A real server on SQLite and a tenant with two runs created through the gates."""
    server = start_server(f"sqlite:///{workdir / 'ito.db'}", workdir / "home")
    tenant = make_tenant(server, workdir / "tenant", "bench")
    short = tenant.train(tenant.manifest("short"), "short", booking_id=tenant.booking())
    long = tenant.train(tenant.manifest("long"), "long", booking_id=tenant.booking())
    return server, tenant, short, long


def _fill_long(db: Database, account: str, run_id: str, points: int) -> None:
    with db.engine.begin() as conn:
        for name in SERIES:
            conn.execute(
                sa.text(
                    "INSERT INTO run_metrics (run_id, account_id, attempt, stage, step, name, "
                    "value, created_at) "
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :p) "
                    "SELECT :r, :a, 1, 'pretrain', i, :name, 1.0 + (i % 97) / 97.0, :now FROM n"
                ),
                {"r": run_id, "a": account, "name": name, "p": points, "now": datetime.now(UTC)},
            )
        for width in WIDTHS:
            conn.execute(
                sa.text(
                    "INSERT INTO run_metric_buckets (run_id, account_id, name, stage, width, "
                    "bucket, first_step, last_step, min_value, max_value, last_value, count, "
                    "sum_value, surviving_sum) "
                    "SELECT g.run_id, g.account_id, g.name, g.stage, :w, g.b, g.f_step, "
                    "g.l_step, g.mn, g.mx, l.value, g.n, g.total, g.total FROM ("
                    "SELECT run_id, account_id, name, stage, step / :w AS b, MIN(step) AS f_step, "
                    "MAX(step) AS l_step, MIN(value) AS mn, MAX(value) AS mx, MAX(id) AS newest, "
                    "COUNT(*) AS n, SUM(value) AS total FROM run_metrics WHERE run_id = :r "
                    "GROUP BY run_id, account_id, name, stage, step / :w"
                    ") g JOIN run_metrics l ON l.id = g.newest"
                ),
                {"w": width, "r": run_id},
            )


def _fill_short(db: Database, account: str, run_id: str) -> None:
    points = [("pretrain", step, name, 1.0 / step) for step in range(1, 101) for name in SERIES]
    with db.write() as session:
        record_points(session, run_id, account, 1, points)


def _render(db: Database, account: str, run_id: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        with db.read() as session:
            page = run_page(session, account, run_id, "http://127.0.0.1", datetime.now(UTC))
        assert page["charts"]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, tenant, short, long = _seed(Path(tmp))
        db = Database(server.database_url)
        try:
            account = tenant.account_id
            _fill_short(db, account, short)
            start = time.perf_counter()
            _fill_long(db, account, long, args.points)
            wrote = time.perf_counter() - start
            print(f"wrote {args.points:,} points x {len(SERIES)} series in {wrote:.1f} s")
            _render(db, account, long, 1)  # warm-up
            base = _render(db, account, short, args.reps)
            big = _render(db, account, long, args.reps)
        finally:
            db.dispose()
            stop_server(server)
    print(f"run page, 100 points per series:   {base * 1000:8.1f} ms")
    print(f"run page, {args.points:,} points per series: {big * 1000:8.1f} ms")
    print(f"ratio: {big / base:.2f}  (goal: <= 0.3 s at 1,000,000 points)")
    print(
        json.dumps(
            {
                "bench": "run_page",
                "points_per_series": args.points,
                "short_s": round(base, 4),
                "long_s": round(big, 4),
                "ratio": round(big / base, 3),
                "goal_met": big <= 0.3,
            }
        )
    )


if __name__ == "__main__":
    main()
