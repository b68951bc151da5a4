"""One booking as the gates see it, for the core tests: a completed two-CPU booking inside its
term at :data:`NOW`; each test changes only what it is about."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from ito.core.gates import BookingView

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

_BASE = BookingView(
    id="bkg_1",
    account_id="acc_1",
    state="completed",
    gpu="cpu",
    nodes=1,
    gpus_per_node=2,
    gpu_memory_gb=8,
    region="local",
    fabric="ethernet",
    term_start=NOW - timedelta(hours=1),
    term_end=NOW + timedelta(days=1),
    storage_uri="file:///srv/ckpt/bkg_1",
    storage_quota_gb=10.0,
    rate_usd_per_gpu_hour=1.0,
)


def booking_view(**changes: Any) -> BookingView:
    """The base booking with ``changes`` (any :class:`BookingView` field)."""
    return dataclasses.replace(_BASE, **changes)
