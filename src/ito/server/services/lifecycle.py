"""The requester's lifecycle operations on a run (DESIGN §5.9): logs, metrics and checkpoints
(tenant-scoped, cursor-paginated), and the two confirmed mutations — cancel and cleanup — each
with its own confirmation and idempotency key, consumed in the transaction that applies it.

Cleanup never touches the booking: it asks the booking's worker to delete the run's checkpoints
and scratch data and records the bytes freed; the run's record, events and logs stay.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, exists, select, true
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, aliased

from ito.core.errors import ItoError
from ito.core.gates import idempotency_fingerprint, validate_idempotency_key
from ito.core.states import CleanupState, ConfirmationAction, RunState
from ito.server.services.confirmations import mark_consumed, usable_confirmation
from ito.server.services.credentials import AuthContext
from ito.server.services.idempotency import (
    bind_key,
    find_key,
    lock_key,
    replayable,
    reserve_key,
)
from ito.server.services.leases import lease_for
from ito.server.services.run_events import record_event
from ito.server.services.runs import get_run, transition_run
from ito.server.services.spending import check_waiting_at_bound
from ito.server.store.db import Database
from ito.server.store.runtime_tables import CheckpointRow, RunLog, RunMetric
from ito.server.store.tables import Booking, Run, RunEvent, utcnow

__all__ = [
    "CLEANUP_TRANSITIONS",
    "apply_run_action",
    "checkpoint_dict",
    "list_checkpoints",
    "list_logs",
    "list_metrics",
    "log_tail",
    "mark_cleaned",
]

CLEANUP_TRANSITIONS = {
    CleanupState.none: {CleanupState.cleaning},
    CleanupState.cleaning: {CleanupState.cleaned},
    CleanupState.cleaned: set(),
}


# The polled reads, built once, each ONE statement: the run, tenant-scoped (another tenant's
# looks missing), LEFT JOIN one page of its rows — the page an uncorrelated subquery over the
# indexed range ``run_id, id > cursor``, ordered and cut to ``limit`` before the join (joined
# directly, PostgreSQL would read and sort every row after the cursor, then cut). A run with no
# new rows still answers one row, its page columns NULL; no row at all means no such run for
# this account. Polling with a cursor (mostly empty pages) thus costs one query, not a run
# lookup and then a range.
def _page_of(columns: tuple[Any, ...], *where: Any) -> Any:
    table = columns[0].class_
    page = (
        select(*columns)
        .where(table.run_id == bindparam("run_id"), table.id > bindparam("since"), *where)
        .order_by(table.id)
        .limit(bindparam("limit"))
        .subquery()
    )
    return (
        select(page)
        .select_from(Run)
        .outerjoin(page, true())
        .where(Run.id == bindparam("run_id"), Run.account_id == bindparam("account_id"))
        .order_by(page.c.id)
    )


_LOGS = _page_of((RunLog.id, RunLog.attempt, RunLog.level, RunLog.message, RunLog.created_at))
_LATER = aliased(RunMetric)
_METRIC_COLUMNS = (
    RunMetric.id,
    RunMetric.attempt,
    RunMetric.stage,
    RunMetric.step,
    RunMetric.name,
    RunMetric.value,
    # Reported again later (a step replayed after a restart, in the same attempt or the
    # next): the later report is the one that survives. Found through the (run, name, step)
    # index, a probe per point of the page.
    exists()
    .where(
        _LATER.run_id == RunMetric.run_id,
        _LATER.name == RunMetric.name,
        _LATER.step == RunMetric.step,
        _LATER.stage == RunMetric.stage,
        _LATER.id > RunMetric.id,
    )
    .label("superseded"),
)
_METRICS = _page_of(_METRIC_COLUMNS)
_METRICS_NAMED = _page_of(_METRIC_COLUMNS, RunMetric.name == bindparam("name"))


def _page(session: Session | Connection, query: Any, params: dict[str, Any]) -> list[Any]:
    """The rows of one of the queries above, or ``run_not_found``."""
    rows = session.execute(query, params).all()
    if not rows:
        raise ItoError("run_not_found")
    return [row for row in rows if row.id is not None]


def list_logs(
    session: Session | Connection, account_id: str, run_id: str, *, since: int = 0, limit: int = 500
) -> tuple[list[dict[str, Any]], int]:
    """One page of a run's log lines after ``since`` and the next cursor: one statement."""
    rows = _page(
        session, _LOGS, {"run_id": run_id, "account_id": account_id, "since": since, "limit": limit}
    )
    lines = [
        {
            "cursor": r.id,
            "attempt": r.attempt,
            "level": r.level,
            "message": r.message,
            "at": r.created_at.isoformat(),
        }
        for r in rows
    ]
    return lines, rows[-1].id if rows else since


def log_tail(
    session: Session, account_id: str, run_id: str, *, limit: int = 100
) -> list[dict[str, Any]]:
    """The run's last ``limit`` log lines, oldest first (the dashboard's live tail), in the
    shape of :func:`list_logs`."""
    get_run(session, account_id, run_id)
    rows = session.execute(
        select(RunLog.id, RunLog.attempt, RunLog.level, RunLog.message, RunLog.created_at)
        .where(RunLog.run_id == run_id)
        .order_by(RunLog.id.desc())
        .limit(limit)
    ).all()
    return [
        {
            "cursor": r.id,
            "attempt": r.attempt,
            "level": r.level,
            "message": r.message,
            "at": r.created_at.isoformat(),
        }
        for r in reversed(rows)
    ]


def list_metrics(
    session: Session | Connection,
    account_id: str,
    run_id: str,
    *,
    name: str | None = None,
    since: int = 0,
    limit: int = 5000,
) -> tuple[list[dict[str, Any]], int]:
    """One page of a run's metric points (of one series, if ``name``): one statement."""
    params: dict[str, Any] = {
        "run_id": run_id,
        "account_id": account_id,
        "since": since,
        "limit": limit,
    }
    if name is None:
        rows = _page(session, _METRICS, params)
    else:
        rows = _page(session, _METRICS_NAMED, params | {"name": name})
    points = [
        {
            "cursor": r.id,
            "attempt": r.attempt,
            "stage": r.stage,
            "step": r.step,
            "name": r.name,
            "value": r.value,
            "superseded": bool(r.superseded),
        }
        for r in rows
    ]
    return points, rows[-1].id if rows else since


def list_checkpoints(session: Session, account_id: str, run_id: str) -> list[CheckpointRow]:
    get_run(session, account_id, run_id)
    return list(
        session.scalars(
            select(CheckpointRow)
            .where(CheckpointRow.run_id == run_id, CheckpointRow.account_id == account_id)
            .order_by(CheckpointRow.step, CheckpointRow.id)
        )
    )


def list_exports(session: Session, account_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's Hugging Face exports, as the engine reported them (one per stage ended)."""
    run = get_run(session, account_id, run_id)
    # Cleanup removes the run's whole checkpoint storage, its exports with it.
    deleted = run.cleanup_state == CleanupState.cleaned.value
    rows = session.scalars(
        select(RunEvent)
        .where(
            RunEvent.run_id == run_id,
            RunEvent.account_id == account_id,
            RunEvent.kind == "export",
        )
        .order_by(RunEvent.id)
    )
    return [
        {
            **{k: r.data[k] for k in ("stage", "step", "path", "bytes", "sha256", "seconds")},
            "exported_at": r.created_at.isoformat(),
            "deleted": deleted,
        }
        for r in rows
    ]


def checkpoint_dict(row: CheckpointRow) -> dict[str, Any]:
    return {
        "stage": row.stage,
        "step": row.step,
        "path": row.path,
        "bytes": row.bytes,
        "seconds": row.seconds,
        "attempt": row.attempt,
        "committed_at": row.created_at.isoformat(),
        "deleted": row.deleted_at is not None,
    }


def apply_run_action(
    db: Database,
    ctx: AuthContext,
    pepper: str,
    *,
    run_id: str,
    action: str,
    confirmation_ref: str,
    idempotency_key: str,
) -> tuple[dict[str, Any], bool]:
    """Cancel or clean up a run behind its own confirmation and idempotency key."""
    act = ConfirmationAction(action)
    validate_idempotency_key(idempotency_key)
    fingerprint = idempotency_fingerprint(act.value, run_id, None, confirmation_ref)
    try:
        with db.write() as session:
            lock_key(session, db, ctx.account_id, act.value, idempotency_key)
            existing = find_key(session, ctx.account_id, act.value, idempotency_key)
            if existing is not None:
                data = replayable(existing, fingerprint)
                run = get_run(session, ctx.account_id, run_id)
                return data | {"state": run.state, "cleanup_state": run.cleanup_state}, True
            run = get_run(session, ctx.account_id, run_id)
            now = utcnow()
            confirmation = usable_confirmation(session, ctx, pepper, confirmation_ref, now)
            if confirmation.action != act.value or confirmation.target_id != run.id:
                raise ItoError(
                    "confirmation_mismatch",
                    "the confirmation approves another action or run",
                    bound_action=confirmation.action,
                    bound_target=confirmation.target_id,
                )
            if act is ConfirmationAction.run_cancel:
                if not RunState(run.state).is_cancellable():
                    raise ItoError("run_not_cancellable", state=run.state)
            elif act is ConfirmationAction.run_restart:
                _check_restart(session, run, confirmation.details.get("checkpoint_step"))
            elif act is ConfirmationAction.run_raise_bound:
                _check_raise(session, run, confirmation.cost_usd)
            elif not RunState(run.state).is_terminal():
                raise ItoError("run_not_terminal", state=run.state)
            elif run.cleanup_state != CleanupState.none.value:
                raise ItoError(
                    "invalid_transition",
                    "the run is already cleaned or being cleaned",
                    cleanup_state=run.cleanup_state,
                )
            record = reserve_key(
                session, db, ctx.account_id, act.value, idempotency_key, fingerprint
            )
            if record is None:
                raise ItoError("idempotency_in_progress", idempotency_key=idempotency_key)
            mark_consumed(session, confirmation, run.id, now)
            if act is ConfirmationAction.run_cancel:
                _cancel(session, run)
            elif act is ConfirmationAction.run_restart:
                _restart(session, run)
            elif act is ConfirmationAction.run_raise_bound:
                _raise_bound(session, run, confirmation.cost_usd)
            else:
                _request_cleanup(session, run)
            data = {
                "run_id": run.id,
                "booking_id": run.booking_id,
                "state": run.state,
                "cleanup_state": run.cleanup_state,
                "idempotency_key": idempotency_key,
            }
            bind_key(session, record, run.id, data)
            return data, False
    except ItoError as exc:
        if exc.code == "store_busy":
            raise ItoError("idempotency_in_progress", idempotency_key=idempotency_key) from None
        raise


def _cancel(session: Session, run: Run) -> None:
    lease = lease_for(session, run)
    lease.cancel_requested_at = utcnow()
    held = lease.lease_expires_at is not None and run.state in (
        RunState.running.value,
        RunState.awaiting_approval.value,
    )
    transition_run(session, run, RunState.cancelling, reason="cancel confirmed by a human")
    if not held:
        # Nothing is executing it: queued, or recovering with no worker holding it.
        transition_run(
            session, run, RunState.cancelled, reason="cancelled before any worker held it"
        )


def _check_raise(session: Session, run: Run, amount: float) -> None:
    """The run still waits at its bound, and the approved amount still lifts it (the run may
    have been raised by another confirmation since this one was requested)."""
    try:
        check_waiting_at_bound(run, lease_for(session, run), amount)
    except ItoError as exc:
        if exc.code != "invalid_arguments":
            raise
        raise ItoError(
            "confirmation_mismatch",
            "the approved bound no longer lifts the run's bound",
            approved_usd=amount,
            bound_usd=exc.details.get("bound_usd"),
        ) from None


def _raise_bound(session: Session, run: Run, amount: float) -> None:
    lease = lease_for(session, run)
    assert lease.proposal is not None
    before = run.cost_bound_usd
    run.cost_bound_usd = amount
    lease.proposal = dict(lease.proposal) | {"approved": True, "new_bound_usd": amount}
    transition_run(
        session,
        run,
        RunState.recovering,
        reason=f"cost bound raised from ${before or 0:.2f} to ${amount:.2f} by a human; the run "
        "resumes from its last committed checkpoint",
        data={"previous_bound_usd": before, "cost_bound_usd": amount},
    )


def _check_restart(session: Session, run: Run, step: object) -> None:
    proposal = lease_for(session, run).proposal
    if (
        run.state != RunState.awaiting_approval.value
        or not proposal
        or proposal.get("action") != "restart_from_checkpoint"
    ):
        raise ItoError("invalid_transition", "the run has no proposed restart", state=run.state)
    if step != proposal.get("checkpoint_step"):
        raise ItoError(
            "confirmation_mismatch",
            "the confirmation names another checkpoint than the proposed one",
            proposed=proposal.get("checkpoint_step"),
            confirmed=step,
        )


def _restart(session: Session, run: Run) -> None:
    lease = lease_for(session, run)
    assert lease.proposal is not None
    lease.proposal = dict(lease.proposal) | {"approved": True}
    transition_run(
        session,
        run,
        RunState.recovering,
        reason=f"restart from checkpoint {lease.proposal['checkpoint_step']} confirmed by a human",
        data=lease.proposal,
    )


def _request_cleanup(session: Session, run: Run) -> None:
    _cleanup_transition(session, run, CleanupState.cleaning, "cleanup cleaning")
    lease_for(session, run).cleanup_requested_at = utcnow()


def _cleanup_transition(
    session: Session, run: Run, target: CleanupState, message: str, **data: Any
) -> None:
    """The one way ``cleanup_state`` changes: checked against its table, recorded as an event."""
    current = CleanupState(run.cleanup_state)
    if target not in CLEANUP_TRANSITIONS[current]:
        raise ItoError("invalid_transition", current=current.value, target=target.value)
    run.cleanup_state = target.value
    run.updated_at = utcnow()
    record_event(session, run, "cleanup", message, data={"cleanup_state": target.value} | data)


def mark_cleaned(
    session: Session, worker: AuthContext, run_id: str, bytes_freed: int, paths: list[str]
) -> dict[str, Any]:
    """The worker deleted the run's checkpoints and scratch data."""
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
    if run.cleanup_state != CleanupState.cleaning.value:
        raise ItoError("invalid_transition", "no cleanup was requested for this run")
    now = utcnow()
    lease = lease_for(session, run)
    lease.bytes_freed += max(int(bytes_freed), 0)
    for row in session.scalars(
        select(CheckpointRow).where(
            CheckpointRow.run_id == run.id, CheckpointRow.deleted_at.is_(None)
        )
    ):
        row.deleted_at = now
    _cleanup_transition(
        session,
        run,
        CleanupState.cleaned,
        f"cleaned: {bytes_freed} bytes freed",
        bytes_freed=int(bytes_freed),
        paths=paths[:20],
    )
    return {"run_id": run.id, "cleanup_state": run.cleanup_state, "bytes_freed": lease.bytes_freed}


def cleanup_jobs(session: Session, worker: AuthContext) -> list[dict[str, Any]]:
    runs = session.scalars(
        select(Run).where(
            Run.booking_id == worker.booking_id,
            Run.account_id == worker.account_id,
            Run.cleanup_state == CleanupState.cleaning.value,
        )
    )
    booking = session.get(Booking, worker.booking_id)
    storage = booking.storage_uri if booking is not None else None
    # The booking's storage root travels with each job: the worker re-checks that what it is
    # about to delete lies inside it.
    return [
        {"run_id": r.id, "checkpoint_uri": r.checkpoint_uri, "storage_uri": storage} for r in runs
    ]
