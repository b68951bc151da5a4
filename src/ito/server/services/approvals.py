"""What a signed-in approver sees on the web pages: the account's pending confirmations, and
one confirmation with every binding it approves (DESIGN §5.5: booking, digest, manifest
summary, cost, requester, expiry). Tenant-scoped like every read: another account's reference
answers ``confirmation_not_found``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.server.services.bookings import booking_dict, get_booking
from ito.server.services.confirmations import confirmation_dict, get_confirmation
from ito.server.store.tables import Account, Confirmation, Principal

__all__ = ["account_view", "confirmation_view", "pending_confirmations", "run_confirmations"]


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
