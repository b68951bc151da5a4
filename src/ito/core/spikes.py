"""Loss-spike detection by a robust z-score over a sliding window (DESIGN §7.3).

The modified z-score of Iglewicz & Hoaglin (1993), ``0.6745·(x − median)/MAD``, is insensitive
to the outliers it looks for, unlike a mean/stddev score. A loss counts as a spike only if it is
far above the window's median *and* at least ``min_ratio`` times it — on a flat curve the MAD is
tiny and a harmless wobble would otherwise score high. Only upward jumps count: a falling loss
never does. Detection proposes an action to a human; it never acts.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["SpikeDetector"]


@dataclass
class SpikeDetector:
    window: int = 16
    """Losses the median and MAD are computed over."""
    min_points: int = 16
    """No verdict before this many losses (the first steps fall steeply)."""
    threshold: float = 6.0
    """Modified z-score above which a loss is a spike (3.5 flags ordinary outliers; a spike
    that warrants a human is far larger)."""
    min_ratio: float = 1.5
    """A spike is also at least this multiple of the median."""
    _losses: deque[float] = field(default_factory=deque, repr=False)

    def observe(self, loss: float) -> float | None:
        """Record ``loss``; its z-score if it is a spike (then it stays out of the window)."""
        if loss != loss or loss in (float("inf"), float("-inf")):
            return float("inf") if len(self._losses) >= self.min_points else None
        if len(self._losses) >= self.min_points:
            median = statistics.median(self._losses)
            mad = statistics.median(abs(x - median) for x in self._losses)
            z = (
                0.6745 * (loss - median) / mad
                if mad > 0
                else (float("inf") if loss > median else 0.0)
            )
            if z > self.threshold and loss >= self.min_ratio * median:
                return z
        self._losses.append(loss)
        if len(self._losses) > self.window:
            self._losses.popleft()
        return None

    def reset(self) -> None:
        self._losses.clear()

    def history(self) -> list[float]:
        """The window, oldest first (what a replica healed from this one must continue)."""
        return list(self._losses)

    def restore(self, losses: list[float]) -> None:
        self._losses = deque(float(x) for x in losses[-self.window :])
