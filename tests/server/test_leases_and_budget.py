"""Leases and the running budget at the service level, on the real store of both backends, with
an explicit clock: time held accrues cost, through the attempt's finish (not only to its last
heartbeat); before the next interval would cross the ceiling the worker is told to stop; an
expired lease becomes ``recovering`` and the next lease resumes; goodput is productive time ÷
the whole time held, never clamped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.pipeline_events import CheckpointEvent, CheckpointRef, MetricEvent, SpikeEvent
from ito.server.services.bookings import set_booking_state
from ito.server.services.credentials import AuthContext, authenticate
from ito.server.services.leases import (
    LeaseSettings,
    expire_leases,
    finish_run,
    heartbeat,
    lease_next,
    report,
)
from ito.server.services.telemetry import booking_telemetry, run_telemetry
from ito.server.store.db import Database
from ito.server.store.runtime_tables import RunLease
from ito.server.store.tables import Booking, Run, utcnow
from tests.support import Tenant

pytestmark = pytest.mark.slow
SETTINGS = LeaseSettings(ttl_seconds=30, heartbeat_seconds=5)


def _run_with_worker(tenant: Tenant, rate: float, *, bounded: bool = False):  # type: ignore[no-untyped-def]
    """A run on a booking at ``rate``, the database and a worker of the booking. ``bounded``:
    the requester asked for the tightest cost bound, the expected cost (below the manifest's
    limits), rather than the server's default."""
    booking = tenant.booking(rate_usd_per_gpu_hour=rate)
    manifest = tenant.manifest()
    bound = None
    if bounded:
        plan = tenant.ito("plan", "--booking", booking, "--manifest", str(manifest)).data
        bound = plan["cost"]["cost_usd"]
    run_id = tenant.train(manifest, "k", booking_id=booking, cost_bound=bound)
    key = tenant.server.desk(
        "/v1/desk/keys", {"account_id": tenant.account_id, "role": "worker", "booking_id": booking}
    )
    db = Database(tenant.server.database_url)
    with db.read() as session:
        worker = authenticate(session, tenant.server.env["ITO_PEPPER"], key["api_key"])
    assert isinstance(worker, AuthContext)
    return db, worker, run_id


def test_cost_accrues_while_held_and_the_worker_is_stopped_before_the_ceiling(
    tenant: Tenant,
) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=8.0)
    now = utcnow()
    with db.write() as session:
        leased = lease_next(session, worker, SETTINGS, now)
    assert leased is not None and leased["run_id"] == run_id
    stops, costs = [], []
    for beat in range(1, 40):
        with db.write() as session:
            answer = heartbeat(
                session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=30 * beat)
            )
        stops.append(answer["stop"])
        costs.append(answer["cost_usd"])
        if answer["stop"]:
            break
    assert stops[-1] == "budget" and set(stops[:-1]) == {None}
    ceiling = 5.0
    assert costs[-1] <= ceiling  # stopped before crossing, not after
    # 2 accelerators × $8/h for 30 s per beat.
    assert costs[0] == pytest.approx(30 / 3600 * 2 * 8.0, abs=1e-6)
    db.dispose()


def test_an_expired_lease_goes_recovering_and_the_next_lease_resumes(tenant: Tenant) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=0.5)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    with db.write() as session:
        assert expire_leases(session, now + timedelta(seconds=29)) == 0
    with db.write() as session:
        assert expire_leases(session, now + timedelta(seconds=31)) == 1
    with db.read() as session:
        run = session.get(Run, run_id)
        lease = session.get(RunLease, run_id)
        assert run is not None and run.state == "recovering"
        assert lease is not None and lease.interruptions == 1
    # The old holder's attempt is dead: its heartbeat is refused.
    with pytest.raises(ItoError) as lost, db.write() as session:
        heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=32))
    assert lost.value.code == "lease_lost"
    with db.write() as session:
        again = lease_next(session, worker, SETTINGS, now + timedelta(seconds=33))
    assert again is not None and again["attempt"] == 2 and again["resuming"] is True
    with db.read() as session:
        lease = session.get(RunLease, run_id)
        # The outage (31 s undetected + 2 s waiting for a worker) is time held, not cost.
        assert lease is not None and lease.busy_seconds == pytest.approx(33.0)
        assert lease.cost_usd == 0.0
    db.dispose()


def test_booking_telemetry_sums_unrounded_run_figures_and_counts_a_recomputed_step_once(
    tenant: Tenant,
) -> None:

    booking = tenant.booking()
    key = tenant.server.desk(
        "/v1/desk/keys", {"account_id": tenant.account_id, "role": "worker", "booking_id": booking}
    )
    db = Database(tenant.server.database_url)
    with db.read() as session:
        worker = authenticate(session, tenant.server.env["ITO_PEPPER"], key["api_key"])
    assert isinstance(worker, AuthContext)
    now = utcnow()
    # Step durations below the millisecond the figures are shown with, so that summing rounded
    # per-run figures would give another booking goodput: 3 × 0.3 ms in 1 s held (run one);
    # 2 × 0.4 ms plus one step recomputed after an expired lease, in 2 s held (run two).
    plans = [
        (1.0, [(1, 1, 0.0003), (2, 1, 0.0003), (3, 1, 0.0003)]),
        (2.0, [(1, 1, 0.0004), (2, 1, 9.0), (2, 2, 0.0004)]),
    ]
    run_ids = []
    for index, (held, steps) in enumerate(plans):
        manifest = tenant.manifest(f"m{index}")
        run_id = tenant.train(manifest, f"k{index}", booking_id=booking)
        run_ids.append(run_id)
        start = now + timedelta(seconds=100 * index)
        with db.write() as session:
            leased = lease_next(session, worker, SETTINGS, start)
        assert leased is not None and leased["run_id"] == run_id
        for attempt in sorted({a for _, a, _ in steps}):
            if attempt > 1:  # the first attempt died; its step 2 is recomputed
                with db.write() as session:
                    expire_leases(session, start + timedelta(seconds=31))
                with db.write() as session:
                    assert (
                        lease_next(session, worker, SETTINGS, start + timedelta(seconds=32))
                        is not None
                    )
            with db.write() as session:
                report(
                    session,
                    worker,
                    run_id,
                    attempt,
                    [
                        MetricEvent(stage="pretrain", step=step, values={"step_seconds": seconds})
                        for step, a, seconds in steps
                        if a == attempt
                    ],
                    now=start + timedelta(seconds=32 if attempt > 1 else 0),
                )
        with db.write() as session:
            last = max(a for _, a, _ in steps)
            beat_from = start + timedelta(seconds=32) if last > 1 else start
            lease = session.get(RunLease, run_id)
            assert lease is not None
            lease.last_heartbeat_at = beat_from
            heartbeat(session, worker, SETTINGS, run_id, last, beat_from + timedelta(seconds=held))
        with db.write() as session:
            finish_run(
                session,
                worker,
                run_id,
                last,
                "succeeded",
                None,
                "done",
                now=beat_from + timedelta(seconds=held),
            )

    with db.read() as session:
        runs = [run_telemetry(session, tenant.account_id, r) for r in run_ids]
        total = booking_telemetry(session, tenant.account_id, booking)
    # Step 2 of run two counts once, with its latest attempt's duration (not 9 s).
    assert runs[1]["productive_seconds"] < 0.01
    # Run two's outage (31 s until the expiry, 1 s until the next lease) is time held.
    assert [r["wall_seconds_held"] for r in runs] == [1.0, 2.0 + 32.0]
    assert runs[1]["interruptions"] == 1 and total["interruptions"] == 1
    assert total["runs"] == 2 and total["wall_seconds_held"] == 35.0
    assert total["goodput"] == round((3 * 0.0003 + 2 * 0.0004) / 35.0, 4)
    assert [r["run_id"] for r in total["per_run"]] == run_ids
    db.dispose()


def test_a_single_run_booking_reports_exactly_the_run_figures(tenant: Tenant) -> None:

    db, worker, run_id = _run_with_worker(tenant, rate=1.0)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    with db.write() as session:
        report(
            session,
            worker,
            run_id,
            1,
            [
                MetricEvent(stage="pretrain", step=s, values={"step_seconds": 0.0003})
                for s in range(1, 6)
            ],
            now=now,
        )
    with db.write() as session:
        heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=1))
    with db.read() as session:
        run = run_telemetry(session, tenant.account_id, run_id)
        assert worker.booking_id is not None
        booking = booking_telemetry(session, tenant.account_id, worker.booking_id)
    assert run["goodput"] == round(5 * 0.0003 / 1.0, 4)
    for field in (
        "goodput",
        "wall_seconds_held",
        "productive_seconds",
        "cost_usd",
        "interruptions",
        "checkpoint_bandwidth_bytes_per_s",
    ):
        assert booking[field] == run[field], field
    db.dispose()


def test_a_revoked_booking_fails_its_waiting_runs_and_stops_the_running_one(
    tenant: Tenant,
) -> None:

    db, worker, run_id = _run_with_worker(tenant, rate=0.5)
    assert worker.booking_id is not None
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    # A second run of the booking waits in the queue.
    manifest = tenant.manifest("second")
    ref = tenant.approved_confirmation(manifest, booking_id=worker.booking_id)
    queued = tenant.ito(
        "train",
        "--booking",
        worker.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "k2",
    ).data["run_id"]
    with db.write() as session:
        set_booking_state(session, worker.booking_id, "revoked")
    # The running one is told to stop (with a checkpoint), with the booking's code...
    with db.write() as session:
        beat = heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=5))
    assert beat["stop"] == "booking" and beat["stop_code"] == "booking_revoked"
    # ...and nothing more starts: the waiting run fails closed instead of being leased.
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now + timedelta(seconds=6)) is None
    with db.read() as session:
        waiting = session.get(Run, queued)
        assert waiting is not None and waiting.state == "failed"
        assert waiting.failure_code == "booking_revoked"
    db.dispose()


def test_a_run_is_stopped_a_lease_ttl_before_the_term_ends(tenant: Tenant) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=0.5)

    with db.read() as session:
        booking = session.get(Booking, worker.booking_id)
        assert booking is not None
        term_end = booking.term_end
    start = term_end - timedelta(seconds=100)
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, start) is not None
    with db.write() as session:  # 60 s left: more than one TTL (30 s)
        assert (
            heartbeat(session, worker, SETTINGS, run_id, 1, term_end - timedelta(seconds=60))[
                "stop"
            ]
            is None
        )
    with db.write() as session:  # 20 s left: the next beat could come after the end
        beat = heartbeat(session, worker, SETTINGS, run_id, 1, term_end - timedelta(seconds=20))
    assert beat["stop"] == "booking" and beat["stop_code"] == "booking_expired"
    db.dispose()


def _steps(seconds: list[float]) -> list[MetricEvent]:
    return [
        MetricEvent(stage="pretrain", step=step, values={"step_seconds": value})
        for step, value in enumerate(seconds, start=1)
    ]


def test_goodput_time_held_and_cost_count_through_the_attempts_finish(tenant: Tenant) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=8.0)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    with db.write() as session:
        report(session, worker, run_id, 1, _steps([10.0, 10.0, 10.0, 10.0]), now=now)
    with db.write() as session:
        heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=30))
    # The last 20 s — final steps, the final checkpoint, the exit — come after the last beat.
    with db.write() as session:
        finish_run(
            session,
            worker,
            run_id,
            1,
            "succeeded",
            None,
            "done",
            now=now + timedelta(seconds=50),
        )
    with db.read() as session:
        figures = run_telemetry(session, tenant.account_id, run_id)
        lease = session.get(RunLease, run_id)
        assert lease is not None
        productive, held = 40.0, lease.busy_seconds
    assert held == pytest.approx(50.0)
    assert figures["wall_seconds_held"] == 50.0 and figures["productive_seconds"] == 40.0
    assert figures["goodput"] == pytest.approx(productive / held, abs=5e-5)
    # 2 accelerators × $8/h for every second held, the tail included.
    assert figures["cost_usd"] == pytest.approx(50 / 3600 * 2 * 8.0, abs=1e-6)
    db.dispose()


def test_a_heartbeat_that_came_late_counts_all_the_time_held(tenant: Tenant) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=8.0)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    # 45 s after the lease (TTL 30 s) but before any expiry was run: the lease is still held.
    with db.write() as session:
        answer = heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=45))
    assert answer["cost_usd"] == pytest.approx(45 / 3600 * 2 * 8.0, abs=1e-6)
    with db.read() as session:
        lease = session.get(RunLease, run_id)
        assert lease is not None and lease.busy_seconds == pytest.approx(45.0)
    db.dispose()


def test_a_loss_spike_ends_the_attempt_with_its_tail_accounted(tenant: Tenant) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=8.0)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    with db.write() as session:
        heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=10))
    spike = SpikeEvent(stage="pretrain", step=7, loss=9.0, z=8.0, checkpoint_step=5, skip_steps=2)
    with db.write() as session:
        report(session, worker, run_id, 1, [spike], now=now + timedelta(seconds=25))
    with db.read() as session:
        run = session.get(Run, run_id)
        lease = session.get(RunLease, run_id)
        assert run is not None and run.state == "awaiting_approval"
        assert lease is not None and lease.busy_seconds == pytest.approx(25.0)
        assert lease.cost_usd == pytest.approx(25 / 3600 * 2 * 8.0, abs=1e-6)
    db.dispose()


def test_goodput_is_never_clamped_so_an_inconsistency_shows(tenant: Tenant) -> None:
    """Steps that claim more time than the run held are an accounting bug: the figure says
    so (above 1) instead of being cut to 1."""
    db, worker, run_id = _run_with_worker(tenant, rate=1.0)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    with db.write() as session:
        report(session, worker, run_id, 1, _steps([15.0, 15.0]), now=now)
    with db.write() as session:
        finish_run(
            session, worker, run_id, 1, "succeeded", None, "done", now=now + timedelta(seconds=20)
        )
    with db.read() as session:
        figures = run_telemetry(session, tenant.account_id, run_id)
    assert figures["goodput"] == 1.5
    db.dispose()


def test_a_run_waits_at_its_approved_bound_and_goes_on_only_with_a_new_one(
    tenant: Tenant,
) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=8.0, bounded=True)
    with db.read() as session:
        created = session.get(Run, run_id)
        assert created is not None and created.cost_bound_usd is not None
        bound = created.cost_bound_usd
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    answers = []
    for beat in range(1, 200):
        with db.write() as session:
            answers.append(
                heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=5 * beat))
            )
        if answers[-1]["stop"]:
            break
    # Stopped at the human's bound (not the manifest's ceiling), before crossing it.
    assert answers[-1]["stop"] == "cost_bound"
    assert answers[-1]["stop_code"] == "cost_bound_reached"
    assert all(a["cost_usd"] <= bound for a in answers)
    stopped_at = now + timedelta(seconds=5 * len(answers))
    with db.write() as session:
        finish_run(
            session,
            worker,
            run_id,
            1,
            "awaiting_approval",
            "cost_bound_reached",
            "checkpoint committed at step 7",
            now=stopped_at + timedelta(seconds=2),
        )
    status = tenant.ito("status", "--run", run_id).data
    assert status["state"] == "awaiting_approval" and status["failure_code"] is None
    waiting = status["latest_event"]["data"]
    assert waiting["reason"] == "cost_bound_reached" and waiting["bound_usd"] == bound
    assert 0 < waiting["spent_usd"] <= bound and waiting["estimate_to_finish_usd"] > 0
    # Waiting holds nothing and no worker may take it.
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, stopped_at + timedelta(minutes=5)) is None
    # A restart confirmation is not a new bound; a bound at the spend is refused.
    assert (
        tenant.ito("confirm", "--action", "restart", "--run", run_id, "--checkpoint", "7").code
        == "confirmation_mismatch"
    )
    low = tenant.ito(
        "confirm", "--action", "raise-bound", "--run", run_id, "--cost-bound", f"{bound:.2f}"
    )
    assert low.code == "invalid_arguments"
    ref = tenant.ito(
        "confirm", "--action", "raise-bound", "--run", run_id, "--cost-bound", "2"
    ).data["confirmation_ref"]
    assert tenant.ito("approve", ref, key="approver").rc == 0
    raised = tenant.ito(
        "runs", "raise-bound", run_id, "--confirmation-ref", ref, "--idempotency-key", "up"
    )
    assert raised.rc == 0 and raised.data["state"] == "recovering"
    again = tenant.ito(
        "runs", "raise-bound", run_id, "--confirmation-ref", ref, "--idempotency-key", "up"
    )
    assert again.rc == 0 and again.data["replayed"] is True
    resumed_at = stopped_at + timedelta(minutes=10)
    with db.write() as session:
        leased = lease_next(session, worker, SETTINGS, resumed_at)
    assert leased is not None and leased["attempt"] == 2 and leased["restart_from"] is None
    with db.write() as session:
        resumed = heartbeat(session, worker, SETTINGS, run_id, 2, resumed_at + timedelta(seconds=5))
    assert resumed["stop"] is None
    with db.read() as session:
        lease = session.get(RunLease, run_id)
        assert lease is not None
        # The human's ten minutes were not time held, nor an interruption.
        assert lease.busy_seconds == pytest.approx(5.0 * len(answers) + 2 + 5)
        assert lease.interruptions == 0
        run = session.get(Run, run_id)
        assert run is not None and run.cost_bound_usd == 2.0
    db.dispose()


def test_tokens_per_s_is_weighted_by_time_and_lost_steps_are_not_productive(
    tenant: Tenant,
) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=1.0)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    steps = [(1, 1000.0, 1.0), (2, 1000.0, 9.0), (3, 1000.0, 1.0), (4, 1000.0, 1.0)]
    metrics: list[Any] = [
        MetricEvent(
            stage="pretrain",
            step=step,
            values={
                "step_seconds": seconds,
                "tokens": tokens,
                "tokens_per_s": tokens / seconds,
            },
        )
        for step, tokens, seconds in steps
    ]
    commits = [
        CheckpointEvent(stage="pretrain", step=1, path="/x/1"),
        CheckpointEvent(stage="pretrain", step=2, path="/x/2"),
        # Step 3's commit, and the keep-last policy deleting step 1's.
        CheckpointEvent(
            stage="pretrain",
            step=3,
            path="/x/3",
            pruned=[CheckpointRef(stage="pretrain", step=1)],
        ),
    ]
    with db.write() as session:
        report(session, worker, run_id, 1, metrics + commits, now=now)
    with db.read() as session:
        running = run_telemetry(session, tenant.account_id, run_id)
    # 4,000 tokens in 12 s: not the mean of the per-step rates (~778/s).
    assert running["tokens_per_s"] == pytest.approx(4000 / 12)
    assert running["productive_seconds"] == 12.0
    listed = {
        c["step"]: c["deleted"]
        for c in tenant.ito("runs", "checkpoints", run_id).data["checkpoints"]
    }
    assert listed == {1: True, 2: False, 3: False}
    with db.write() as session:
        finish_run(session, worker, run_id, 1, "failed", "pipeline_crashed", "crashed", now=now)
    with db.read() as session:
        failed = run_telemetry(session, tenant.account_id, run_id)
    # Step 4 came after the last commit (step 3) of a run that failed: lost, not productive.
    assert failed["productive_seconds"] == 11.0
    assert failed["tokens_per_s"] == pytest.approx(3000 / 11)
    db.dispose()
