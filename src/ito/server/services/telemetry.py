"""Desk telemetry (DESIGN §7.7): goodput, interruption rate, checkpoint bandwidth, tokens/s and
MFU, per run and per booking — computed from what runs reported, never estimated.

* goodput = productive training seconds that survived into the final state ÷ wall seconds the
  run held the booking, from each lease to its attempt's finish, outages included (from a dead
  attempt's last heartbeat to the next lease). Never clamped: productive time is measured inside
  the time held, so a figure above 1 is an accounting bug to fix, not to hide. A step counts
  once, with the duration of its latest attempt: steps recomputed after a failure (work lost
  since the last commit) are not productive.
* interruption rate = interruptions (expired leases) ÷ node-hours held.
* checkpoint bandwidth = bytes committed ÷ seconds spent writing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ito.server.services.runs import get_run
from ito.server.store.runtime_tables import CheckpointRow, RunLease, RunMetric
from ito.server.store.tables import Booking, Run

__all__ = ["booking_telemetry", "prometheus_text", "run_telemetry"]


def _productive_seconds(session: Session, run_id: str) -> float:
    latest: dict[tuple[str, int], tuple[int, float]] = {}
    for stage, step, attempt, value in session.execute(
        select(RunMetric.stage, RunMetric.step, RunMetric.attempt, RunMetric.value)
        .where(RunMetric.run_id == run_id, RunMetric.name == "step_seconds")
        .order_by(RunMetric.id)
    ):
        key = (stage, step)
        if key not in latest or attempt >= latest[key][0]:
            latest[key] = (attempt, value)
    return sum(v for _, v in latest.values())


def _mean(session: Session, run_id: str, name: str) -> float | None:
    value = session.scalar(
        select(func.avg(RunMetric.value)).where(RunMetric.run_id == run_id, RunMetric.name == name)
    )
    return float(value) if value is not None else None


@dataclass(frozen=True)
class _Raw:
    """One run's unrounded figures: aggregates are summed from these, never from rounded ones."""

    busy: float
    productive: float
    interruptions: int
    node_hours: float
    written: int
    seconds: float
    cost: float
    bytes_freed: int = 0


def _raw(session: Session, run: Run, booking: Booking) -> _Raw:
    lease = session.get(RunLease, run.id)
    busy = lease.busy_seconds if lease else 0.0
    written, seconds = session.execute(
        select(
            func.coalesce(func.sum(CheckpointRow.bytes), 0),
            func.coalesce(func.sum(CheckpointRow.seconds), 0.0),
        ).where(CheckpointRow.run_id == run.id)
    ).one()
    return _Raw(
        busy=busy,
        productive=_productive_seconds(session, run.id),
        interruptions=lease.interruptions if lease else 0,
        node_hours=busy * booking.nodes / 3600.0,
        written=int(written),
        seconds=float(seconds),
        cost=lease.cost_usd if lease else 0.0,
        bytes_freed=lease.bytes_freed if lease else 0,
    )


def _ratios(raw: _Raw) -> dict[str, Any]:
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
    session: Session, run: Run, booking: Booking, raw: _Raw | None = None
) -> dict[str, Any]:
    raw = raw or _raw(session, run, booking)
    return {
        "run_id": run.id,
        "state": run.state,
        **_ratios(raw),
        "node_hours": round(raw.node_hours, 6),
        "checkpoint_bytes": raw.written,
        "checkpoint_seconds": round(raw.seconds, 3),
        "tokens_per_s": _mean(session, run.id, "tokens_per_s"),
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
    total = _Raw(
        busy=sum(r.busy for r in raws),
        productive=sum(r.productive for r in raws),
        interruptions=sum(r.interruptions for r in raws),
        node_hours=sum(r.node_hours for r in raws),
        written=sum(r.written for r in raws),
        seconds=sum(r.seconds for r in raws),
        cost=sum(r.cost for r in raws),
    )
    return {
        "booking_id": booking.id,
        "runs": len(runs),
        **_ratios(total),
        "per_run": [
            _run_figures(session, run, booking, raw) for run, raw in zip(runs, raws, strict=True)
        ],
    }


def prometheus_text(session: Session) -> str:
    """Every booking's and run's figures in the Prometheus text exposition format."""
    lines: list[str] = []
    gauges = {
        "ito_run_goodput": ("goodput", "Productive training time ÷ wall time held"),
        "ito_run_interruptions_total": ("interruptions", "Interruptions of the run"),
        "ito_run_checkpoint_bandwidth_bytes_per_second": (
            "checkpoint_bandwidth_bytes_per_s",
            "Checkpoint bytes ÷ seconds writing",
        ),
        "ito_run_tokens_per_second": ("tokens_per_s", "Mean training tokens per second"),
        "ito_run_mfu": ("mfu", "Mean model-FLOPs utilisation"),
        "ito_run_cost_usd": ("cost_usd", "Cost accrued"),
    }
    figures = []
    for booking in session.scalars(select(Booking)):
        for run in session.scalars(select(Run).where(Run.booking_id == booking.id)):
            figures.append((booking, _run_figures(session, run, booking)))
    for metric, (field, help_text) in gauges.items():
        lines.append(f"# HELP {metric} {help_text}")
        lines.append(f"# TYPE {metric} gauge")
        for booking, fig in figures:
            value = fig[field]
            if value is not None:
                lines.append(
                    f'{metric}{{booking="{booking.id}",run="{fig["run_id"]}",'
                    f'account="{booking.account_id}"}} {float(value)}'
                )
    return "\n".join(lines) + "\n"
