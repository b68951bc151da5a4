"""Telemetry as Prometheus metrics at ``/metrics`` (DESIGN §7.7), written with
``prometheus_client``.

:func:`exposition` reads every booking's and run's figures in a fixed number of queries
(:func:`ito.server.services.telemetry.export_snapshot`) and hands them to a custom
:class:`~prometheus_client.registry.Collector`, which yields the families from that snapshot
without any I/O of its own. What only grows (time held, productive time, cost, interruptions,
checkpoint bytes) is a counter (``…_total``); ratios and rates are gauges. Series carry the
labels ``booking``, ``run`` and ``tenant`` (the account id; per run) or ``booking`` and
``tenant`` (per booking); ``prometheus_client`` escapes them and writes them in name order.
Figures are unrounded; a ratio whose denominator is still zero has no sample. Goodput is never
clamped (see :mod:`ito.server.services.telemetry`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from ito.server.services.telemetry import ExportedBooking, RawFigures, export_snapshot

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["CONTENT_TYPE", "TelemetryCollector", "exposition"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The text exposition format the scrape answer is written in."""

_RUN_LABELS = ["booking", "run", "tenant"]
_BOOKING_LABELS = ["booking", "tenant"]

Figure = Callable[[RawFigures], float | None]


def _ratio(top: float, bottom: float) -> float | None:
    return top / bottom if bottom > 0 else None


_COUNTERS: dict[str, tuple[str, Figure]] = {
    "held_seconds": ("Wall seconds the booking was held, lease to finish", lambda r: r.busy),
    "productive_seconds": (
        "Training seconds that survived into the final state",
        lambda r: r.productive,
    ),
    "interruptions": ("Expired leases and restarted training processes", lambda r: r.interruptions),
    "checkpoint_bytes": ("Checkpoint bytes committed", lambda r: r.written),
    "cost_usd": ("Cost accrued while held (GPU-hours x rate)", lambda r: r.cost),
}
_GAUGES: dict[str, tuple[str, Figure]] = {
    "goodput": (
        "Productive training time / wall time held (never clamped)",
        lambda r: _ratio(r.productive, r.busy),
    ),
    "interruption_rate_per_node_hour": (
        "Interruptions per node-hour held",
        lambda r: _ratio(r.interruptions, r.node_hours),
    ),
    "checkpoint_bandwidth_bytes_per_second": (
        "Checkpoint bytes / seconds spent writing them",
        lambda r: _ratio(r.written, r.seconds),
    ),
}


class TelemetryCollector(Collector):
    """Yields the families of one snapshot; collecting does no I/O."""

    def __init__(self, snapshot: list[ExportedBooking]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        for scope in ("run", "booking"):
            yield from self._families(scope)
        yield from self._run_means()

    def _series(self, scope: str) -> Iterator[tuple[list[str], RawFigures]]:
        for booking in self.snapshot:
            if scope == "booking":
                yield [booking.booking_id, booking.account_id], booking.total
                continue
            for run in booking.runs:
                yield [booking.booking_id, run.run_id, booking.account_id], run.raw

    def _families(self, scope: str) -> Iterator[Metric]:
        labels = _RUN_LABELS if scope == "run" else _BOOKING_LABELS
        for name, (help_text, figure) in _COUNTERS.items():
            counter = CounterMetricFamily(f"ito_{scope}_{name}", help_text, labels=labels)
            for values, raw in self._series(scope):
                value = figure(raw)
                if value is not None:
                    counter.add_metric(values, float(value))
            yield counter
        for name, (help_text, figure) in _GAUGES.items():
            gauge = GaugeMetricFamily(f"ito_{scope}_{name}", help_text, labels=labels)
            for values, raw in self._series(scope):
                value = figure(raw)
                if value is not None:
                    gauge.add_metric(values, float(value))
            yield gauge
        if scope == "booking":
            runs = GaugeMetricFamily(
                "ito_booking_runs", "Runs created on the booking", labels=labels
            )
            for booking in self.snapshot:
                runs.add_metric([booking.booking_id, booking.account_id], len(booking.runs))
            yield runs

    def _run_means(self) -> Iterator[Metric]:
        tokens = GaugeMetricFamily(
            "ito_run_tokens_per_second", "Mean training tokens per second", labels=_RUN_LABELS
        )
        mfu = GaugeMetricFamily("ito_run_mfu", "Mean model-FLOPs utilisation", labels=_RUN_LABELS)
        for booking in self.snapshot:
            for run in booking.runs:
                values = [booking.booking_id, run.run_id, booking.account_id]
                if run.tokens_per_s is not None:
                    tokens.add_metric(values, run.tokens_per_s)
                if run.mfu is not None:
                    mfu.add_metric(values, run.mfu)
        yield tokens
        yield mfu


def exposition(session: Session) -> bytes:
    """The scrape answer: every booking's and run's figures in the text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TelemetryCollector(export_snapshot(session)))
    return generate_latest(registry)
