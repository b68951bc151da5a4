"""The approved cost bound is a spending limit, held live (DESIGN §5.7, §7.7): a run that
outlives its estimate stops at the bound its approver signed — checkpoint committed, waiting in
``awaiting_approval`` with ``cost_bound_reached`` and the figures — and goes on only once a human
approves a new bound through its own single-use confirmation. On SQLite and PostgreSQL, with a
real server and a real ``ito-worker`` training on two processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    Tenant,
    make_tenant,
    pg_database,
    start_server,
    stop_server,
    wait_until,
)
from tests.worker.test_runtime_local import BIN, TERMINAL, _processes_of

pytestmark = pytest.mark.slow
RATE = 3.6
"""USD per GPU-hour of the booking: two "GPUs", so $0.002 a second held."""
STOP_AFTER_S = 45
"""Seconds held after which the run reaches its bound (the lease TTL is set to the estimate
minus this: the guard stops a run once held time + one TTL would cost more than the bound)."""


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ito.db'}"
    else:
        yield from pg_database()


def _manifest(t: Tenant) -> Path:
    path = t.manifest("bounded")
    document = json.loads(path.read_text())
    document["curriculum"] = document["curriculum"][:1]  # pretrain only
    document["curriculum"][0]["tokens"] = 160_000  # 156 steps of 1024 tokens
    document["budget"] = {"ceiling_usd": 5.0, "max_incremental_cost_usd": 5.0}
    path.write_text(json.dumps(document))
    return path


def _state(t: Tenant, run_id: str) -> dict[str, Any]:
    return dict(t.api("GET", f"/v1/runs/{run_id}")["data"])


def test_a_run_stops_at_its_approved_bound_and_resumes_only_with_a_new_one(
    database: str, tmp_path: Path
) -> None:
    # The estimate of this manifest on this booking, from a server with default settings.
    probe_server = start_server(database, tmp_path / "probe-home")
    try:
        probe = make_tenant(probe_server, tmp_path / "probe", "probe")
        booking = probe.booking(rate_usd_per_gpu_hour=RATE)
        estimate = probe.ito("plan", "--booking", booking, "--manifest", str(_manifest(probe)))
        seconds = estimate.data["cost"]["seconds"]
    finally:
        stop_server(probe_server)
    assert seconds > STOP_AFTER_S + 30, estimate.data["cost"]
    ttl = seconds - STOP_AFTER_S
    srv = start_server(
        database,
        tmp_path / "home",
        extra_env={"ITO_LEASE_TTL_SECONDS": f"{ttl:.3f}", "ITO_HEARTBEAT_SECONDS": "1"},
    )
    worker: subprocess.Popen[bytes] | None = None
    try:
        t = make_tenant(srv, tmp_path / "t", "bounded")
        booking = t.booking(rate_usd_per_gpu_hour=RATE)
        manifest = _manifest(t)
        # The requester asks for the tightest bound that lets the run start: its expected cost
        # (by default the approver signs the estimate's upper bound).
        expected = estimate.data["cost"]["cost_usd"]
        assert estimate.data["cost"]["upper_cost_usd"] > expected
        run_id = t.train(manifest, "bounded-1", booking_id=booking, cost_bound=expected)
        bound = _state(t, run_id)["cost_bound_usd"]
        assert bound == pytest.approx(expected, abs=0.011)
        key = srv.desk(
            "/v1/desk/keys", {"account_id": t.account_id, "role": "worker", "booking_id": booking}
        )["api_key"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")} | {
            "ITO_API_URL": srv.url,
            "ITO_API_KEY": key,
            "ITO_HOME": str(tmp_path / "worker-home"),
            "ITO_FAULT_INJECTION": json.dumps({"min_step_seconds": 0.5}),
        }
        worker = subprocess.Popen(
            [str(BIN / "ito-worker"), "--booking", booking, "--poll-seconds", "0.5"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        waiting = wait_until(
            lambda: (s := _state(t, run_id))["state"] in {"awaiting_approval", *TERMINAL} and s,
            timeout=300,
            interval=0.5,
        )
        assert waiting["state"] == "awaiting_approval", waiting
        proposal = waiting["latest_event"]["data"]
        assert proposal["reason"] == "cost_bound_reached"
        assert proposal["bound_usd"] == bound
        assert 0 < proposal["spent_usd"] <= bound
        assert proposal["estimate_to_finish_usd"] > 0
        wait_until(lambda: not _processes_of(run_id), timeout=60)
        # Spend never passed the bound; the step where it stopped is committed.
        telemetry = t.ito("telemetry", "--run", run_id).data
        assert telemetry["cost_usd"] <= bound
        assert telemetry["interruptions"] == 0
        losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
        stopped_at = max(p["step"] for p in losses)
        assert 1 <= stopped_at < 156
        checkpoints = t.ito("runs", "checkpoints", run_id).data["checkpoints"]
        assert max(c["step"] for c in checkpoints) == stopped_at

        # Nothing moves without a new bound: a bound at or under the spend, a confirmation not
        # yet approved, another action's confirmation — each refused, the run still waits.
        low = t.ito(
            "confirm", "--action", "raise-bound", "--run", run_id, "--cost-bound", str(bound)
        )
        assert low.code == "invalid_arguments"
        over = t.ito("confirm", "--action", "raise-bound", "--run", run_id, "--cost-bound", "9")
        assert over.code == "budget_exceeded"
        ref = t.ito(
            "confirm", "--action", "raise-bound", "--run", run_id, "--cost-bound", "4"
        ).data["confirmation_ref"]
        early = t.ito(
            "runs", "raise-bound", run_id, "--confirmation-ref", ref, "--idempotency-key", "r-1"
        )
        assert early.code == "confirmation_pending"
        cancel_ref = t.ito("confirm", "--action", "cancel", "--run", run_id).data[
            "confirmation_ref"
        ]
        assert t.ito("approve", cancel_ref, key="approver").rc == 0
        wrong = t.ito(
            "runs",
            "raise-bound",
            run_id,
            "--confirmation-ref",
            cancel_ref,
            "--idempotency-key",
            "r-2",
        )
        assert wrong.code == "confirmation_mismatch"
        assert _state(t, run_id)["state"] == "awaiting_approval"

        assert t.ito("approve", ref, key="approver").rc == 0
        raised = t.ito(
            "runs", "raise-bound", run_id, "--confirmation-ref", ref, "--idempotency-key", "r-1"
        )
        assert raised.rc == 0 and raised.data["state"] == "recovering", raised.data
        final = wait_until(
            lambda: (s := _state(t, run_id))["state"] in TERMINAL and s, timeout=300, interval=0.5
        )
        assert final["state"] == "succeeded", final
        assert final["cost_bound_usd"] == 4.0
        # The second attempt went on from the committed step: every step trained once.
        losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
        assert sorted(p["step"] for p in losses) == list(range(1, 157))
        assert min(p["step"] for p in losses if p["attempt"] == 2) == stopped_at + 1
        assert t.ito("telemetry", "--run", run_id).data["cost_usd"] <= 4.0
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        stop_server(srv)
