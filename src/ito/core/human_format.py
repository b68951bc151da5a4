"""Figures as a person reads them: durations ("3 min 40 s"), money with its unit ("$1.23"),
token counts ("1.2M"), instants in UTC to the second, and how long until one ("expires in
14 min"). Used by the approval page, ``runs show`` and ``runs watch``; pure, no locale."""

from __future__ import annotations

import math
from datetime import UTC, datetime

__all__ = ["duration", "expires_in", "token_count", "usd", "utc_instant"]


def duration(seconds: float) -> str:
    """``45 s``, ``3 min 40 s``, ``2 h 05 min``, ``3 d 4 h``: two units at most, rounded up to
    the smaller one (an estimate shown shorter than it is would mislead)."""
    total = max(0, math.ceil(seconds))
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min" if secs == 0 else f"{minutes} min {secs} s"
    total_minutes = math.ceil(total / 60)
    hours, minutes = divmod(total_minutes, 60)
    if hours < 24:
        return f"{hours} h" if minutes == 0 else f"{hours} h {minutes:02d} min"
    days, hours = divmod(math.ceil(total_minutes / 60), 24)
    return f"{days} d" if hours == 0 else f"{days} d {hours} h"


def usd(amount: float) -> str:
    """``$1.23``; amounts under a cent keep four decimals (``$0.0042``) so they do not read as
    free."""
    if 0 < abs(amount) < 0.01:
        return f"${amount:.4f}"
    return f"${amount:,.2f}"


def token_count(tokens: int) -> str:
    """``950``, ``12.3k``, ``1.2M``, ``4.5B``."""
    for bound, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(tokens) >= bound:
            return f"{tokens / bound:.3g}{suffix}"
    return str(tokens)


def utc_instant(moment: datetime) -> str:
    """``2026-12-04 20:14:05 UTC``: to the second, no microseconds."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def expires_in(expires_at: datetime, now: datetime) -> str:
    """``expires in 14 min``, or ``expired 2 min ago``."""
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    left = (expires_at - now).total_seconds()
    if left <= 0:
        return f"expired {duration(-left)} ago"
    return f"expires in {_coarse(left)}"


def _coarse(seconds: float) -> str:
    """Minutes for a countdown (seconds only under one minute): ``14 min``, ``1 h 05 min``."""
    if seconds < 60:
        return duration(seconds)
    return duration(math.floor(seconds / 60) * 60)
