"""What a run may spend (DESIGN §7.7): spend is the time the run held the booking × its rate, as
the desk bills it; it never passes the bound a human approved, nor the manifest's own limits."""

from __future__ import annotations

import math

from ito.core.errors import ItoError
from ito.core.states import RunState
from ito.server.store.runtime_tables import RunLease
from ito.server.store.tables import Run

__all__ = ["check_waiting_at_bound", "spend_limits"]


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


def check_waiting_at_bound(run: Run, lease: RunLease | None, amount: float) -> None:
    """Refuse unless ``run`` waits at its approved cost bound (``invalid_transition``) and
    ``amount`` lifts it — more than its bound and its spend (``invalid_arguments``)."""
    proposal = lease.proposal if lease is not None else None
    if (
        lease is None
        or run.state != RunState.awaiting_approval.value
        or not proposal
        or proposal.get("action") != "raise_cost_bound"
        or proposal.get("approved")
    ):
        raise ItoError(
            "invalid_transition", "the run is not waiting at its cost bound", state=run.state
        )
    _, bound = spend_limits(run)
    if amount <= bound or amount <= lease.cost_usd:
        raise ItoError(
            "invalid_arguments",
            "the new bound must be more than the run's spend and its current bound",
            spent_usd=round(lease.cost_usd, 6),
            bound_usd=bound,
        )
