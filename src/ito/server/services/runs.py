"""Runs: the gated creation (DESIGN §5.8), reads, and the one transition function (§5.7).

:func:`create_run` evaluates every gate in order inside one write transaction and either commits
the run, the consumed confirmation, the idempotency record (and the manifest, if its bytes came
with the request) together, or rolls all of it back. A key already bound to a run with the same
fingerprint replays that run before any gate is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.gates import (
    check_eligibility,
    check_resources,
    idempotency_fingerprint,
    validate_idempotency_key,
)
from ito.core.manifest import manifest_digest, parse_manifest
from ito.core.states import ConfirmationAction, RunState, check_transition
from ito.server.ids import new_id
from ito.server.services.bookings import booking_view, get_booking
from ito.server.services.confirmations import mark_consumed, usable_confirmation
from ito.server.services.credentials import AuthContext
from ito.server.services.idempotency import find_key, lock_key, replayable, reserve_key
from ito.server.services.manifests import find_manifest, store_manifest
from ito.server.store.db import Database
from ito.server.store.tables import (
    Confirmation,
    IdempotencyRecord,
    Run,
    RunEvent,
    utcnow,
)

__all__ = [
    "CreateRunRequest",
    "CreateRunResult",
    "create_run",
    "event_dict",
    "get_run",
    "list_events",
    "list_runs",
    "record_event",
    "run_dict",
    "transition_run",
]

ACTION = ConfirmationAction.train_create.value


@dataclass(frozen=True)
class CreateRunRequest:
    booking_id: str
    manifest_digest: str
    confirmation_ref: str
    idempotency_key: str
    manifest_raw: bytes | None = None
    """The manifest's bytes, sent only when the server did not have them."""


@dataclass(frozen=True)
class CreateRunResult:
    data: dict[str, Any]
    replayed: bool


def create_run(db: Database, ctx: AuthContext, pepper: str,
               req: CreateRunRequest) -> CreateRunResult:
    validate_idempotency_key(req.idempotency_key)
    raw = _decode_manifest(req)
    fingerprint = idempotency_fingerprint(ACTION, req.booking_id, req.manifest_digest,
                                          req.confirmation_ref)
    try:
        with db.write() as session:
            return _create_in_transaction(session, db, ctx, pepper, req, raw, fingerprint)
    except ItoError as exc:
        if exc.code == "store_busy":
            raise ItoError("idempotency_in_progress",
                           idempotency_key=req.idempotency_key) from None
        raise


def _create_in_transaction(
    session: Session, db: Database, ctx: AuthContext, pepper: str, req: CreateRunRequest,
    raw: bytes | None, fingerprint: str,
) -> CreateRunResult:
    now = utcnow()
    lock_key(session, db, ctx.account_id, ACTION, req.idempotency_key)
    existing = find_key(session, ctx.account_id, ACTION, req.idempotency_key)
    if existing is not None:
        return _replay(session, existing, fingerprint)

    # Gate 1: fresh eligibility, computed now, inside this transaction.
    booking = get_booking(session, ctx.account_id, req.booking_id)
    view = booking_view(booking)
    check_eligibility(view, now)

    # Gate 2: the manifest is known (or its bytes came along), valid, and its digest is the one
    # the confirmation is bound to.
    confirmation = _confirmation_for(session, ctx.account_id, req.confirmation_ref)
    if confirmation.manifest_digest != req.manifest_digest:
        raise ItoError("manifest_digest_mismatch",
                       "the manifest is not the one the confirmation approved",
                       confirmation_manifest_id=confirmation.manifest_digest,
                       presented_manifest_id=req.manifest_digest)
    row = find_manifest(session, ctx.account_id, req.manifest_digest)
    if row is not None:
        manifest = parse_manifest(row.content)
    elif raw is not None:
        manifest = parse_manifest(raw)
    else:
        raise ItoError("manifest_not_found", digest=req.manifest_digest)

    # Gate 3: approved, unexpired, unconsumed, every binding equal.
    confirmation = usable_confirmation(session, ctx, pepper, req.confirmation_ref, now)
    if confirmation.action != ACTION or confirmation.target_kind != "booking" \
            or confirmation.target_id != booking.id:
        raise ItoError("confirmation_mismatch", "the confirmation approves another action or "
                       "booking", bound_action=confirmation.action,
                       bound_target=confirmation.target_id)

    # Gate 4: reserve the key. Concurrent holders of the same key wait here for the winner's
    # commit (unique constraint / database lock), then replay its run.
    reserved = reserve_key(session, db, ctx.account_id, ACTION, req.idempotency_key,
                           fingerprint)
    if reserved is None:
        existing = find_key(session, ctx.account_id, ACTION, req.idempotency_key)
        assert existing is not None
        return _replay(session, existing, fingerprint)

    # Gate 5: fabric, capacity, data policy, checkpoint storage, term and cost.
    run_id = new_id("run")
    checked = check_resources(manifest, view, now, run_id_hint=run_id)
    if checked.estimate.cost_usd > confirmation.cost_usd + 1e-9:
        raise ItoError("confirmation_mismatch", "the estimate exceeds the confirmation's cost "
                       "bound", cost_usd=checked.estimate.cost_usd,
                       bound_usd=confirmation.cost_usd)

    mark_consumed(session, confirmation, run_id, now)
    if row is None and raw is not None:
        store_manifest(session, ctx.account_id, raw)
    run = Run(
        id=run_id, account_id=ctx.account_id, booking_id=booking.id,
        manifest_digest=req.manifest_digest, idempotency_key=req.idempotency_key,
        confirmation_id=confirmation.id, state=RunState.queued.value, stage=None,
        cleanup_state="none", estimate=checked.estimate.to_dict(),
        checkpoint_uri=checked.checkpoint_uri, created_by=ctx.principal_id,
        created_at=now, updated_at=now,
    )
    session.add(run)
    session.flush()
    record_event(session, run, "created", "run created behind all five gates", to_state="queued",
           data={"confirmation_ref": confirmation.id, "cost_usd": checked.estimate.cost_usd,
                 "idempotency_key": req.idempotency_key})
    data = _create_data(run)
    reserved.run_id = run.id
    reserved.response = data
    return CreateRunResult(data=data, replayed=False)


def _decode_manifest(req: CreateRunRequest) -> bytes | None:
    if req.manifest_raw is None:
        return None
    if manifest_digest(req.manifest_raw) != req.manifest_digest:
        raise ItoError("manifest_digest_mismatch", "the manifest bytes do not hash to the "
                       "presented digest")
    return req.manifest_raw


def _confirmation_for(session: Session, account_id: str, ref: str) -> Confirmation:
    confirmation = session.scalar(select(Confirmation).where(
        Confirmation.id == ref, Confirmation.account_id == account_id))
    if confirmation is None:
        raise ItoError("confirmation_not_found")
    return confirmation


def _replay(session: Session, record: IdempotencyRecord, fingerprint: str) -> CreateRunResult:
    data = replayable(record, fingerprint)
    run = session.get(Run, record.run_id)
    assert run is not None
    data["state"] = run.state
    data["stage"] = run.stage
    return CreateRunResult(data=data, replayed=True)


def _create_data(run: Run) -> dict[str, Any]:
    return {"booking_id": run.booking_id, "run_id": run.id, "manifest_id": run.manifest_digest,
            "idempotency_key": run.idempotency_key, "state": run.state, "stage": run.stage}


def transition_run(session: Session, run: Run, target: RunState, *, reason: str,
                   stage: str | None = None, failure_code: str | None = None,
                   data: dict[str, Any] | None = None) -> RunEvent:
    """The only way a run changes state: checked against the table, recorded as an event."""
    current = RunState(run.state)
    check_transition(current, target)
    now = utcnow()
    run.state = target.value
    if stage is not None:
        run.stage = stage
    if failure_code is not None:
        run.failure_code = failure_code
    run.updated_at = now
    if target.is_terminal():
        run.finished_at = now
    return record_event(session, run, "state", reason, from_state=current.value,
                  to_state=target.value, data=data or {})


def record_event(session: Session, run: Run, kind: str, message: str, *,
           from_state: str | None = None, to_state: str | None = None,
           data: dict[str, Any] | None = None) -> RunEvent:
    event = RunEvent(run_id=run.id, account_id=run.account_id, kind=kind, from_state=from_state,
                     to_state=to_state, message=message, data=data or {}, created_at=utcnow())
    session.add(event)
    session.flush()
    return event


def get_run(session: Session, account_id: str, run_id: str) -> Run:
    """This account's run; another tenant's answers exactly like a missing one."""
    run = session.scalar(select(Run).where(Run.id == run_id, Run.account_id == account_id))
    if run is None:
        raise ItoError("run_not_found")
    return run


def list_runs(session: Session, account_id: str, *, idempotency_key: str | None = None,
              booking_id: str | None = None, limit: int = 50) -> list[Run]:
    query = select(Run).where(Run.account_id == account_id)
    if idempotency_key is not None:
        query = query.where(Run.idempotency_key == idempotency_key)
    if booking_id is not None:
        query = query.where(Run.booking_id == booking_id)
    return list(session.scalars(query.order_by(Run.created_at.desc(), Run.id).limit(limit)))


def list_events(session: Session, account_id: str, run_id: str, *, after: int = 0,
                limit: int = 200) -> list[RunEvent]:
    get_run(session, account_id, run_id)
    return list(session.scalars(
        select(RunEvent).where(RunEvent.run_id == run_id, RunEvent.account_id == account_id,
                               RunEvent.id > after).order_by(RunEvent.id).limit(limit)))


def run_dict(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "booking_id": run.booking_id,
        "manifest_id": run.manifest_digest,
        "idempotency_key": run.idempotency_key,
        "state": run.state,
        "stage": run.stage,
        "cleanup_state": run.cleanup_state,
        "terminal": RunState(run.state).is_terminal(),
        "confirmation_ref": run.confirmation_id,
        "estimate": run.estimate,
        "checkpoint_uri": run.checkpoint_uri,
        "failure_code": run.failure_code,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def event_dict(event: RunEvent) -> dict[str, Any]:
    return {"id": event.id, "kind": event.kind, "from_state": event.from_state,
            "to_state": event.to_state, "message": event.message, "data": event.data,
            "at": event.created_at.isoformat()}
