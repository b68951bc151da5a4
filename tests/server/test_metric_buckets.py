"""The run page's charts cost the same whatever the history (issue 26: one million points took
21–27 s a render): a long series is read as a bounded number of buckets whose minimum and
maximum are drawn — a spike stays visible — and a short one point by point, a step replayed
after a restart once, with its newest value. On the real store of both backends; the time
target is in ``bench/run_page.py``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import event

from ito.server.services.metric_buckets import (
    MAX_BUCKETS,
    RAW_UP_TO,
    chart_series,
    record_points,
)
from ito.server.services.run_events import record_event
from ito.server.store.db import Database
from ito.server.store.tables import Run, RunEvent
from ito.server.web.dashboard import LATEST_EVENTS, run_page
from tests.support import Tenant

pytestmark = pytest.mark.slow

STEPS = 20_000
SPIKE_AT = 12_345


def _report(
    db: Database, tenant: Tenant, run_id: str, points: list[tuple[str, int, str, float]]
) -> None:
    """What the report route stores for these points: the rows and their buckets."""
    with db.write() as session:
        record_points(session, run_id, tenant.account_id, 1, points)


def test_a_long_series_is_drawn_as_bounded_buckets_that_keep_its_spike(tenant: Tenant) -> None:
    run_id = tenant.train(tenant.manifest(), "long", booking_id=tenant.booking())
    db = Database(tenant.server.database_url)
    try:
        for start in range(1, STEPS + 1, 2_000):  # reported in batches, as a worker does
            _report(
                db,
                tenant,
                run_id,
                [
                    (
                        "pretrain" if step <= STEPS // 2 else "long_context",
                        step,
                        "loss",
                        50.0 if step == SPIKE_AT else 3.0 - step / STEPS,
                    )
                    for step in range(start, start + 2_000)
                ],
            )
        with db.read() as session:
            (loss,) = chart_series(session, tenant.account_id, run_id).values()
            page = run_page(
                session, tenant.account_id, run_id, tenant.server.url, datetime.now(UTC)
            )
    finally:
        db.dispose()
    assert loss.reported == STEPS and loss.width > 1
    assert len(loss.points) <= 2 * (MAX_BUCKETS + 2)
    assert max(v for _, v in loss.points) == 50.0  # the spike survives the downsampling
    assert min(v for _, v in loss.points) == pytest.approx(2.0)
    assert loss.last == pytest.approx(2.0) and loss.last_step == STEPS
    halves = {"pretrain": (1, STEPS // 2), "long_context": (STEPS // 2 + 1, STEPS)}
    assert loss.stage_steps == halves
    chart = next(str(c) for c in page["charts"] if 'data-chart="loss"' in str(c))
    drawn = int(re.search(r'data-points="(\d+)"', chart)[1])  # type: ignore[index]
    assert drawn == len(loss.points) and f'data-reported="{STEPS}"' in chart
    assert f"drawn as the min and max of every {loss.width} steps" in chart
    assert page["last_step"] == STEPS and page["loss_points"] == STEPS
    # The stage table's steps come from the same summary.
    steps = {t["stage"]: t["steps"] for t in page["timeline"] if t["steps"]}
    assert steps == halves


def test_a_short_series_is_drawn_point_by_point_with_a_replayed_step_once(tenant: Tenant) -> None:
    run_id = tenant.train(tenant.manifest(), "short", booking_id=tenant.booking())
    db = Database(tenant.server.database_url)
    try:
        _report(db, tenant, run_id, [("pretrain", s, "loss", 1.0 / s) for s in range(1, 11)])
        # A restart resumed at step 6: steps 7–10 are reported again, with other values.
        _report(db, tenant, run_id, [("pretrain", s, "loss", 10.0 + s) for s in range(7, 11)])
        with db.read() as session:
            (loss,) = chart_series(session, tenant.account_id, run_id).values()
    finally:
        db.dispose()
    assert loss.reported == 14 <= RAW_UP_TO and loss.width == 1
    assert [s for s, _ in loss.points] == list(range(1, 11))
    assert dict(loss.points)[8] == 18.0 and dict(loss.points)[6] == pytest.approx(1 / 6)
    assert loss.last == 20.0


def test_the_run_page_reads_its_stages_and_latest_events_not_its_whole_history(
    tenant: Tenant,
) -> None:
    """Thousands of checkpoint events (one per commit of a long run) between its stage events:
    the page's timeline still shows every stage, its event list the newest, and it loads
    the stage and state events and the latest few only."""
    run_id = tenant.train(tenant.manifest(), "history", booking_id=tenant.booking())
    db = Database(tenant.server.database_url)
    loaded: list[int] = []

    def count(target: RunEvent, _context: object) -> None:
        loaded.append(target.id)

    try:
        with db.write() as session:
            run = session.get(Run, run_id)
            assert run is not None
            for stage in ("pretrain", "midtrain"):
                record_event(
                    session,
                    run,
                    "stage",
                    f"stage {stage} started",
                    data={"stage": stage, "status": "started"},
                )
                for step in range(1_500):
                    record_event(
                        session,
                        run,
                        "checkpoint",
                        f"checkpoint {step}",
                        data={"stage": stage, "step": step},
                    )
                record_event(
                    session,
                    run,
                    "stage",
                    f"stage {stage} completed",
                    data={"stage": stage, "status": "completed"},
                )
            newest = [
                e.id
                for e in (
                    record_event(session, run, "checkpoint", "late", data={"step": i})
                    for i in range(20)
                )
            ]
        event.listen(RunEvent, "load", count)
        try:
            with db.read() as session:
                page = run_page(
                    session, tenant.account_id, run_id, tenant.server.url, datetime.now(UTC)
                )
        finally:
            event.remove(RunEvent, "load", count)
    finally:
        db.dispose()
    by_stage = {t["stage"]: t for t in page["timeline"]}
    assert by_stage["pretrain"]["status"] == by_stage["midtrain"]["status"] == "completed"
    assert [e["id"] for e in page["events"]] == newest[-LATEST_EVENTS:]
    # Stage and state events (a handful) and the latest few, not the 3,000 checkpoints.
    assert 0 < len(loaded) <= 4 + 10 + LATEST_EVENTS, len(loaded)
