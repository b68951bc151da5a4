"""``/metrics`` written with ``prometheus_client`` (DESIGN §7.7, issue 12 item 3): per-run and
per-booking series, what only grows typed as a counter, ratios as gauges, figures equal to the
telemetry API's, and the store read in a fixed number of queries however many runs there are —
on the real store of both backends, runs driven at the service level with an explicit clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from ito.core.pipeline_events import CheckpointEvent, MetricEvent
from ito.server.services.credentials import AuthContext, authenticate
from ito.server.services.leases import LeaseSettings, finish_run, lease_next, report
from ito.server.services.telemetry import export_snapshot
from ito.server.store.db import Database
from ito.server.store.tables import utcnow
from tests.support import Tenant

pytestmark = pytest.mark.slow
SETTINGS = LeaseSettings(ttl_seconds=30, heartbeat_seconds=5)


def _worker(tenant: Tenant, db: Database) -> AuthContext:
    key = tenant.server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )
    with db.read() as session:
        worker = authenticate(session, tenant.server.env["ITO_PEPPER"], key["api_key"])
    assert isinstance(worker, AuthContext)
    return worker


def _complete_one(db: Database, worker: AuthContext, run_id: str, start: datetime) -> None:
    """Lease, 3 steps of 4 s, a checkpoint, finish 20 s after the lease."""
    with db.write() as session:
        leased = lease_next(session, worker, SETTINGS, start)
    assert leased is not None and leased["run_id"] == run_id
    events: list[Any] = [
        MetricEvent(
            stage="pretrain",
            step=step,
            values={"step_seconds": 4.0, "tokens_per_s": 1000.0 * step, "mfu": 0.1},
        )
        for step in (1, 2, 3)
    ]
    events.append(CheckpointEvent(stage="pretrain", step=3, path="ckpt/3", bytes=8000, seconds=2.0))
    with db.write() as session:
        report(session, worker, run_id, 1, events, now=start)
    with db.write() as session:
        finish_run(
            session,
            worker,
            run_id,
            1,
            "succeeded",
            None,
            "done",
            now=start + timedelta(seconds=20),
        )


@contextmanager
def _statements(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(str(args[2]))

    engines = {id(e): e for e in (db._read_engine, db._write_engine)}.values()
    for engine in engines:
        event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", count)


def _families(tenant: Tenant) -> dict[str, Any]:
    response = httpx.get(
        tenant.server.url + "/metrics",
        timeout=30,
        headers={"authorization": f"Bearer {tenant.server.desk_key}"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def _sample(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    (value,) = [
        s.value
        for s in families[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return float(value)


def test_metrics_are_typed_per_run_and_per_booking_and_equal_the_telemetry_api(
    tenant: Tenant,
) -> None:
    db = Database(tenant.server.database_url)
    worker = _worker(tenant, db)
    now = utcnow()
    runs = []
    for index in range(2):
        run_id = tenant.train(tenant.manifest(f"m{index}"), f"k{index}")
        _complete_one(db, worker, run_id, now + timedelta(seconds=100 * index))
        runs.append(run_id)

    families = _families(tenant)
    for name in ("run", "booking"):
        for counter in (
            "held_seconds",
            "productive_seconds",
            "interruptions",
            "checkpoint_bytes",
            "cost_usd",
        ):
            assert families[f"ito_{name}_{counter}"].type == "counter", counter
        for gauge in ("goodput", "checkpoint_bandwidth_bytes_per_second"):
            assert families[f"ito_{name}_{gauge}"].type == "gauge", gauge
    assert families["ito_run_mfu"].type == families["ito_run_tokens_per_second"].type == "gauge"

    booking = {"booking": tenant.booking_id, "tenant": tenant.account_id}
    for run_id in runs:
        labels = booking | {"run": run_id}
        held = _sample(families, "ito_run_held_seconds", "ito_run_held_seconds_total", **labels)
        assert held == pytest.approx(20.0)
        assert _sample(families, "ito_run_goodput", "ito_run_goodput", **labels) == pytest.approx(
            12.0 / 20.0
        )
        api = tenant.api("GET", "/v1/telemetry", params={"run_id": run_id})["data"]
        cost = _sample(families, "ito_run_cost_usd", "ito_run_cost_usd_total", **labels)
        assert round(cost, 6) == api["cost_usd"] and cost > 0
        assert _sample(families, "ito_run_mfu", "ito_run_mfu", **labels) == pytest.approx(0.1)
        bandwidth = _sample(
            families,
            "ito_run_checkpoint_bandwidth_bytes_per_second",
            "ito_run_checkpoint_bandwidth_bytes_per_second",
            **labels,
        )
        assert bandwidth == pytest.approx(4000.0)
    api = tenant.api("GET", "/v1/telemetry", params={"booking_id": tenant.booking_id})["data"]
    assert _sample(
        families, "ito_booking_held_seconds", "ito_booking_held_seconds_total", **booking
    ) == pytest.approx(40.0)
    assert _sample(families, "ito_booking_goodput", "ito_booking_goodput", **booking) == (
        pytest.approx(api["goodput"], abs=5e-5)
    )
    assert _sample(families, "ito_booking_runs", "ito_booking_runs", **booking) == 2.0
    db.dispose()


def test_the_store_is_read_in_a_fixed_number_of_queries(tenant: Tenant) -> None:
    db = Database(tenant.server.database_url)
    worker = _worker(tenant, db)
    now = utcnow()

    def snapshot_statements() -> int:
        with _statements(db) as seen, db.read() as session:
            export_snapshot(session)
        return len(seen)

    run_id = tenant.train(tenant.manifest("first"), "first")
    _complete_one(db, worker, run_id, now)
    with_one = snapshot_statements()
    for index in range(3):
        more = tenant.train(tenant.manifest(f"more{index}"), f"more{index}")
        _complete_one(db, worker, more, now + timedelta(seconds=100 * (index + 1)))
    assert snapshot_statements() == with_one <= 8
    db.dispose()
