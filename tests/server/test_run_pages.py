"""Logs and metrics pages (DESIGN §5.9): one statement each (the run LEFT JOIN its page), so
these pin what that statement must still answer — cursors, limits, the series filter, an empty
page that keeps the cursor, and another tenant's run answering exactly like a missing one."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ito.server.store.db import Database
from ito.server.store.runtime_tables import RunLog, RunMetric
from tests.support import Tenant

pytestmark = pytest.mark.slow


def _get(tenant: Tenant, path: str, **params: Any) -> httpx.Response:
    return httpx.get(
        tenant.server.url + path,
        params=params,
        headers={"authorization": f"Bearer {tenant.requester_key}"},
        timeout=30,
    )


def _run(tenant: Tenant) -> str:
    return tenant.train(tenant.manifest(), "pages", booking_id=tenant.booking())


def _fill(tenant: Tenant, run_id: str, lines: int, steps: int) -> None:
    db = Database(tenant.server.database_url)
    with db.write() as session:
        for i in range(lines):
            session.add(
                RunLog(
                    run_id=run_id,
                    account_id=tenant.account_id,
                    attempt=1,
                    level="info",
                    message=f"line {i}",
                )
            )
        for step in range(steps):
            for name in ("loss", "lr"):
                session.add(
                    RunMetric(
                        run_id=run_id,
                        account_id=tenant.account_id,
                        attempt=1,
                        stage="pretrain",
                        step=step,
                        name=name,
                        value=float(step),
                    )
                )
    db.dispose()


def test_log_pages_follow_the_cursor_and_an_empty_page_keeps_it(tenant: Tenant) -> None:
    run_id = _run(tenant)
    empty = _get(tenant, f"/v1/runs/{run_id}/logs", since=0).json()["data"]
    assert empty == {"lines": [], "next_cursor": 0}
    _fill(tenant, run_id, lines=5, steps=0)
    first = _get(tenant, f"/v1/runs/{run_id}/logs", since=0, limit=3).json()["data"]
    assert [line["message"] for line in first["lines"]] == ["line 0", "line 1", "line 2"]
    assert first["next_cursor"] == first["lines"][-1]["cursor"]
    rest = _get(tenant, f"/v1/runs/{run_id}/logs", since=first["next_cursor"]).json()["data"]
    assert [line["message"] for line in rest["lines"]] == ["line 3", "line 4"]
    after = _get(tenant, f"/v1/runs/{run_id}/logs", since=rest["next_cursor"]).json()["data"]
    assert after == {"lines": [], "next_cursor": rest["next_cursor"]}


def test_metric_pages_filter_a_series_and_follow_the_cursor(tenant: Tenant) -> None:
    run_id = _run(tenant)
    _fill(tenant, run_id, lines=0, steps=4)
    every = _get(tenant, f"/v1/runs/{run_id}/metrics").json()["data"]
    assert [(p["name"], p["step"]) for p in every["points"]] == [
        (name, step) for step in range(4) for name in ("loss", "lr")
    ]
    loss = _get(tenant, f"/v1/runs/{run_id}/metrics", name="loss", limit=3).json()["data"]
    assert [(p["name"], p["value"]) for p in loss["points"]] == [
        ("loss", 0.0),
        ("loss", 1.0),
        ("loss", 2.0),
    ]
    more = _get(
        tenant, f"/v1/runs/{run_id}/metrics", name="loss", since=loss["next_cursor"]
    ).json()["data"]
    assert [p["step"] for p in more["points"]] == [3]
    none = _get(tenant, f"/v1/runs/{run_id}/metrics", name="absent").json()["data"]
    assert none == {"points": [], "next_cursor": 0}


def test_a_step_replayed_after_a_restart_marks_its_earlier_report_superseded(
    tenant: Tenant,
) -> None:
    """torchrun restarts the same attempt from its last checkpoint: steps 2 and 3 are reported
    twice in attempt 1 and step 3 once more in attempt 2. Each step's last report survives;
    a page that ends before the replay still marks the earlier one."""
    run_id = _run(tenant)
    db = Database(tenant.server.database_url)
    # (attempt, stage, step, name, value), in report order. The same step of another series
    # or another stage (the last two) supersedes nothing.
    reports = [
        (1, "pretrain", 1, "loss", 1.0),
        (1, "pretrain", 2, "loss", 2.0),
        (1, "pretrain", 3, "loss", 3.0),
        (1, "pretrain", 2, "loss", 2.5),
        (1, "pretrain", 3, "loss", 3.5),
        (2, "pretrain", 3, "loss", 3.25),
        (2, "pretrain", 1, "lr", 0.1),
        (2, "sft", 1, "loss", 9.0),
    ]
    with db.write() as session:
        session.add_all(
            RunMetric(
                run_id=run_id,
                account_id=tenant.account_id,
                attempt=attempt,
                stage=stage,
                step=step,
                name=name,
                value=value,
            )
            for attempt, stage, step, name, value in reports
        )
    db.dispose()
    points = _get(tenant, f"/v1/runs/{run_id}/metrics", name="loss").json()["data"]["points"]
    assert [(p["attempt"], p["stage"], p["step"], p["superseded"]) for p in points] == [
        (1, "pretrain", 1, False),
        (1, "pretrain", 2, True),
        (1, "pretrain", 3, True),
        (1, "pretrain", 2, False),
        (1, "pretrain", 3, True),
        (2, "pretrain", 3, False),
        (2, "sft", 1, False),
    ]
    first = _get(tenant, f"/v1/runs/{run_id}/metrics", name="loss", limit=2).json()["data"]
    assert [p["superseded"] for p in first["points"]] == [False, True]


@pytest.mark.parametrize("page", ["logs", "metrics"])
def test_another_tenants_run_pages_look_exactly_like_a_missing_run(
    tenant: Tenant, other_tenant: Tenant, page: str
) -> None:
    run_id = _run(tenant)
    _fill(tenant, run_id, lines=2, steps=2)
    theirs = _get(other_tenant, f"/v1/runs/{run_id}/{page}")
    missing = _get(other_tenant, f"/v1/runs/run_{'z' * 24}/{page}")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["code"] == missing.json()["error"]["code"] == "run_not_found"
    assert theirs.json()["error"] == missing.json()["error"]
