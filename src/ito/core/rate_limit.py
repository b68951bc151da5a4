"""Rate limits (DESIGN §4 ``rate_limited``), pure: the caller passes the clock.

Two shapes, both keyed by a string and bounded in memory:

* :class:`TokenBucket` — a steady request rate with a burst allowance, per principal. A refused
  request costs nothing, so a client that backs off for ``retry_after`` seconds gets through.
* :class:`FailureWindow` — failed authentications per source within a sliding window. Past the
  limit the source is refused, valid credentials included, until its oldest counted failure
  leaves the window: guessing keys or passwords gets a handful of tries a minute, not thousands.

They live in one server process: behind several API processes each counts on its own, so the
effective limit is the per-process one times the processes (stated in the README).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = ["FailureWindow", "TokenBucket"]

MAX_KEYS = 100_000
"""Keys remembered at most per limiter; the least recently seen is forgotten first. Forgetting
a key only ever errs towards admitting its next request."""


@dataclass
class _Bucket:
    tokens: float
    at: float


class TokenBucket:
    def __init__(self, rate_per_second: float, burst: int, *, max_keys: int = MAX_KEYS) -> None:
        if rate_per_second <= 0 or burst < 1:
            raise ValueError("rate_per_second must be > 0 and burst >= 1")
        self.rate = rate_per_second
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, key: str, now: float) -> float | None:
        """Spend one token of ``key``; ``None`` if admitted, else seconds until one is there."""
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = _Bucket(tokens=self.burst, at=now)
        else:
            bucket.tokens = min(self.burst, bucket.tokens + max(now - bucket.at, 0.0) * self.rate)
            bucket.at = now
        self._buckets[key] = bucket
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / self.rate


class FailureWindow:
    def __init__(self, limit: int, window_seconds: float, *, max_keys: int = MAX_KEYS) -> None:
        if limit < 1 or window_seconds <= 0:
            raise ValueError("limit must be >= 1 and window_seconds > 0")
        self.limit = limit
        self.window = window_seconds
        self.max_keys = max_keys
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._failures.get(key)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[key]
        return times

    def blocked(self, key: str, now: float) -> float | None:
        """``None`` if ``key`` may try, else seconds until it may."""
        times = self._recent(key, now)
        if len(times) < self.limit:
            return None
        return max(times[0] + self.window - now, 0.0) or math.ulp(1.0)

    def fail(self, key: str, now: float) -> None:
        times = self._recent(key, now)
        if not times:
            self._failures[key] = times
        self._failures.move_to_end(key)
        times.append(now)
        if len(times) > self.limit:
            times.popleft()
        if len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)
