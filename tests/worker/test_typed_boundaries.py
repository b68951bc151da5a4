"""The messages between processes are models, validated where they enter (DESIGN §7.1): a
malformed worker report is refused 422 ``invalid_arguments`` and writes nothing, while the lease
keeps heartbeating; the supervisor drops a malformed pipeline event line (logged, never
forwarded) and a refused report batch, keeps heartbeating, and the run never goes
``recovering`` because of either. Real server on loopback (both backends), a real lease through
the worker API, the real supervisor loop; only the training processes are a stand-in (the
executor), because what is under test is what crosses the boundaries."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from ito.core.pipeline_events import DoneEvent, LogEvent, MetricEvent, PipelineEvent
from ito.core.worker_messages import Lease
from ito.worker.api import WorkerApi
from ito.worker.executors import LaunchSpec
from ito.worker.supervisor import EventTail, Outcome, Supervisor
from tests.support import Tenant, wait_until

pytestmark = pytest.mark.slow

MALFORMED_EVENTS: list[Any] = [
    {"type": "metric", "stage": "pretrain", "values": {"loss": 1.0}},  # no step
    {"type": "metric", "stage": "pretrain", "step": "7", "values": {"loss": 1.0}},  # a string
    {"type": "metric", "stage": "pretrain", "step": 1, "values": {"loss": "high"}},
    {"type": "checkpoint", "stage": "pretrain", "step": 1},  # no path
    {"type": "checkpoint", "stage": "p" * 31, "step": 1, "path": "/x"},  # past the column
    {"type": "spike", "stage": "pretrain", "step": 3},  # no proposal
    {"type": "stage", "stage": "pretrain", "status": "paused"},
    {
        "type": "gate",
        "stage": "pretrain",
        "battery": "b",
        "results": [{"eval": "x"}],
        "passed": True,
    },
    {"type": "log", "level": "info", "message": "hi", "extra": 1},  # unknown field
    {"type": "log", "level": "loud", "message": "hi"},
    {"type": "restart", "restarts": True},
    {"type": "done", "status": "succeeded"},  # the engine's last word is never reported
    {"type": "telepathy"},
    {"stage": "pretrain"},  # no type
    "a line",
    None,
]


def _leased_run(tenant: Tenant) -> tuple[WorkerApi, Lease, str]:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    created = tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "typed",
    )
    assert created.rc == 0, created.stdout
    key = tenant.server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )["api_key"]
    api = WorkerApi(tenant.server.url, str(key))
    lease = api.lease()
    assert lease is not None and lease.run_id == created.data["run_id"]
    return api, lease, str(key)


COUNT = {
    "run_logs": "SELECT count(*) FROM run_logs WHERE run_id = :r",
    "run_metrics": "SELECT count(*) FROM run_metrics WHERE run_id = :r",
}


def _rows(tenant: Tenant, table: str, run_id: str) -> int:
    with tenant.server.engine.connect() as conn:
        return int(conn.execute(text(COUNT[table]), {"r": run_id}).scalar_one())


def _last_beat(tenant: Tenant, run_id: str) -> Any:
    with tenant.server.engine.connect() as conn:
        return conn.execute(
            text("SELECT last_heartbeat_at FROM run_leases WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()


def _states(tenant: Tenant, run_id: str) -> list[str]:
    """Every state the run has been in, in order, ending with the current one."""
    shown = tenant.api("GET", f"/v1/runs/{run_id}")
    assert shown["ok"], shown
    return [str(e["to_state"]) for e in shown["data"]["events"] if e["to_state"]] + [
        str(shown["data"]["state"])
    ]


def test_a_malformed_report_is_refused_422_writes_nothing_and_the_lease_keeps_heartbeating(
    tenant: Tenant,
) -> None:
    api, lease, key = _leased_run(tenant)
    run_id = lease.run_id
    url = f"{tenant.server.url}/v1/worker/runs/{run_id}/report"
    headers = {"authorization": f"Bearer {key}"}
    good = LogEvent(message="before").model_dump(mode="json")
    bodies: list[Any] = [
        {"attempt": lease.attempt, "events": [good, bad]} for bad in MALFORMED_EVENTS
    ]
    bodies += [
        {"attempt": lease.attempt, "events": [good], "extra": 1},
        {"attempt": str(lease.attempt), "events": [good]},
        {"attempt": lease.attempt, "events": good},
    ]
    for body in bodies:
        response = httpx.post(url, json=body, headers=headers, timeout=30)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["code"] == "invalid_arguments"
        # The whole batch is refused: not even the good event before the bad one is written.
        assert _rows(tenant, "run_logs", run_id) == 0
        beat = api.heartbeat(run_id, lease.attempt)
        assert beat.stop is None and beat.state == "running"
    # JSON's non-standard NaN and Infinity are no numbers either.
    for raw in (
        '{"type": "metric", "stage": "pretrain", "step": 1, "values": {"loss": NaN}}',
        '{"type": "spike", "stage": "pretrain", "step": 2, "loss": Infinity, "z": 1,'
        ' "checkpoint_step": 0, "skip_steps": 2}',
    ):
        response = httpx.post(
            url,
            content=f'{{"attempt": {lease.attempt}, "events": [{raw}]}}',
            headers=headers | {"content-type": "application/json"},
            timeout=30,
        )
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_arguments"
    assert _rows(tenant, "run_metrics", run_id) == 0
    # A well-formed batch still goes through afterwards, on the same lease.
    api.report(
        run_id,
        lease.attempt,
        [
            LogEvent(message="after"),
            MetricEvent(stage="pretrain", step=1, values={"loss": 2.5, "mfu": None}),
        ],
    )
    assert _rows(tenant, "run_logs", run_id) == 1 and _rows(tenant, "run_metrics", run_id) == 1
    assert "recovering" not in _states(tenant, run_id)
    api.finish(run_id, lease.attempt, "succeeded", message="test over")
    api.close()


class PacedExecutor:
    """Stands in for the training processes: writes the events it is given to the attempt's
    events file, then exits 0 once told to."""

    def __init__(self) -> None:
        self.exit = threading.Event()
        self.killed = False

    def start(self, launch: LaunchSpec) -> None:
        raise AssertionError("the supervisor loop is driven directly here")

    def poll(self) -> int | None:
        return 0 if self.exit.is_set() else None

    def kill(self) -> None:
        self.killed = True
        self.exit.set()


POISON = "poison"


class TailWithABadEvent(EventTail):
    """The real tail, except that a log line saying ``poison`` becomes an event that did not
    go through its model's validation (as if a producer skipped it): the server, the last line
    of defence, refuses the batch carrying it."""

    def read(self) -> list[PipelineEvent]:
        bad = MetricEvent.model_construct(
            type="metric", stage="pretrain", step=-5, values={"loss": 1.0}, ts=None
        )
        return [
            bad if isinstance(e, LogEvent) and e.message == POISON else e for e in super().read()
        ]


def test_the_supervisor_drops_a_malformed_line_and_a_refused_batch_and_keeps_heartbeating(
    tenant: Tenant,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ito.worker")
    api, lease, _ = _leased_run(tenant)
    run_id, attempt = lease.run_id, lease.attempt
    events_path = tmp_path / "events.jsonl"
    executor = PacedExecutor()
    supervisor = Supervisor(api, tmp_path / "home", lambda: executor)
    outcome: list[Outcome | None] = []
    follow = threading.Thread(
        target=lambda: outcome.append(
            supervisor._follow(
                run_id,
                attempt,
                executor,
                TailWithABadEvent(events_path),
                0.2,
                ttl=30.0,
                stop_grace_s=15.0,
                stop_path=tmp_path / "stop",
            )
        ),
        daemon=True,
    )

    def write(*lines: str) -> None:
        with events_path.open("a") as handle:
            handle.write("".join(line + "\n" for line in lines))

    write(
        json.dumps({"type": "log", "level": "info", "message": "first", "ts": 1.0}),
        '{"type": "metric", "stage": "pretrain"}',  # valid JSON, not an event
        "{not json",
        json.dumps(
            {
                "type": "metric",
                "stage": "pretrain",
                "step": 1,
                "ts": 2.0,
                "values": {"loss": 3.0, "lr": 0.001},
            }
        ),
    )
    follow.start()
    # The two malformed lines are dropped, each replaced by a warning in the run's log; the
    # good events around them arrive.
    wait_until(
        lambda: (
            _rows(tenant, "run_logs", run_id) == 3 and _rows(tenant, "run_metrics", run_id) == 2
        ),
        timeout=60,
    )
    dropped = [r for r in caplog.records if r.funcName == "read"]
    assert len(dropped) == 2 and all(r.levelno == logging.WARNING for r in dropped)

    write(json.dumps({"type": "log", "level": "info", "message": POISON, "ts": 3.0}))
    # Its batch is refused (422) and dropped, not sent again.
    wait_until(
        lambda: any(
            isinstance(r.args, tuple) and "invalid_arguments" in r.args for r in caplog.records
        ),
        timeout=60,
    )
    refused_at = _last_beat(tenant, run_id)
    # The heartbeat goes on after the refusal: the lease is renewed, the run keeps running.
    wait_until(lambda: _last_beat(tenant, run_id) > refused_at, timeout=60)
    write(
        json.dumps({"type": "log", "level": "info", "message": "second", "ts": 4.0}),
        json.dumps(
            {"type": "metric", "stage": "pretrain", "step": 2, "ts": 5.0, "values": {"loss": 2.0}}
        ),
    )
    wait_until(
        lambda: (
            _rows(tenant, "run_logs", run_id) == 4 and _rows(tenant, "run_metrics", run_id) == 3
        ),
        timeout=60,
    )
    refusals = [
        r for r in caplog.records if isinstance(r.args, tuple) and "invalid_arguments" in r.args
    ]
    assert len(refusals) == 1  # dropped once, never re-sent
    write(DoneEvent(status="succeeded", ts=6.0).model_dump_json())
    executor.exit.set()
    follow.join(timeout=60)
    assert not follow.is_alive() and outcome and outcome[0] is not None
    assert outcome[0].status == "succeeded" and not executor.killed
    states = _states(tenant, run_id)
    assert states[-1] == "succeeded" and "recovering" not in states
    api.close()


def test_the_event_tail_parses_whole_lines_into_models_and_replaces_malformed_ones(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []
    secret = "sk-this-must-never-be-logged"
    path.write_text(
        json.dumps({"type": "stage", "stage": "pretrain", "status": "started"})
        + "\n"
        + json.dumps({"type": "log", "message": secret, "colour": 1})
        + "\n"
        + '{"type": "metric", "stage": "pre'
    )
    first = tail.read()
    assert [type(e).__name__ for e in first] == ["StageEvent", "LogEvent"]
    assert isinstance(first[1], LogEvent) and first[1].level == "warning"
    assert secret not in first[1].message and secret not in caplog.text
    with path.open("a") as handle:  # the half-written line is completed
        handle.write('train", "step": 4, "values": {"loss": null}}\n')
    (rest,) = tail.read()
    assert isinstance(rest, MetricEvent) and rest.step == 4 and rest.values == {"loss": None}
