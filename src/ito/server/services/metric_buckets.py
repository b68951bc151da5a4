"""A run's metric series summarised per bucket of global steps, so that a chart costs the same
whatever the history (issue 26: one million points made the run page take 21–27 s a render).

As points are reported (:func:`add_points`, in the report's transaction) each one updates its
bucket at every width of :data:`WIDTHS` — minimum, maximum, the value reported last (a replayed
step's newer value wins), count, first and last step — one row per series, stage, width and
bucket. A chart (:func:`chart_series`) reads, per series, the few rows of the widest width to
learn its span, then either its raw points, when it holds at most :data:`RAW_UP_TO`, or the rows
of the narrowest width that gives at most :data:`MAX_BUCKETS` buckets, each drawn as its
minimum and maximum (min/max decimation: a spike stays visible). Both reads are bounded by those
constants and go through indexes, never a scan of the series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from ito.server.store.runtime_tables import RunMetric, RunMetricBucket

__all__ = [
    "MAX_BUCKETS",
    "RAW_UP_TO",
    "WIDTHS",
    "ChartSeries",
    "add_points",
    "chart_series",
    "last_steps",
    "record_points",
    "series_mean",
    "surviving_total",
]

WIDTHS = (16, 256, 4096, 65536, 1 << 20)
"""Bucket widths in global steps (each 16× the one before; the widest covers a million steps,
so a series of any realistic length has a handful of rows there)."""
RAW_UP_TO = 500
"""A series with at most this many points reported is drawn point by point."""
_STEP_BOUND = (1 << 31) - 1
"""Past every step a store column holds (a 32-bit integer)."""
MAX_BUCKETS = 250
"""At most this many buckets (two points each) are drawn for a longer series."""


@dataclass
class _Acc:
    first_step: int
    last_step: int
    min_value: float
    max_value: float
    last_value: float
    count: int
    sum_value: float
    surviving: float

    def add(self, step: int, value: float, surviving: float) -> None:
        self.first_step = min(self.first_step, step)
        self.last_step = max(self.last_step, step)
        self.min_value = min(self.min_value, value)
        self.max_value = max(self.max_value, value)
        self.last_value = value
        self.count += 1
        self.sum_value += value
        self.surviving += surviving


def _earlier(
    session: Session, run_id: str, points: list[tuple[str, int, str, float]]
) -> dict[tuple[str, int, str], float]:
    """The value last reported before this batch for each (stage, step, name) the batch
    reports again (a replay after a restart): one query per series over the batch's steps."""
    found: dict[tuple[str, int, str], tuple[int, float]] = {}
    for name in {p[2] for p in points}:
        steps = [p[1] for p in points if p[2] == name]
        for row_id, stage, step, value in session.execute(
            select(RunMetric.id, RunMetric.stage, RunMetric.step, RunMetric.value).where(
                RunMetric.run_id == run_id,
                RunMetric.name == name,
                RunMetric.step.between(min(steps), max(steps)),
            )
        ):
            key = (str(stage), int(step), name)
            if key not in found or found[key][0] < row_id:
                found[key] = (int(row_id), float(value))
    return {key: value for key, (_, value) in found.items()}


def add_points(
    session: Session, run_id: str, account_id: str, points: list[tuple[str, int, str, float]]
) -> None:
    """Fold reported ``(stage, step, name, value)`` points, in report order, into the run's
    buckets (in the caller's transaction, before the points' own rows are added). A step
    reported again replaces its earlier value in the surviving sums."""
    if not points:
        return
    latest = _earlier(session, run_id, points)
    acc: dict[tuple[str, int, int, str], _Acc] = {}
    for stage, step, name, value in points:
        previous = latest.get((stage, step, name))
        latest[(stage, step, name)] = value
        surviving = value - (previous if previous is not None else 0.0)
        for width in WIDTHS:
            key = (name, width, step // width, stage)
            known = acc.get(key)
            if known is None:
                acc[key] = _Acc(step, step, value, value, value, 1, value, surviving)
            else:
                known.add(step, value, surviving)
    rows = {
        (r.name, r.width, r.bucket, r.stage): r
        for r in session.scalars(
            select(RunMetricBucket).where(
                RunMetricBucket.run_id == run_id,
                tuple_(
                    RunMetricBucket.name,
                    RunMetricBucket.width,
                    RunMetricBucket.bucket,
                    RunMetricBucket.stage,
                ).in_(list(acc)),
            )
        )
    }
    for key, new in acc.items():
        row = rows.get(key)
        if row is None:
            name, width, bucket, stage = key
            session.add(
                RunMetricBucket(
                    run_id=run_id,
                    account_id=account_id,
                    name=name,
                    stage=stage,
                    width=width,
                    bucket=bucket,
                    first_step=new.first_step,
                    last_step=new.last_step,
                    min_value=new.min_value,
                    max_value=new.max_value,
                    last_value=new.last_value,
                    count=new.count,
                    sum_value=new.sum_value,
                    surviving_sum=new.surviving,
                )
            )
        else:
            row.first_step = min(row.first_step, new.first_step)
            row.last_step = max(row.last_step, new.last_step)
            row.min_value = min(row.min_value, new.min_value)
            row.max_value = max(row.max_value, new.max_value)
            row.last_value = new.last_value
            row.count += new.count
            row.sum_value += new.sum_value
            row.surviving_sum += new.surviving


def record_points(
    session: Session,
    run_id: str,
    account_id: str,
    attempt: int,
    points: list[tuple[str, int, str, float]],
) -> None:
    """Store reported ``(stage, step, name, value)`` points, in report order: their buckets
    first — a step reported again is told from its earlier report by the rows already stored —
    then the points' own rows."""
    add_points(session, run_id, account_id, points)
    session.add_all(
        RunMetric(
            run_id=run_id,
            account_id=account_id,
            attempt=attempt,
            stage=stage,
            step=step,
            name=name,
            value=value,
        )
        for stage, step, name, value in points
    )


def surviving_total(session: Session, run_id: str, name: str, up_to: int | None = None) -> float:
    """The sum of each step's value as last reported in series ``name`` (``up_to``: of the
    steps at or below it only), in a few bounded queries: whole buckets from the widest width
    down, then the last few steps' own rows."""

    def buckets(width: int, lo: int, hi: int) -> float:
        """Σ surviving sums of the buckets of ``width`` covering steps [lo, hi)."""
        value = session.scalar(
            select(func.sum(RunMetricBucket.surviving_sum)).where(
                RunMetricBucket.run_id == run_id,
                RunMetricBucket.name == name,
                RunMetricBucket.width == width,
                RunMetricBucket.bucket >= lo // width,
                RunMetricBucket.bucket < hi // width,
            )
        )
        return float(value or 0.0)

    if up_to is None:
        return buckets(WIDTHS[-1], 0, _STEP_BOUND)
    total, done, end = 0.0, 0, up_to + 1
    for width in reversed(WIDTHS):
        upper = end // width * width
        if upper > done:
            total += buckets(width, done, upper)
            done = upper
    newest: dict[tuple[str, int], tuple[int, float]] = {}
    for row_id, stage, step, value in session.execute(
        select(RunMetric.id, RunMetric.stage, RunMetric.step, RunMetric.value).where(
            RunMetric.run_id == run_id,
            RunMetric.name == name,
            RunMetric.step.between(done, up_to),
        )
    ):
        key = (str(stage), int(step))
        if key not in newest or newest[key][0] < row_id:
            newest[key] = (int(row_id), float(value))
    return total + sum(value for _, value in newest.values())


@dataclass(frozen=True)
class ChartSeries:
    """What a chart draws of one series."""

    name: str
    points: list[tuple[float, float]]
    """``(step, value)`` in step order: every point, or each bucket's minimum and maximum."""
    reported: int
    """Points the run reported (replays of a step included)."""
    width: int
    """1 when drawn point by point, else the bucket width in steps."""
    last: float
    """The value reported last."""
    last_step: int
    stage_steps: dict[str, tuple[int, int]]
    """Each stage's first and last step in this series."""


_SPANS = (
    select(
        RunMetricBucket.name,
        RunMetricBucket.stage,
        func.min(RunMetricBucket.first_step).label("first"),
        func.max(RunMetricBucket.last_step).label("last"),
        func.sum(RunMetricBucket.count).label("count"),
    )
    .where(
        RunMetricBucket.run_id == bindparam("run_id"),
        RunMetricBucket.account_id == bindparam("account_id"),
        RunMetricBucket.width == WIDTHS[-1],
    )
    .group_by(RunMetricBucket.name, RunMetricBucket.stage)
)


def chart_series(session: Session, account_id: str, run_id: str) -> dict[str, ChartSeries]:
    """Every metric series of the run, bounded for drawing (see the module's docstring)."""
    spans: dict[str, dict[str, tuple[int, int, int]]] = {}
    for name, stage, first, last, count in session.execute(
        _SPANS, {"run_id": run_id, "account_id": account_id}
    ):
        spans.setdefault(name, {})[stage] = (int(first), int(last), int(count))
    out: dict[str, ChartSeries] = {}
    for name, stages in spans.items():
        first = min(s[0] for s in stages.values())
        last = max(s[1] for s in stages.values())
        reported = sum(s[2] for s in stages.values())
        stage_steps = {stage: (s[0], s[1]) for stage, s in stages.items()}
        if reported <= RAW_UP_TO:
            points, last_value = _raw(session, account_id, run_id, name)
            width = 1
        else:
            width = next((w for w in WIDTHS if (last - first) // w + 1 <= MAX_BUCKETS), WIDTHS[-1])
            points, last_value = _bucketed(session, account_id, run_id, name, width)
        out[name] = ChartSeries(name, points, reported, width, last_value, last, stage_steps)
    return out


def _raw(
    session: Session, account_id: str, run_id: str, name: str
) -> tuple[list[tuple[float, float]], float]:
    rows = session.execute(
        select(RunMetric.step, RunMetric.value)
        .where(
            RunMetric.run_id == run_id,
            RunMetric.account_id == account_id,
            RunMetric.name == name,
        )
        .order_by(RunMetric.id)
        .limit(RAW_UP_TO)
    ).all()
    # A step replayed after a restart is drawn once, with its newest value.
    newest: dict[int, float] = {}
    for step, value in rows:
        newest[int(step)] = float(value)
    last_value = float(rows[-1][1]) if rows else float("nan")
    return [(float(s), v) for s, v in sorted(newest.items())], last_value


def _bucketed(
    session: Session, account_id: str, run_id: str, name: str, width: int
) -> tuple[list[tuple[float, float]], float]:
    rows: list[Any] = list(
        session.scalars(
            select(RunMetricBucket)
            .where(
                RunMetricBucket.run_id == run_id,
                RunMetricBucket.account_id == account_id,
                RunMetricBucket.name == name,
                RunMetricBucket.width == width,
            )
            .order_by(RunMetricBucket.bucket, RunMetricBucket.first_step)
            .limit(2 * MAX_BUCKETS + 64)
        )
    )
    points: list[tuple[float, float]] = []
    for row in rows:
        middle = (row.first_step + row.last_step) / 2
        points += [(middle, row.min_value), (middle, row.max_value)]
    newest = max(rows, key=lambda r: (r.last_step, r.bucket)) if rows else None
    return points, float(newest.last_value) if newest is not None else float("nan")


def series_mean(session: Session, run_id: str, name: str) -> float | None:
    """The mean of every value the run reported for ``name`` (replays included), from the few
    rows of the widest width."""
    total, count = session.execute(
        select(func.sum(RunMetricBucket.sum_value), func.sum(RunMetricBucket.count)).where(
            RunMetricBucket.run_id == run_id,
            RunMetricBucket.name == name,
            RunMetricBucket.width == WIDTHS[-1],
        )
    ).one()
    return float(total) / float(count) if count else None


def last_steps(session: Session | Connection, run_id: str, name: str = "loss") -> dict[str, int]:
    """Each stage's last step in series ``name``, from the few rows of the widest width."""
    rows = session.execute(
        select(RunMetricBucket.stage, func.max(RunMetricBucket.last_step))
        .where(
            RunMetricBucket.run_id == run_id,
            RunMetricBucket.name == name,
            RunMetricBucket.width == WIDTHS[-1],
        )
        .group_by(RunMetricBucket.stage)
    )
    return {str(stage): int(step) for stage, step in rows}
