"""Confirmations: a separate, single-use human approval bound to account, requester, action,
target, manifest digest and cost (DESIGN §5.5).

The reference ``cfr_…`` authorizes nothing by itself. Approval mints the capability — an HMAC,
under the server pepper, over every binding and the approver — which never leaves the server;
using a confirmation recomputes it, so a binding changed after approval (by anyone, even in the
database) no longer matches. It is consumed in the transaction that creates the workload.
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.gates import check_eligibility, check_resources
from ito.core.manifest import manifest_digest as _digest
from ito.core.pricing import CostEstimate, cents_up
from ito.core.states import ConfirmationAction, ConfirmationState, RunState
from ito.server.ids import new_id
from ito.server.services.bookings import booking_dict, booking_view, get_booking
from ito.server.services.credentials import AuthContext, hmac_hex
from ito.server.services.manifest_cache import parsed_manifest
from ito.server.services.manifests import load_manifest, store_manifest
from ito.server.services.revisions import resolve_revision
from ito.server.services.spending import check_waiting_at_bound, spend_limits
from ito.server.store.runtime_tables import RunLease
from ito.server.store.tables import Confirmation, Run, table_of, utcnow

__all__ = [
    "check_usable",
    "confirmation_dict",
    "decide_confirmation",
    "get_confirmation",
    "mark_consumed",
    "request_confirmation",
    "usable_confirmation",
]


_CONFIRMATIONS = table_of(Confirmation)
_CONSUME = (
    update(_CONFIRMATIONS)
    .where(
        _CONFIRMATIONS.c.id == bindparam("ref"),
        _CONFIRMATIONS.c.state == ConfirmationState.approved.value,
    )
    .values(
        state=ConfirmationState.consumed.value,
        consumed_at=bindparam("now"),
        consumed_by_run_id=bindparam("run_id"),
    )
)
"""Built once: the conditional consumption every gated action runs under the lock, as a plain
statement on the session's connection (no ORM bulk machinery, no autoflush)."""


def _train_bound(estimate: CostEstimate, asked: float | None) -> float:
    """The cost bound a train confirmation asks the approver to sign: the estimate's upper
    bound (within the manifest's ceiling and max incremental cost), rounded up to the cent, or
    the requester's own bound — never below the expected cost (the run could not start), never
    above the manifest's ceiling or max incremental cost."""
    cost = max(0.01, cents_up(estimate.cost_usd))
    hard = min(estimate.ceiling_usd, estimate.max_incremental_cost_usd)
    if asked is None:
        return max(cost, min(cents_up(estimate.upper_cost_usd), hard))
    asked = cents_up(asked)
    if asked < cost:
        raise ItoError(
            "budget_exceeded",
            "the estimate exceeds the cost bound asked for",
            cost_usd=estimate.cost_usd,
            bound_usd=asked,
        )
    if asked > hard:
        raise ItoError(
            "budget_exceeded",
            "the cost bound asked for is over the manifest's ceiling or max incremental cost",
            bound_usd=asked,
            limit_usd=hard,
        )
    return asked


def _new_bound(session: Session, run: Run, amount: float | None) -> float:
    """The bound a ``run.raise_cost_bound`` confirmation would approve, checked: the run waits
    at its bound, the amount is more than it has spent and within the manifest's own limits
    (its ceiling and max incremental cost: no approval lifts those)."""
    if amount is None:
        raise ItoError("invalid_arguments", "a raise-bound confirmation names the new bound")
    amount = cents_up(amount)
    check_waiting_at_bound(run, session.get(RunLease, run.id), amount)
    hard, _ = spend_limits(run)
    if amount > hard:
        raise ItoError(
            "budget_exceeded",
            "the new bound is over the manifest's ceiling or max incremental cost",
            limit_usd=hard,
        )
    return amount


def request_confirmation(
    session: Session,
    ctx: AuthContext,
    *,
    action: str,
    ttl_seconds: int,
    booking_id: str | None = None,
    manifest_digest: str | None = None,
    run_id: str | None = None,
    checkpoint_step: int | None = None,
    manifest_raw: bytes | None = None,
    cost_bound_usd: float | None = None,
) -> Confirmation:
    """A pending confirmation. For ``train.create`` the manifest may come along as bytes; it is
    then stored in this same transaction, so a refused request leaves nothing behind."""
    try:
        act = ConfirmationAction(action)
    except ValueError:
        raise ItoError(
            "invalid_arguments",
            "unknown confirmation action",
            allowed=[a.value for a in ConfirmationAction],
        ) from None
    now = utcnow()
    details: dict[str, Any] = {}
    if act is ConfirmationAction.train_create:
        if not booking_id or not manifest_digest or run_id:
            raise ItoError(
                "invalid_arguments", "train confirmations need a booking and a manifest, and no run"
            )
        booking = get_booking(session, ctx.account_id, booking_id)
        view = booking_view(booking)
        # Stale, revoked, released or incomplete bookings fail closed before any confirmation.
        check_eligibility(view, now)
        # Stored in this transaction: if any later check refuses, the row goes with it.
        if manifest_raw is not None:
            if _digest(manifest_raw) != manifest_digest:
                raise ItoError(
                    "manifest_digest_mismatch",
                    "the manifest bytes do not hash to the presented digest",
                )
            row, _ = store_manifest(session, ctx.account_id, manifest_raw)
        else:
            row, _ = load_manifest(session, ctx.account_id, manifest_digest)
        manifest = parsed_manifest(row.content, row.digest)
        result = check_resources(manifest, view, now)
        initial = resolve_revision(session, ctx.account_id, manifest, view)
        cost = _train_bound(result.estimate, cost_bound_usd)
        target_id = booking.id
        details = {
            "booking": booking_dict(booking),
            "manifest_summary": row.summary,
            "estimate": {k: v for k, v in result.estimate.to_dict().items() if k != "stages"},
        }
        if initial is not None:
            details["initial_weights"] = initial.to_dict()
    else:
        if not run_id or booking_id or manifest_digest:
            raise ItoError("invalid_arguments", "run confirmations name a run and nothing else")
        run = session.scalar(select(Run).where(Run.id == run_id, Run.account_id == ctx.account_id))
        if run is None:
            raise ItoError("run_not_found")
        if act is ConfirmationAction.run_cancel and not RunState(run.state).is_cancellable():
            raise ItoError("run_not_cancellable", state=run.state)
        if act is ConfirmationAction.run_restart:
            if checkpoint_step is None:
                raise ItoError("invalid_arguments", "a restart names the checkpoint step")
            lease = session.get(RunLease, run.id)
            proposal = lease.proposal if lease is not None else None
            if run.state != RunState.awaiting_approval.value or not proposal:
                raise ItoError(
                    "invalid_transition", "the run has no proposed restart", state=run.state
                )
            if checkpoint_step != proposal.get("checkpoint_step"):
                raise ItoError(
                    "confirmation_mismatch",
                    "the proposed restart is from another checkpoint",
                    proposed=proposal.get("checkpoint_step"),
                )
            details["checkpoint_step"] = checkpoint_step
            details["proposal"] = proposal
        cost = 0.0
        if act is ConfirmationAction.run_raise_bound:
            cost = _new_bound(session, run, cost_bound_usd)
            waiting = session.get(RunLease, run.id)
            details["proposal"] = waiting.proposal if waiting is not None else None
            details["cost_bound_usd"] = cost
        elif cost_bound_usd is not None:
            raise ItoError(
                "invalid_arguments", "only train and raise-bound confirmations name a bound"
            )
        target_id, manifest_digest = run.id, run.manifest_digest
        details["run"] = {"run_id": run.id, "state": run.state, "booking_id": run.booking_id}
    confirmation = Confirmation(
        id=new_id("cfr"),
        account_id=ctx.account_id,
        requester_id=ctx.principal_id,
        action=act.value,
        target_kind=act.target_kind,
        target_id=target_id,
        manifest_digest=manifest_digest,
        cost_usd=cost,
        details=details,
        state=ConfirmationState.pending.value,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_seconds),
    )
    session.add(confirmation)
    session.flush()
    return confirmation


def get_confirmation(
    session: Session, account_id: str, ref: str, *, for_update: bool = False
) -> Confirmation:
    query = select(Confirmation).where(
        Confirmation.id == ref, Confirmation.account_id == account_id
    )
    if for_update:
        query = query.with_for_update()
    confirmation = session.scalar(query)
    if confirmation is None:
        raise ItoError("confirmation_not_found")
    return confirmation


def decide_confirmation(
    session: Session, ctx: AuthContext, pepper: str, ref: str, *, approve: bool
) -> Confirmation:
    confirmation = get_confirmation(session, ctx.account_id, ref, for_update=True)
    if confirmation.requester_id == ctx.principal_id:
        raise ItoError("self_approval_forbidden")
    now = utcnow()
    if confirmation.state == ConfirmationState.pending.value and now >= confirmation.expires_at:
        raise ItoError("confirmation_expired")
    if confirmation.state != ConfirmationState.pending.value:
        raise ItoError("confirmation_not_pending", state=confirmation.state)
    confirmation.decided_at = now
    confirmation.approver_id = ctx.principal_id
    if approve:
        confirmation.state = ConfirmationState.approved.value
        confirmation.capability_hash = _seal(pepper, confirmation)
    else:
        confirmation.state = ConfirmationState.rejected.value
    return confirmation


def usable_confirmation(
    session: Session, ctx: AuthContext, pepper: str, ref: str, now: datetime
) -> Confirmation:
    """Gate 3's state checks, shared by every use (train, cancel, cleanup, restart): approved,
    unexpired, unconsumed, capability intact, and presented by the principal that requested it
    — another requester of the same account cannot spend it (``confirmation_mismatch``)."""
    confirmation = get_confirmation(session, ctx.account_id, ref)
    check_usable(confirmation, ctx, pepper, now)
    return confirmation


def check_usable(
    confirmation: Confirmation | Row[Any], ctx: AuthContext, pepper: str, now: datetime
) -> None:
    """:func:`usable_confirmation`'s checks on a confirmation already loaded."""
    state = confirmation.state
    if state == ConfirmationState.consumed.value:
        raise ItoError("confirmation_consumed")
    if state == ConfirmationState.rejected.value:
        raise ItoError("confirmation_rejected")
    if now >= confirmation.expires_at:
        raise ItoError("confirmation_expired")
    if state == ConfirmationState.pending.value:
        raise ItoError("confirmation_pending")
    expected = _seal(pepper, confirmation)
    if not confirmation.capability_hash or not hmac.compare_digest(
        confirmation.capability_hash, expected
    ):
        raise ItoError(
            "confirmation_mismatch", "the confirmation's bindings changed after approval"
        )
    if confirmation.requester_id != ctx.principal_id:
        raise ItoError(
            "confirmation_mismatch",
            "the confirmation was requested by another principal; request your own",
        )


def mark_consumed(
    session: Session, confirmation: Confirmation | Row[Any], run_id: str, now: datetime
) -> None:
    """Consume exactly once: a conditional update that only one transaction can win."""
    result = session.connection().execute(
        _CONSUME, {"ref": confirmation.id, "now": now, "run_id": run_id}
    )
    if getattr(result, "rowcount", 0) != 1:
        raise ItoError("confirmation_consumed")


def _seal(pepper: str, c: Confirmation | Row[Any]) -> str:
    bindings = [
        c.id,
        c.account_id,
        c.requester_id,
        c.action,
        c.target_kind,
        c.target_id,
        c.manifest_digest,
        f"{c.cost_usd:.6f}",
        c.expires_at.isoformat(),
        c.approver_id,
    ]
    return hmac_hex(pepper, "capability:" + json.dumps(bindings))


def confirmation_dict(
    c: Confirmation, public_url: str, now: datetime | None = None
) -> dict[str, Any]:
    now = now or utcnow()
    state = c.state
    if state in ("pending", "approved") and now >= c.expires_at:
        state = "expired"
    return {
        "confirmation_ref": c.id,
        "action": c.action,
        "target": {"kind": c.target_kind, "id": c.target_id},
        "manifest_id": c.manifest_digest,
        "cost_usd": c.cost_usd,
        "state": state,
        "expires_at": c.expires_at.isoformat(),
        "created_at": c.created_at.isoformat(),
        "decided_at": c.decided_at.isoformat() if c.decided_at else None,
        "approval_url": f"{public_url.rstrip('/')}/ui/confirmations/{c.id}",
        "approve_command": f"ito approve {c.id}",
        "details": c.details,
    }
