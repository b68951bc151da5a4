"""Desk telemetry (DESIGN §7.7): goodput, interruption rate, checkpoint bandwidth, tokens/s and
MFU, per run and per booking — computed from what runs reported, never estimated.

* goodput = productive training seconds that survived into the final state ÷ wall seconds the
  run held the booking, from each lease to its attempt's finish, outages included (from a dead
  attempt's last heartbeat to the next lease). Never clamped: productive time is measured inside
  the time held, so a figure above 1 is an accounting bug to fix, not to hide. A step counts
  once, with the duration of its latest attempt: steps recomputed after a failure (work lost
  since the last commit) are not productive, nor are the steps a failed or cancelled run took
  after its last commit.
* tokens/s = tokens of the surviving steps ÷ their seconds (weighted by time).
* interruption rate = interruptions (expired leases, restarted training processes) ÷
  node-hours held; a deterministic failure that ends a run is none.
* checkpoint bandwidth = bytes committed ÷ seconds spent writing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from ito.core.states import RunState
from ito.server.services.metric_buckets import series_mean, surviving_total
from ito.server.services.runs import get_run
from ito.server.store.runtime_tables import CheckpointRow, RunLease, RunMetric
from ito.server.store.tables import Booking, Run

__all__ = [
    "ExportedBooking",
    "ExportedRun",
    "RawFigures",
    "booking_telemetry",
    "export_snapshot",
    "run_costs",
    "run_telemetry",
]


_LOST_AFTER_COMMIT = (RunState.failed.value, RunState.cancelled.value)
"""Ended states whose steps after the last committed checkpoint were lost (a run that succeeded
or failed its gate committed its last step)."""


def _surviving(session: Session, name: str, run_ids: list[str] | None = None) -> dict[str, float]:
    """The sum of metric ``name`` over each run's surviving steps (of ``run_ids``, or of every
    run), in one query: each step's value as last reported — a step recomputed after a
    failure counts once, with the attempt that survived — and, for a run that failed or was
    cancelled, only the steps its last committed checkpoint kept."""
    last = select(func.max(RunMetric.id)).where(RunMetric.name == name)
    if run_ids is not None:
        last = last.where(RunMetric.run_id.in_(run_ids))
    last = last.group_by(RunMetric.run_id, RunMetric.stage, RunMetric.step)
    committed = (
        select(CheckpointRow.run_id, func.max(CheckpointRow.step).label("step"))
        .group_by(CheckpointRow.run_id)
        .subquery()
    )
    rows = session.execute(
        select(RunMetric.run_id, func.sum(RunMetric.value))
        .join(Run, Run.id == RunMetric.run_id)
        .outerjoin(committed, committed.c.run_id == RunMetric.run_id)
        .where(RunMetric.id.in_(last))
        .where(
            or_(
                Run.state.not_in(_LOST_AFTER_COMMIT),
                RunMetric.step <= func.coalesce(committed.c.step, 0),
            )
        )
        .group_by(RunMetric.run_id)
    )
    return {run_id: float(total) for run_id, total in rows}


def _productive(session: Session, run_ids: list[str] | None = None) -> dict[str, float]:
    """Productive seconds by run: the ``step_seconds`` of its surviving steps."""
    return _surviving(session, "step_seconds", run_ids)


def _one_surviving(session: Session, run: Run, name: str) -> float:
    """:func:`_surviving` of one run, from its bucket summaries: a few bounded queries whatever
    its length (the run page refreshes every 2 s; a scan of a million-step series would not
    do)."""
    up_to = None
    if run.state in _LOST_AFTER_COMMIT:
        committed = session.scalar(
            select(func.max(CheckpointRow.step)).where(CheckpointRow.run_id == run.id)
        )
        up_to = int(committed or 0)
    return surviving_total(session, run.id, name, up_to)


def _productive_seconds(session: Session, run: Run) -> float:
    return _one_surviving(session, run, "step_seconds")


def _one_tokens_per_s(session: Session, run: Run) -> float | None:
    tokens = _one_surviving(session, run, "tokens")
    seconds = _one_surviving(session, run, "step_seconds")
    return tokens / seconds if tokens > 0 and seconds > 0 else None


def _tokens_per_s(session: Session, run_ids: list[str] | None = None) -> dict[str, float]:
    """Tokens per second by run: the tokens of its surviving steps ÷ their seconds (weighted
    by time, replayed steps once: not the mean of per-step rates). Runs whose steps carry no
    token count (before it was reported) are absent."""
    tokens = _surviving(session, "tokens", run_ids)
    seconds = _surviving(session, "step_seconds", run_ids)
    return {
        run_id: total / seconds[run_id]
        for run_id, total in tokens.items()
        if seconds.get(run_id, 0.0) > 0
    }


def _mean(session: Session, run_id: str, name: str) -> float | None:
    # From the run's bucket summaries: a few rows, whatever the run's length.
    return series_mean(session, run_id, name)


@dataclass(frozen=True)
class RawFigures:
    """One run's unrounded figures: aggregates are summed from these, never from rounded ones."""

    busy: float
    productive: float
    interruptions: int
    node_hours: float
    written: int
    seconds: float
    cost: float
    bytes_freed: int = 0

    @staticmethod
    def total(raws: list[RawFigures]) -> RawFigures:
        """The sum of several runs' figures (ratios are taken of the sums)."""
        return RawFigures(
            busy=sum(r.busy for r in raws),
            productive=sum(r.productive for r in raws),
            interruptions=sum(r.interruptions for r in raws),
            node_hours=sum(r.node_hours for r in raws),
            written=sum(r.written for r in raws),
            seconds=sum(r.seconds for r in raws),
            cost=sum(r.cost for r in raws),
            bytes_freed=sum(r.bytes_freed for r in raws),
        )


def _raw(session: Session, run: Run, booking: Booking) -> RawFigures:
    lease = session.get(RunLease, run.id)
    busy = lease.busy_seconds if lease else 0.0
    written, seconds = session.execute(
        select(
            func.coalesce(func.sum(CheckpointRow.bytes), 0),
            func.coalesce(func.sum(CheckpointRow.seconds), 0.0),
        ).where(CheckpointRow.run_id == run.id)
    ).one()
    return RawFigures(
        busy=busy,
        productive=_productive_seconds(session, run),
        interruptions=lease.interruptions if lease else 0,
        node_hours=busy * booking.nodes / 3600.0,
        written=int(written),
        seconds=float(seconds),
        cost=lease.cost_usd if lease else 0.0,
        bytes_freed=lease.bytes_freed if lease else 0,
    )


def _ratios(raw: RawFigures) -> dict[str, Any]:
    return {
        "wall_seconds_held": round(raw.busy, 3),
        "productive_seconds": round(raw.productive, 3),
        "goodput": round(raw.productive / raw.busy, 4) if raw.busy > 0 else None,
        "interruptions": raw.interruptions,
        "interruption_rate_per_node_hour": round(raw.interruptions / raw.node_hours, 4)
        if raw.node_hours > 0
        else None,
        "checkpoint_bandwidth_bytes_per_s": round(raw.written / raw.seconds, 1)
        if raw.seconds > 0
        else None,
        "cost_usd": round(raw.cost, 6),
    }


def _run_figures(
    session: Session, run: Run, booking: Booking, raw: RawFigures | None = None
) -> dict[str, Any]:
    raw = raw or _raw(session, run, booking)
    return {
        "run_id": run.id,
        "state": run.state,
        **_ratios(raw),
        "node_hours": round(raw.node_hours, 6),
        "checkpoint_bytes": raw.written,
        "checkpoint_seconds": round(raw.seconds, 3),
        "tokens_per_s": _one_tokens_per_s(session, run) or _mean(session, run.id, "tokens_per_s"),
        "mfu": _mean(session, run.id, "mfu"),
        "bytes_freed": raw.bytes_freed,
    }


def run_telemetry(session: Session, account_id: str | None, run_id: str) -> dict[str, Any]:
    run = get_run(session, account_id, run_id) if account_id else session.get(Run, run_id)
    if run is None:
        from ito.core.errors import ItoError

        raise ItoError("run_not_found")
    booking = session.get(Booking, run.booking_id)
    assert booking is not None
    return _run_figures(session, run, booking)


def booking_telemetry(session: Session, account_id: str | None, booking_id: str) -> dict[str, Any]:
    from ito.server.services.bookings import get_booking

    booking = (
        get_booking(session, account_id, booking_id)
        if account_id
        else session.get(Booking, booking_id)
    )
    if booking is None:
        from ito.core.errors import ItoError

        raise ItoError("booking_not_found")
    runs = list(
        session.scalars(select(Run).where(Run.booking_id == booking.id).order_by(Run.created_at))
    )
    raws = [_raw(session, run, booking) for run in runs]
    total = RawFigures.total(raws)
    return {
        "booking_id": booking.id,
        "runs": len(runs),
        **_ratios(total),
        "per_run": [
            _run_figures(session, run, booking, raw) for run, raw in zip(runs, raws, strict=True)
        ],
    }


@dataclass(frozen=True)
class ExportedRun:
    """One run's figures for the Prometheus exposition."""

    run_id: str
    state: str
    raw: RawFigures
    tokens_per_s: float | None
    mfu: float | None


@dataclass(frozen=True)
class ExportedBooking:
    """One booking with its runs, for the Prometheus exposition."""

    booking_id: str
    account_id: str
    runs: list[ExportedRun]

    @property
    def total(self) -> RawFigures:
        return RawFigures.total([run.raw for run in self.runs])


def export_snapshot(session: Session) -> list[ExportedBooking]:
    """Every booking's and run's unrounded figures, read in a fixed number of queries however
    many runs there are (bookings, runs, leases, checkpoint sums, productive time, means)."""
    bookings = list(session.scalars(select(Booking).order_by(Booking.created_at, Booking.id)))
    runs = list(session.scalars(select(Run).order_by(Run.created_at, Run.id)))
    leases = {lease.run_id: lease for lease in session.scalars(select(RunLease))}
    checkpoints = {
        run_id: (int(written), float(seconds))
        for run_id, written, seconds in session.execute(
            select(
                CheckpointRow.run_id,
                func.coalesce(func.sum(CheckpointRow.bytes), 0),
                func.coalesce(func.sum(CheckpointRow.seconds), 0.0),
            ).group_by(CheckpointRow.run_id)
        )
    }
    productive = _productive(session)
    weighted = _tokens_per_s(session)
    means: dict[tuple[str, str], float] = {
        (run_id, name): float(value)
        for run_id, name, value in session.execute(
            select(RunMetric.run_id, RunMetric.name, func.avg(RunMetric.value))
            .where(RunMetric.name.in_(("tokens_per_s", "mfu")))
            .group_by(RunMetric.run_id, RunMetric.name)
        )
    }
    by_booking: dict[str, list[ExportedRun]] = {booking.id: [] for booking in bookings}
    nodes = {booking.id: booking.nodes for booking in bookings}
    for run in runs:
        lease = leases.get(run.id)
        busy = lease.busy_seconds if lease else 0.0
        written, seconds = checkpoints.get(run.id, (0, 0.0))
        raw = RawFigures(
            busy=busy,
            productive=productive.get(run.id, 0.0),
            interruptions=lease.interruptions if lease else 0,
            node_hours=busy * nodes.get(run.booking_id, 0) / 3600.0,
            written=written,
            seconds=seconds,
            cost=lease.cost_usd if lease else 0.0,
            bytes_freed=lease.bytes_freed if lease else 0,
        )
        by_booking.setdefault(run.booking_id, []).append(
            ExportedRun(
                run.id,
                run.state,
                raw,
                weighted.get(run.id, means.get((run.id, "tokens_per_s"))),
                means.get((run.id, "mfu")),
            )
        )
    return [
        ExportedBooking(booking.id, booking.account_id, by_booking[booking.id])
        for booking in bookings
    ]


def run_costs(session: Session, account_id: str, run_ids: list[str]) -> dict[str, float]:
    """``cost_usd`` of :func:`run_telemetry` for many of the account's runs in one query (the
    runs list); a run no worker has leased yet has cost nothing."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(RunLease.run_id, RunLease.cost_usd)
        .join(Run, Run.id == RunLease.run_id)
        .where(Run.account_id == account_id, RunLease.run_id.in_(run_ids))
    )
    costs = {run_id: 0.0 for run_id in run_ids}
    costs.update({run_id: round(float(cost or 0.0), 6) for run_id, cost in rows})
    return costs
