"""What the API answers about telemetry (DESIGN §7.7): one run's figures, or a booking's with
each of its runs' — computed from what the runs reported, never estimated (see
:mod:`ito.core.run_views` for the rules). A ratio whose denominator is still zero is ``None``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["BookingTelemetry", "RunTelemetry", "TelemetryRatios"]


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TelemetryRatios(_View):
    wall_seconds_held: float
    """Seconds the run(s) held the booking, from each lease to its attempt's finish, outages
    included."""
    productive_seconds: float
    """Training seconds that survived into the final state (recomputed steps excluded)."""
    goodput: float | None
    """``productive_seconds`` ÷ ``wall_seconds_held`` (held counted to each attempt's finish);
    never clamped — above 1 would be an accounting bug."""
    interruptions: int
    """Expired leases and restarted training processes."""
    interruption_rate_per_node_hour: float | None
    checkpoint_bandwidth_bytes_per_s: float | None
    """Checkpoint bytes committed ÷ seconds spent writing them."""
    cost_usd: float


class RunTelemetry(TelemetryRatios):
    run_id: str
    state: str
    node_hours: float
    checkpoint_bytes: int
    checkpoint_seconds: float
    tokens_per_s: float | None
    """Mean of the reported ``tokens_per_s`` metric."""
    mfu: float | None
    """Mean of the reported model-FLOPs utilisation."""
    bytes_freed: int
    """Bytes the run's cleanup freed."""


class BookingTelemetry(TelemetryRatios):
    """The booking's runs together (ratios of their sums), then each run's own figures."""

    booking_id: str
    runs: int
    per_run: list[RunTelemetry]
