"""What a signed-in approver sees on the web pages: the account's pending confirmations, and
one confirmation with every binding it approves (DESIGN §5.5: booking, digest, manifest
summary, cost, requester, expiry). Tenant-scoped like every read: another account's reference
answers ``confirmation_not_found``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.human_format import duration, expires_in, token_count, usd, utc_instant
from ito.core.stage_plan import StagePlan
from ito.server.services.bookings import booking_dict, get_booking
from ito.server.services.confirmations import confirmation_dict, get_confirmation
from ito.server.store.tables import Account, Confirmation, Principal, utcnow

__all__ = [
    "account_view",
    "approval_figures",
    "confirmation_view",
    "pending_confirmations",
    "run_confirmations",
]


def account_view(session: Session, account_id: str) -> dict[str, str]:
    account = session.get(Account, account_id)
    if account is None:
        raise ItoError("account_not_found")
    return {"id": account.id, "name": account.name}


def pending_confirmations(
    session: Session, account_id: str, public_url: str, now: datetime, limit: int = 100
) -> list[dict[str, Any]]:
    rows = session.scalars(
        select(Confirmation)
        .where(
            Confirmation.account_id == account_id,
            Confirmation.state == "pending",
            Confirmation.expires_at > now,
        )
        .order_by(Confirmation.created_at.desc())
        .limit(limit)
    )
    return [confirmation_dict(c, public_url, now) for c in rows]


def run_confirmations(
    session: Session, account_id: str, run_id: str, public_url: str, now: datetime, limit: int = 20
) -> list[dict[str, Any]]:
    """The confirmations that target this account's run (cancel, cleanup, restart), newest
    first, each with the principal that requested it."""
    rows = session.scalars(
        select(Confirmation)
        .where(
            Confirmation.account_id == account_id,
            Confirmation.target_kind == "run",
            Confirmation.target_id == run_id,
        )
        .order_by(Confirmation.created_at.desc(), Confirmation.id)
        .limit(limit)
    )
    return [
        confirmation_dict(c, public_url, now)
        | {
            "requester_id": c.requester_id,
            "checkpoint_step": (c.details or {}).get("checkpoint_step"),
        }
        for c in rows
    ]


def confirmation_view(
    session: Session, account_id: str, ref: str, public_url: str
) -> dict[str, Any]:
    confirmation = get_confirmation(session, account_id, ref)
    details = confirmation.details or {}
    booking = details.get("booking")
    if confirmation.target_kind == "booking":
        # The booking as it is now (run creation re-checks it anyway), not as it was requested.
        try:
            booking = booking_dict(get_booking(session, account_id, confirmation.target_id))
        except ItoError:
            booking = details.get("booking")
    requester = session.get(Principal, confirmation.requester_id)
    return {
        "figures": approval_figures(
            details.get("estimate"),
            cost_bound_usd=confirmation.cost_usd,
            created_at=confirmation.created_at,
            expires_at=confirmation.expires_at,
            decided_at=confirmation.decided_at,
            booking=booking,
            now=utcnow(),
        ),
        "c": confirmation_dict(confirmation, public_url),
        "booking": booking,
        "run": details.get("run"),
        "checkpoint_step": details.get("checkpoint_step"),
        "summary": details.get("manifest_summary"),
        "estimate": details.get("estimate"),
        "requester": {
            "id": confirmation.requester_id,
            "name": requester.name if requester else "(unknown)",
        },
    }


def approval_figures(
    estimate: Mapping[str, Any] | None,
    *,
    cost_bound_usd: float,
    created_at: datetime,
    expires_at: datetime,
    decided_at: datetime | None,
    booking: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """What the approval page shows, as a person reads it: instants in UTC to the second with
    "expires in 14 min" beside the exact time, the cost with its unit against the ceiling and
    the cost bound, and the stages the run executes with their durations (DESIGN §5.5, §8)."""
    figures: dict[str, Any] = {
        "created": utc_instant(created_at),
        "expires": utc_instant(expires_at),
        "expires_in": expires_in(expires_at, now),
        "decided": utc_instant(decided_at) if decided_at is not None else None,
        "cost_bound": usd(cost_bound_usd),
        "term": None,
        "cost": None,
        "stages": [],
    }
    if booking and booking.get("term_start") and booking.get("term_end"):
        figures["term"] = f"{_instant(booking['term_start'])} → {_instant(booking['term_end'])}"
    if not estimate or "cost_usd" not in estimate:
        return figures
    cost = float(estimate["cost_usd"])
    ceiling = float(estimate.get("ceiling_usd", 0.0))
    figures["cost"] = {
        "estimate": usd(cost),
        "ceiling": usd(ceiling),
        "within_ceiling": cost <= ceiling,
        "max_incremental": usd(float(estimate.get("max_incremental_cost_usd", 0.0))),
        "within_incremental": bool(estimate.get("within_incremental", True)),
        "within_bound": cost <= cost_bound_usd + 1e-9,
        "duration": duration(float(estimate.get("seconds", 0.0))),
        # The upper bound beside the expected figures (plans stored before it: none).
        "upper_estimate": usd(float(estimate["upper_cost_usd"]))
        if estimate.get("upper_cost_usd")
        else None,
        "upper_duration": duration(float(estimate["upper_seconds"]))
        if estimate.get("upper_seconds")
        else None,
        "gpu_hours": f"{float(estimate.get('gpu_hours', 0.0)):.3g}",
        "rate": usd(float(estimate.get("rate_usd_per_gpu_hour", 0.0))),
        "accelerators": estimate.get("accelerators"),
        "accelerator": str(estimate.get("accelerator", "")).upper(),
        # Time and cost rest on one assumption, named beside them.
        "assumed_mfu": float(estimate["assumed_mfu"]) if estimate.get("assumed_mfu") else None,
    }
    stored = estimate.get("stage_plan")
    if isinstance(stored, Mapping):
        plan = StagePlan.model_validate(stored)
        figures["stages"] = [
            {
                "name": stage.name,
                "kind": stage.kind.replace("_", " "),
                "steps": stage.steps,
                "tokens": token_count(stage.tokens) if stage.tokens else None,
                "seq_len": stage.seq_len or None,
                "battery": stage.battery,
                "duration": duration(stage.seconds),
                "upper_duration": duration(stage.upper),
            }
            for stage in plan.stages
        ]
    return figures


def _instant(value: object) -> str:
    """An ISO instant as the page shows it; anything else as it is."""
    try:
        return utc_instant(datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)
