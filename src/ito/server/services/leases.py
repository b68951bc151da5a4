"""The worker side of a run (DESIGN §7.1): leasing queued runs of the worker's booking, renewing
the lease by heartbeat (and accounting the time held, through the attempt's finish), ingesting
what the run reports, finishing it, and turning expired leases into ``recovering`` so another
attempt resumes the run.

Every state change goes through :func:`ito.server.services.runs.transition_run`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.gates import check_eligibility
from ito.core.pipeline_events import (
    CheckpointEvent,
    ExportEvent,
    GateEvent,
    LogEvent,
    MeshEvent,
    MetricEvent,
    ReportedEvent,
    RestartEvent,
    SpikeEvent,
    StageEvent,
)
from ito.core.states import RunState
from ito.server.services.bookings import booking_view
from ito.server.services.credentials import AuthContext
from ito.server.services.metric_buckets import record_points
from ito.server.services.run_events import record_event
from ito.server.services.run_progress import run_progress, stages_completed
from ito.server.services.runs import transition_run
from ito.server.services.spending import spend_limits
from ito.server.store.runtime_tables import CheckpointRow, RunLease, RunLog
from ito.server.store.tables import Booking, ManifestRow, Run, RunEvent, utcnow

__all__ = [
    "LeaseSettings",
    "expire_leases",
    "finish_run",
    "heartbeat",
    "lease_for",
    "lease_next",
    "report",
]

_LEASABLE = (RunState.queued.value, RunState.recovering.value)
_MAX_LOG_CHARS = 4000


class LeaseSettings:
    def __init__(self, ttl_seconds: float, heartbeat_seconds: float) -> None:
        self.ttl = timedelta(seconds=ttl_seconds)
        self.heartbeat_seconds = heartbeat_seconds


def lease_for(session: Session, run: Run) -> RunLease:
    lease = session.get(RunLease, run.id)
    if lease is None:
        lease = RunLease(
            run_id=run.id,
            account_id=run.account_id,
            booking_id=run.booking_id,
            attempt=0,
            busy_seconds=0.0,
            productive_seconds=0.0,
            interruptions=0,
            cost_usd=0.0,
            bytes_freed=0,
            updated_at=utcnow(),
        )
        session.add(lease)
        session.flush()
    return lease


def expire_leases(session: Session, now: datetime, booking_id: str | None = None) -> int:
    """Runs whose holder stopped heartbeating go ``recovering``; returns how many."""
    query = select(RunLease).where(
        RunLease.lease_expires_at.is_not(None), RunLease.lease_expires_at < now
    )
    if booking_id is not None:
        query = query.where(RunLease.booking_id == booking_id)
    expired = 0
    for lease in session.scalars(query.with_for_update()):
        run = session.get(Run, lease.run_id)
        assert run is not None
        lease.lease_expires_at = None
        lease.worker_principal_id = None
        if run.state in (RunState.running.value, RunState.awaiting_approval.value):
            lease.interruptions += 1
            # The dead attempt held the booking until now without making progress: the outage
            # counts as time held (goodput's denominator), not as cost.
            if lease.last_heartbeat_at is not None:
                lease.busy_seconds += max((now - lease.last_heartbeat_at).total_seconds(), 0.0)
            lease.last_heartbeat_at = now
            transition_run(
                session,
                run,
                RunState.recovering,
                reason="the worker stopped heartbeating; the run will resume from "
                "its last committed checkpoint",
                data={"attempt": lease.attempt},
            )
            expired += 1
        elif run.state == RunState.cancelling.value:
            transition_run(session, run, RunState.cancelled, reason="cancelled; the worker is gone")
    return expired


def lease_next(
    session: Session, worker: AuthContext, settings: LeaseSettings, now: datetime
) -> dict[str, Any] | None:
    """The oldest leasable run of the worker's booking, now held by this worker."""
    assert worker.booking_id is not None
    expire_leases(session, now, worker.booking_id)
    booking_row = session.get(Booking, worker.booking_id)
    assert booking_row is not None
    try:
        check_eligibility(booking_view(booking_row), now)
    except ItoError as ineligible:
        # Fail closed: no run starts or resumes on a booking the buyer no longer holds.
        for waiting in session.scalars(
            select(Run)
            .where(
                Run.booking_id == worker.booking_id,
                Run.account_id == worker.account_id,
                Run.state.in_(_LEASABLE),
            )
            .with_for_update()
        ):
            transition_run(
                session,
                waiting,
                RunState.failed,
                failure_code=ineligible.code,
                reason=f"not started: the booking is no longer usable ({ineligible.code})",
            )
        return None
    run = session.scalar(
        select(Run)
        .where(
            Run.booking_id == worker.booking_id,
            Run.account_id == worker.account_id,
            Run.state.in_(_LEASABLE),
        )
        .order_by(Run.created_at, Run.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if run is None:
        return None
    lease = lease_for(session, run)
    resuming = run.state == RunState.recovering.value
    approved = bool(
        lease.proposal and lease.proposal.get("approved") and not lease.proposal.get("applied")
    )
    approved_restart = approved and (lease.proposal or {}).get("action") == (
        "restart_from_checkpoint"
    )
    if resuming and not approved and lease.last_heartbeat_at is not None:
        # From the expiry to this lease the run still held the booking, waiting for a worker.
        # (After a loss spike or at the cost bound the wait was a human's decision, not an
        # outage.)
        lease.busy_seconds += max((now - lease.last_heartbeat_at).total_seconds(), 0.0)
    lease.attempt += 1
    lease.worker_principal_id = worker.principal_id
    lease.lease_expires_at = now + settings.ttl
    lease.last_heartbeat_at = now
    lease.updated_at = now
    transition_run(
        session,
        run,
        RunState.running,
        reason=f"leased by a worker (attempt {lease.attempt})"
        + ("; resuming from the last committed checkpoint" if resuming else ""),
        data={"attempt": lease.attempt},
    )
    manifest = session.scalar(
        select(ManifestRow).where(
            ManifestRow.account_id == run.account_id, ManifestRow.digest == run.manifest_digest
        )
    )
    booking = booking_row
    assert manifest is not None
    restart = None
    if approved_restart:
        assert lease.proposal is not None
        restart = {
            "step": lease.proposal["checkpoint_step"],
            "skip_steps": lease.proposal["skip_steps"],
        }
    if approved:
        assert lease.proposal is not None
        lease.proposal = dict(lease.proposal) | {"applied": True}
    return {
        "run_id": run.id,
        "attempt": lease.attempt,
        "resuming": resuming,
        "restart_from": restart,
        "manifest_b64": _b64(manifest.content),
        "manifest_id": run.manifest_digest,
        "checkpoint_uri": run.checkpoint_uri,
        "booking": {
            "booking_id": booking.id,
            "gpu": booking.gpu,
            "nodes": booking.nodes,
            "gpus_per_node": booking.gpus_per_node,
            "node_inventory": booking.node_inventory,
            "storage_uri": booking.storage_uri,
        },
        "lease_ttl_s": settings.ttl.total_seconds(),
        "heartbeat_s": settings.heartbeat_seconds,
        "parallelism": (run.estimate or {}).get("parallelism"),
        "initial_weights": (run.estimate or {}).get("initial_weights"),
        "provenance_sha256": run.provenance_sha256,
        "recorded_checkpoints": recorded_checkpoints(session, run),
    }


def recorded_checkpoints(session: Session, run: Run) -> list[str]:
    """Digests of the run's checkpoints still on disk, as its engine reported them: the only
    ones a later attempt may resume from (anything else in its storage was not written by
    it)."""
    live = {
        (stage, step)
        for stage, step in session.execute(
            select(CheckpointRow.stage, CheckpointRow.step).where(
                CheckpointRow.run_id == run.id,
                CheckpointRow.account_id == run.account_id,
                CheckpointRow.deleted_at.is_(None),
            )
        )
    }
    if not live:
        return []
    digests: list[str] = []
    for (data,) in session.execute(
        select(RunEvent.data).where(
            RunEvent.run_id == run.id,
            RunEvent.account_id == run.account_id,
            RunEvent.kind == "checkpoint",
        )
    ):
        data = data or {}
        if (data.get("stage"), data.get("step")) in live and isinstance(data.get("sha256"), str):
            digests.append(str(data["sha256"]))
    return sorted(set(digests))


def held_lease(
    session: Session, worker: AuthContext, run_id: str, attempt: int
) -> tuple[Run, RunLease]:
    run = session.scalar(
        select(Run)
        .where(
            Run.id == run_id,
            Run.booking_id == worker.booking_id,
            Run.account_id == worker.account_id,
        )
        .with_for_update()
    )
    if run is None:
        raise ItoError("run_not_found")
    lease = session.get(RunLease, run.id)
    if (
        lease is None
        or lease.attempt != attempt
        or lease.worker_principal_id != worker.principal_id
        or lease.lease_expires_at is None
    ):
        raise ItoError("lease_lost", run_id=run.id, attempt=attempt)
    return run, lease


def _account_held(lease: RunLease, booking: Booking, now: datetime) -> None:
    """Count the time the holder held the booking since its last beat — held time and cost,
    all of it: a beat that came late still held the booking until ``now``. The attempt's end
    (its finish, a loss spike) is accounted the same way, so nothing after the last beat is
    left out of goodput's denominator or out of the bill. A wall clock stepped back counts
    nothing, never negative time."""
    if lease.last_heartbeat_at is not None:
        held = max((now - lease.last_heartbeat_at).total_seconds(), 0.0)
        lease.busy_seconds += held
        lease.cost_usd += (
            held / 3600.0 * booking.nodes * booking.gpus_per_node * booking.rate_usd_per_gpu_hour
        )
    lease.last_heartbeat_at = now


def heartbeat(
    session: Session,
    worker: AuthContext,
    settings: LeaseSettings,
    run_id: str,
    attempt: int,
    now: datetime,
) -> dict[str, Any]:
    """Renew the lease, account the time held since the last beat, say what the run must do."""
    run, lease = held_lease(session, worker, run_id, attempt)
    booking = session.get(Booking, run.booking_id)
    assert booking is not None
    _account_held(lease, booking, now)
    lease.lease_expires_at = now + settings.ttl
    lease.updated_at = now
    hard, bound = spend_limits(run)
    # Until the next beat the run may hold the booking up to the lease TTL: stop while even
    # that worst case stays under the limits.
    next_interval = (
        settings.ttl.total_seconds()
        / 3600.0
        * booking.nodes
        * booking.gpus_per_node
        * booking.rate_usd_per_gpu_hour
    )
    stop, stop_code = None, None
    try:
        check_eligibility(booking_view(booking), now)
    except ItoError as ineligible:
        stop_code = ineligible.code
    else:
        if booking.term_end - now < settings.ttl:
            stop_code = "booking_expired"  # the term would end before the next beat
    if run.state == RunState.cancelling.value:
        stop = "cancel"
    elif stop_code is not None:
        stop = "booking"
    elif lease.cost_usd + next_interval > min(hard, bound):
        if bound < hard:
            # The human's bound, not the manifest's: the run checkpoints and waits for a new
            # bound to be approved (or a cancel), rather than failing.
            stop, stop_code = "cost_bound", "cost_bound_reached"
        else:
            stop, stop_code = "budget", "budget_exceeded"
    return {
        "run_id": run.id,
        "state": run.state,
        "stop": stop,
        "stop_code": stop_code,
        "lease_expires_at": lease.lease_expires_at.isoformat(),
        "cost_usd": round(lease.cost_usd, 6),
    }


def report(
    session: Session,
    worker: AuthContext,
    run_id: str,
    attempt: int,
    events: Sequence[ReportedEvent],
    *,
    now: datetime,
) -> dict[str, int]:
    """Ingest a batch of the pipeline's events (already validated), in order. A loss spike
    ends the attempt at ``now``: the time held until then is accounted before the lease is
    let go."""
    run, lease = held_lease(session, worker, run_id, attempt)
    counts = {"logs": 0, "metrics": 0, "checkpoints": 0, "events": 0}
    points: list[tuple[str, int, str, float]] = []
    for item in events:
        if isinstance(item, LogEvent):
            session.add(
                RunLog(
                    run_id=run.id,
                    account_id=run.account_id,
                    attempt=attempt,
                    level=item.level,
                    message=item.message[:_MAX_LOG_CHARS],
                )
            )
            counts["logs"] += 1
        elif isinstance(item, MetricEvent):
            for name, value in item.values.items():
                if value is not None:  # a figure that is not finite or not known
                    points.append((item.stage, item.step, name, float(value)))
                    counts["metrics"] += 1
        elif isinstance(item, CheckpointEvent):
            session.add(
                CheckpointRow(
                    run_id=run.id,
                    account_id=run.account_id,
                    attempt=attempt,
                    stage=item.stage,
                    step=item.step,
                    path=item.path,
                    bytes=item.bytes,
                    seconds=item.seconds,
                )
            )
            if item.productive_seconds is not None:
                lease.productive_seconds = max(lease.productive_seconds, item.productive_seconds)
            if item.pruned:
                session.flush()  # the pruned checkpoints' rows may be in this same batch
            for gone in item.pruned or []:
                session.execute(
                    update(CheckpointRow)
                    .where(
                        CheckpointRow.run_id == run.id,
                        CheckpointRow.stage == gone.stage,
                        CheckpointRow.step == gone.step,
                        CheckpointRow.deleted_at.is_(None),
                    )
                    .values(deleted_at=now)
                )
            record_event(
                session,
                run,
                "checkpoint",
                f"checkpoint committed at step {item.step} ({item.stage})",
                data={
                    "stage": item.stage,
                    "step": item.step,
                    "bytes": item.bytes,
                    "seconds": item.seconds,
                    # What a later run's ``run:<id>@<step>`` revision is checked against.
                    **({"sha256": item.sha256} if item.sha256 is not None else {}),
                },
            )
            counts["checkpoints"] += 1
        elif isinstance(item, StageEvent):
            if item.status == "started":
                run.stage = item.stage
            early = (
                {"steps_taken": item.steps_taken, "skipped_steps": item.skipped_steps}
                if item.steps_taken is not None
                else {}
            )
            record_event(
                session,
                run,
                "stage",
                f"stage {item.stage} {item.status}"
                + (
                    f" early, after {item.steps_taken} step(s) ({item.skipped_steps} skipped: "
                    "no group whose rewards differ)"
                    if early
                    else ""
                ),
                data={"stage": item.stage, "status": item.status} | early,
            )
            counts["events"] += 1
        elif isinstance(item, SpikeEvent):
            proposal = {
                "action": "restart_from_checkpoint",
                "stage": item.stage,
                "spike_step": item.step,
                "loss": item.loss,
                "z": item.z,
                "checkpoint_step": item.checkpoint_step,
                "skip_steps": item.skip_steps,
                "approved": False,
            }
            booking = session.get(Booking, run.booking_id)
            assert booking is not None
            _account_held(lease, booking, now)
            _await_human(
                session,
                run,
                lease,
                proposal,
                f"loss spike at step {item.step}: proposed restart from "
                f"checkpoint {item.checkpoint_step} skipping "
                f"{item.skip_steps} step(s) of data; needs a "
                "run.restart_from_checkpoint confirmation",
            )
            counts["events"] += 1
            break  # the attempt is over: nothing after a spike belongs to the run
        elif isinstance(item, RestartEvent):
            lease.interruptions += 1
            record_event(
                session,
                run,
                "restart",
                "the training processes were restarted from the last committed checkpoint",
                data={"restarts": item.restarts},
            )
            counts["events"] += 1
        elif isinstance(item, MeshEvent):
            layout = " × ".join(f"{dim} {degree}" for dim, degree in item.dims.items())
            record_event(
                session,
                run,
                "mesh",
                f"device mesh built on {item.device}: {layout}"
                + ("" if item.planned else " (the engine's default layout)"),
                data=item.model_dump(exclude={"type"}),
            )
            counts["events"] += 1
        elif isinstance(item, ExportEvent):
            # Served by ``runs checkpoints`` (``exports``) from this record.
            record_event(
                session,
                run,
                "export",
                f"stage {item.stage} exported at step {item.step} as a Hugging Face directory",
                data=item.model_dump(exclude={"type", "ts"}),
            )
            counts["events"] += 1
        elif isinstance(item, GateEvent):
            record_event(
                session,
                run,
                "gate",
                (
                    "ladder decision: the custom data "
                    + ("passed" if item.passed else "was REJECTED")
                    if item.ladder is not None
                    else f"eval gate of {item.stage} {'passed' if item.passed else 'FAILED'}"
                ),
                data={
                    "stage": item.stage,
                    "battery": item.battery,
                    "results": [r.model_dump() for r in item.results],
                    "passed": item.passed,
                    **({"ladder": item.ladder.model_dump()} if item.ladder is not None else {}),
                },
            )
            counts["events"] += 1
    session.flush()
    # The points and the charts' buckets, in the same transaction.
    record_points(session, run.id, run.account_id, attempt, points)
    return counts


def finish_run(
    session: Session,
    worker: AuthContext,
    run_id: str,
    attempt: int,
    status: str,
    failure_code: str | None,
    message: str,
    *,
    now: datetime,
) -> dict[str, Any]:
    """End the attempt at ``now`` with the run's final state. The time held from the last
    heartbeat to ``now`` is time held and cost like any other (DESIGN §7.7: goodput counts to
    the attempt's finish)."""
    run, lease = held_lease(session, worker, run_id, attempt)
    targets = {
        "succeeded": RunState.succeeded,
        "failed": RunState.failed,
        "gate_failed": RunState.gate_failed,
        "cancelled": RunState.cancelled,
        "awaiting_approval": RunState.awaiting_approval,
    }
    if status not in targets:
        raise ItoError("invalid_arguments", "status must be one of " + ", ".join(targets))
    target = targets[status]
    if target is RunState.awaiting_approval and failure_code != "cost_bound_reached":
        raise ItoError(
            "invalid_arguments", "an attempt ends awaiting approval only at its cost bound"
        )
    booking = session.get(Booking, run.booking_id)
    assert booking is not None
    _account_held(lease, booking, now)
    lease.updated_at = now
    if target is RunState.awaiting_approval and run.state != RunState.cancelling.value:
        _await_new_bound(session, run, lease, booking, message)
        return {"run_id": run.id, "state": run.state}
    if run.state == RunState.cancelling.value and target is not RunState.cancelled:
        target = RunState.cancelled
    # The final event names what ran: the stages whose ``completed`` events came, over every
    # attempt (DESIGN §5.9) — never the plan's or the estimate's list.
    ran = stages_completed(session, run.id)
    reason = message[:400] + (f" (ran: {', '.join(ran)})" if ran else " (no stage completed)")
    transition_run(
        session,
        run,
        target,
        reason=reason,
        failure_code=failure_code,
        data={"attempt": attempt, "stages_completed": ran},
    )
    lease.lease_expires_at = None
    lease.worker_principal_id = None
    return {"run_id": run.id, "state": run.state}


def _await_new_bound(
    session: Session, run: Run, lease: RunLease, booking: Booking, message: str
) -> None:
    """The attempt stopped at the approved cost bound, its checkpoint committed: the run waits
    for a human — a ``run.raise_cost_bound`` confirmation, or a cancel — with the figures that
    decision needs. The lease is let go; no time is held while it waits."""
    rate = booking.nodes * booking.gpus_per_node * booking.rate_usd_per_gpu_hour / 3600.0
    remaining = sum(
        float(p["eta_seconds"] or 0.0) if p["status"] == "running" else p["estimated_seconds"]
        for p in run_progress(session, run)
        if p["status"] in ("pending", "running")
    )
    hard, bound = spend_limits(run)
    proposal = {
        "action": "raise_cost_bound",
        "reason": "cost_bound_reached",
        "spent_usd": round(lease.cost_usd, 6),
        "bound_usd": bound,
        "hard_limit_usd": None if math.isinf(hard) else hard,
        "estimate_to_finish_usd": round(remaining * rate, 6),
        "approved": False,
    }
    _await_human(
        session,
        run,
        lease,
        proposal,
        f"cost bound reached: ${lease.cost_usd:.2f} spent of the ${bound:.2f} approved; "
        f"about ${remaining * rate:.2f} more to finish. {message[:300]} "
        "To go on, a human approves a new bound (ito confirm --action raise-bound --run "
        f"{run.id} --cost-bound USD; then ito runs raise-bound {run.id}), or cancels",
    )


def _await_human(
    session: Session, run: Run, lease: RunLease, proposal: dict[str, Any], reason: str
) -> None:
    """The attempt is over and the run waits for a human's decision on ``proposal``: the lease
    is let go (no worker holds it, no time is held while it waits)."""
    lease.proposal = proposal
    lease.lease_expires_at = None
    lease.worker_principal_id = None
    transition_run(session, run, RunState.awaiting_approval, reason=reason, data=proposal)


def _b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode()
