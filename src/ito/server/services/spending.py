"""What a run may spend (DESIGN §7.7): spend is the time the run held the booking × its rate, as
the desk bills it; it never passes the bound a human approved, nor the manifest's own limits."""

from __future__ import annotations

import math

from ito.server.store.tables import Run

__all__ = ["spend_limits"]


def spend_limits(run: Run) -> tuple[float, float]:
    """What the run may spend: the manifest's hard limit (its ceiling and its max incremental
    cost, frozen with its digest; past it the run fails ``budget_exceeded``) and the bound a
    human approved (past it the run waits for a new one). ``inf`` where none is set."""
    estimate = run.estimate or {}
    limits = [
        float(estimate[key])
        for key in ("ceiling_usd", "max_incremental_cost_usd")
        if estimate.get(key)
    ]
    hard = min(limits, default=math.inf)
    bound = float(run.cost_bound_usd) if run.cost_bound_usd is not None else math.inf
    return hard, bound
