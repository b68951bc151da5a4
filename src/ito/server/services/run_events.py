"""A run's events: the one way an event is recorded (every state change, stage, gate,
checkpoint and export of a run), and the bounded reads of them the pages make. Its own module,
below runs, bookings and confirmations, so that each of them records events without importing
the others."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.server.store.tables import Run, RunEvent, utcnow

__all__ = ["events_of_kinds", "latest_events", "record_event"]


def record_event(
    session: Session,
    run: Run,
    kind: str,
    message: str,
    *,
    from_state: str | None = None,
    to_state: str | None = None,
    data: dict[str, Any] | None = None,
) -> RunEvent:
    event = RunEvent(
        run_id=run.id,
        account_id=run.account_id,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        message=message,
        data=data or {},
        created_at=utcnow(),
    )
    session.add(event)
    session.flush()
    return event


def events_of_kinds(session: Session, run: Run, kinds: tuple[str, ...]) -> list[RunEvent]:
    """A run (already checked to be the caller's) its events of ``kinds``, oldest first: the
    ``(run_id, kind, id)`` index, bounded by those kinds' count (stages and state changes),
    never by the run's history of checkpoints."""
    return list(
        session.scalars(
            select(RunEvent)
            .where(RunEvent.run_id == run.id, RunEvent.kind.in_(kinds))
            .order_by(RunEvent.id)
        )
    )


def latest_events(session: Session, run: Run, limit: int) -> list[RunEvent]:
    """A run's last ``limit`` events, oldest first (the ``(run_id, id)`` index, backwards)."""
    rows = session.scalars(
        select(RunEvent).where(RunEvent.run_id == run.id).order_by(RunEvent.id.desc()).limit(limit)
    )
    return list(reversed(list(rows)))
