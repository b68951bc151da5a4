"""Runs: the gated creation (DESIGN §5.8), reads, and the one transition function (§5.7).

:func:`create_run` commits the run, the consumed confirmation, the idempotency record (and the
manifest, if its bytes came with the request) together in one write transaction, or rolls all
of it back. Work that needs no lock (parsing the manifest, gate 5's checks and estimate) is done
before that transaction, so the write lock is held for a handful of statements. A key already
bound to a run with the same fingerprint replays that run before any gate is looked at.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, insert, select
from sqlalchemy.engine import Connection, Row
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.gates import (
    BookingView,
    ResourceCheck,
    check_eligibility,
    check_resources,
    idempotency_fingerprint,
    validate_idempotency_key,
)
from ito.core.manifest import Manifest, manifest_digest
from ito.core.revisions import InitialWeights
from ito.core.stage_plan import stored_stage_plan
from ito.core.states import ConfirmationAction, RunState, check_transition
from ito.server.ids import new_id
from ito.server.services.bookings import booking_view, get_booking
from ito.server.services.confirmations import check_usable, mark_consumed
from ito.server.services.credentials import AuthContext
from ito.server.services.hints import (
    booking_hint,
    manifest_known,
    remember_booking,
    remember_manifest,
)
from ito.server.services.idempotency import (
    find_key,
    replayable,
    reserve_key,
)
from ito.server.services.manifest_cache import cached_manifest, parsed_manifest
from ito.server.services.manifests import find_manifest, store_manifest
from ito.server.services.revisions import resolve_revision
from ito.server.services.run_events import record_event
from ito.server.services.run_progress import run_progress
from ito.server.store.db import Database
from ito.server.store.tables import (
    Booking,
    Confirmation,
    IdempotencyRecord,
    Run,
    RunEvent,
    table_of,
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
    "run_dict",
    "run_status",
    "transition_run",
]

ACTION = ConfirmationAction.train_create.value
STATUS_EVENTS = 200
"""How many of a run's first events its status carries (the rest: ``/events?after=``)."""

# The hot reads, built once: a request then pays for the query, not for building it.
_RUN = select(Run).where(Run.id == bindparam("run_id"), Run.account_id == bindparam("account_id"))
_EVENTS = (
    select(RunEvent)
    .where(
        RunEvent.run_id == bindparam("run_id"),
        RunEvent.account_id == bindparam("account_id"),
        RunEvent.id > bindparam("after"),
    )
    .order_by(RunEvent.id)
    .limit(bindparam("limit"))
)
# The status poll, as plain rows (the tables' columns): the most frequent request of all, and
# one that only reads, so it skips the ORM's identity map and bookkeeping.
_RUN_ROW = select(Run.__table__).where(
    Run.id == bindparam("run_id"), Run.account_id == bindparam("account_id")
)
_EVENT_ROWS = (
    select(RunEvent.__table__)
    .where(RunEvent.run_id == bindparam("run_id"), RunEvent.account_id == bindparam("account_id"))
    .order_by(RunEvent.id)
    .limit(STATUS_EVENTS)
)
_LATEST_EVENT = (
    select(RunEvent.__table__)
    .where(RunEvent.run_id == bindparam("run_id"), RunEvent.account_id == bindparam("account_id"))
    .order_by(RunEvent.id.desc())
    .limit(1)
)
_INSERT_RUN = insert(table_of(Run))
_INSERT_EVENT = insert(table_of(RunEvent))
_VIEW_FIELDS = [f.name for f in fields(BookingView)]
_BOOKINGS, _CONFIRMATIONS = table_of(Booking), table_of(Confirmation)
_BOOKING_AND_CONFIRMATION = (
    select(
        *(_BOOKINGS.c[name].label(f"booking_{name}") for name in _VIEW_FIELDS),
        *_CONFIRMATIONS.c,
    )
    .select_from(
        _BOOKINGS.outerjoin(
            _CONFIRMATIONS,
            and_(
                _CONFIRMATIONS.c.id == bindparam("ref"),
                _CONFIRMATIONS.c.account_id == bindparam("account_id"),
            ),
        )
    )
    .where(
        _BOOKINGS.c.id == bindparam("booking_id"),
        _BOOKINGS.c.account_id == bindparam("account_id"),
    )
)
"""What gates 1 to 3 read under the write lock, in one statement: this account's booking (its
view's columns, prefixed) and, beside it, this account's confirmation as a plain row (its own
column names; all ``NULL`` when there is none). The confirmation is consumed by a conditional
UPDATE."""


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


def create_run(
    db: Database, ctx: AuthContext, pepper: str, req: CreateRunRequest
) -> CreateRunResult:
    """Create a run behind the five gates, holding the write lock as briefly as it can.

    First, outside any write transaction, what needs no lock: the manifest (parsed once per
    process, by digest) and gate 5's resource checks and estimate, against the booking as this
    process last saw it (:func:`_prepare`). The write transaction then does only what must be
    atomic: reserve the key (a key already bound replays its run), re-check the booking's
    eligibility (and gate 5 again only if the booking is not as it was seen), check and consume
    the confirmation, insert. If the preparation met any refusal, the write transaction instead
    evaluates every gate in order (:func:`_create_in_transaction`), so a refused request gets
    exactly the code of the first failing gate, as before."""
    validate_idempotency_key(req.idempotency_key)
    raw = _decode_manifest(req)
    fingerprint = idempotency_fingerprint(
        ACTION, req.booking_id, req.manifest_digest, req.confirmation_ref
    )
    try:
        prepared = _prepare(db, ctx, req, raw)
        with db.write() as session:
            if prepared is None:
                return _create_in_transaction(session, db, ctx, pepper, req, raw, fingerprint)
            return _commit_prepared(session, db, ctx, pepper, req, raw, fingerprint, prepared)
    except ItoError as exc:
        if exc.code == "store_busy":
            raise ItoError("idempotency_in_progress", idempotency_key=req.idempotency_key) from None
        raise


@dataclass(frozen=True)
class _Prepared:
    """What the read before the write transaction established (see :func:`create_run`)."""

    view: BookingView
    manifest: Manifest
    manifest_stored: bool
    run_id: str
    checked: ResourceCheck


def _prepare(
    db: Database, ctx: AuthContext, req: CreateRunRequest, raw: bytes | None
) -> _Prepared | None:
    """The lock-free part of a create, or ``None`` when some check refused (the write
    transaction then finds the first failing gate, in order). It works from this process's
    hints (:mod:`ito.server.services.hints`: the booking as last seen, manifests known to the
    account) and reads the database only for what they lack."""
    view = booking_hint(ctx.account_id, req.booking_id)
    manifest = cached_manifest(req.manifest_digest)
    stored = manifest_known(ctx.account_id, req.manifest_digest)
    try:
        if view is None or manifest is None or not (stored or raw is not None):
            with db.read() as session:
                view = booking_view(get_booking(session, ctx.account_id, req.booking_id))
                remember_booking(view)
                row = (
                    find_manifest(session, ctx.account_id, req.manifest_digest)
                    if manifest is None or not stored
                    else None
                )
                if row is not None:
                    stored = True
                    remember_manifest(ctx.account_id, row.digest)
                    manifest = parsed_manifest(row.content, row.digest)
        now = utcnow()
        check_eligibility(view, now)
        if manifest is None and raw is not None:
            manifest = parsed_manifest(raw, req.manifest_digest)
        if manifest is None or not (stored or raw is not None):
            return None
        run_id = new_id("run")
        checked = check_resources(manifest, view, now, run_id_hint=run_id)
    except ItoError:
        return None
    return _Prepared(
        view=view, manifest=manifest, manifest_stored=stored, run_id=run_id, checked=checked
    )


def _commit_prepared(
    session: Session,
    db: Database,
    ctx: AuthContext,
    pepper: str,
    req: CreateRunRequest,
    raw: bytes | None,
    fingerprint: str,
    prepared: _Prepared,
) -> CreateRunResult:
    """The atomic part of a create whose checks were prepared. Any refusal rolls back the
    reservation with everything else; the gates keep their order among themselves."""
    now = utcnow()
    replay = _reserve_or_replay(session, db, ctx, req, fingerprint, prepared.run_id)
    if replay is not None:
        return replay

    view, confirmation = _gate_1(session, ctx, req, now)

    # Gate 2: the manifest (its existence or bytes were established and it cannot change:
    # content-addressed, immutable) is the one the confirmation is bound to.
    _check_digest(confirmation, req)

    # Gate 3, on the row just read.
    check_usable(confirmation, ctx, pepper, now)
    _check_binding(confirmation, view.id)

    # Gate 5: prepared; evaluated again only if the booking changed or its term ran short.
    checked = prepared.checked
    if view != prepared.view or now + timedelta(seconds=checked.estimate.seconds) > view.term_end:
        checked = check_resources(prepared.manifest, view, now, run_id_hint=prepared.run_id)
    # The initial weights, resolved under the lock: the source run's checkpoints as they are.
    initial = resolve_revision(session, ctx.account_id, prepared.manifest, view)
    return _write_run(
        session,
        ctx,
        req,
        raw if not prepared.manifest_stored else None,
        run_id=prepared.run_id,
        view=view,
        confirmation=confirmation,
        checked=checked,
        initial=initial,
        now=now,
    )


def _create_in_transaction(
    session: Session,
    db: Database,
    ctx: AuthContext,
    pepper: str,
    req: CreateRunRequest,
    raw: bytes | None,
    fingerprint: str,
) -> CreateRunResult:
    """Every gate in order, inside the write transaction: the path of a request the lock-free
    read refused, so the refusal is the first failing gate's, seen under the lock."""
    now = utcnow()
    run_id = new_id("run")
    replay = _reserve_or_replay(session, db, ctx, req, fingerprint, run_id)
    if replay is not None:
        return replay

    view, confirmation = _gate_1(session, ctx, req, now)

    # Gate 2: the manifest is known (or its bytes came along), valid, and its digest is the one
    # the confirmation is bound to.
    _check_digest(confirmation, req)
    row = find_manifest(session, ctx.account_id, req.manifest_digest)
    if row is not None:
        remember_manifest(ctx.account_id, row.digest)
        manifest = parsed_manifest(row.content, row.digest)
    elif raw is not None:
        manifest = parsed_manifest(raw, req.manifest_digest)
    else:
        raise ItoError("manifest_not_found", digest=req.manifest_digest)

    # Gate 3: approved, unexpired, unconsumed, every binding equal.
    check_usable(confirmation, ctx, pepper, now)
    _check_binding(confirmation, view.id)

    # Gate 4: the key, reserved above.

    # Gate 5: fabric, capacity, data policy, checkpoint storage, term and cost.
    checked = check_resources(manifest, view, now, run_id_hint=run_id)
    initial = resolve_revision(session, ctx.account_id, manifest, view)
    return _write_run(
        session,
        ctx,
        req,
        raw if row is None else None,
        run_id=run_id,
        view=view,
        confirmation=confirmation,
        checked=checked,
        initial=initial,
        now=now,
    )


def _reserve_or_replay(
    session: Session,
    db: Database,
    ctx: AuthContext,
    req: CreateRunRequest,
    fingerprint: str,
    run_id: str,
) -> CreateRunResult | None:
    """Gate 4 first, in both paths: reserve the key, bound at once to the run this transaction
    will create and the response a retry replays (``None``: reserved), or replay the run it is
    bound to (or refuse its reuse for something else). The reservation is also the key's lock:
    a second holder waits on the unique index until this transaction ends (PostgreSQL; SQLite's
    ``BEGIN IMMEDIATE`` serialises writers anyway), then finds the record and replays it — no
    separate advisory lock. A refusal after it rolls the reservation back with the rest."""
    record_id = reserve_key(
        session,
        db,
        ctx.account_id,
        ACTION,
        req.idempotency_key,
        fingerprint,
        bound=(run_id, _created(req, run_id)),
    )
    if record_id is not None:
        return None
    existing = find_key(session, ctx.account_id, ACTION, req.idempotency_key)
    assert existing is not None
    return _replay(session, existing, fingerprint)


def _gate_1(
    session: Session, ctx: AuthContext, req: CreateRunRequest, now: datetime
) -> tuple[BookingView, Row[Any]]:
    """Gate 1, fresh: the booking as it is now, read under the write lock, eligible — and, in
    the same statement, the confirmation gates 2 and 3 judge (``confirmation_not_found`` only
    once gate 1 has passed, so the gates keep their order)."""
    row = (
        session.connection()
        .execute(
            _BOOKING_AND_CONFIRMATION,
            {
                "booking_id": req.booking_id,
                "account_id": ctx.account_id,
                "ref": req.confirmation_ref,
            },
        )
        .first()
    )
    if row is None:
        raise ItoError("booking_not_found")
    view = BookingView(**{name: row._mapping[f"booking_{name}"] for name in _VIEW_FIELDS})
    remember_booking(view)
    check_eligibility(view, now)
    if row.id is None:
        raise ItoError("confirmation_not_found")
    return view, row


def _write_run(
    session: Session,
    ctx: AuthContext,
    req: CreateRunRequest,
    new_manifest: bytes | None,
    *,
    run_id: str,
    view: BookingView,
    confirmation: Confirmation | Row[Any],
    checked: ResourceCheck,
    initial: InitialWeights | None,
    now: datetime,
) -> CreateRunResult:
    """The end of every create that passed gates 1 to 5: the cost bound, then the writes —
    the confirmation consumed, the manifest stored (``new_manifest``: bytes the store lacks),
    the run and its event (the key was bound to them when it was reserved). The resolved
    initial weights are recorded in the run's estimate, beside its parallelism plan."""
    _check_cost_bound(checked, confirmation)
    _check_initial_weights(initial, confirmation)
    mark_consumed(session, confirmation, run_id, now)
    if new_manifest is not None:
        store_manifest(session, ctx.account_id, new_manifest)
    _insert_run(session, ctx, req, run_id, view.id, confirmation, checked, initial, now)
    return CreateRunResult(data=_created(req, run_id), replayed=False)


def _check_digest(confirmation: Confirmation | Row[Any], req: CreateRunRequest) -> None:
    if confirmation.manifest_digest != req.manifest_digest:
        raise ItoError(
            "manifest_digest_mismatch",
            "the manifest is not the one the confirmation approved",
            confirmation_manifest_id=confirmation.manifest_digest,
            presented_manifest_id=req.manifest_digest,
        )


def _check_binding(confirmation: Confirmation | Row[Any], booking_id: str) -> None:
    if (
        confirmation.action != ACTION
        or confirmation.target_kind != "booking"
        or confirmation.target_id != booking_id
    ):
        raise ItoError(
            "confirmation_mismatch",
            "the confirmation approves another action or booking",
            bound_action=confirmation.action,
            bound_target=confirmation.target_id,
        )


def _check_cost_bound(checked: ResourceCheck, confirmation: Confirmation | Row[Any]) -> None:
    if checked.estimate.cost_usd > confirmation.cost_usd + 1e-9:
        raise ItoError(
            "confirmation_mismatch",
            "the estimate exceeds the confirmation's cost bound",
            cost_usd=checked.estimate.cost_usd,
            bound_usd=confirmation.cost_usd,
        )


def _check_initial_weights(
    initial: InitialWeights | None, confirmation: Confirmation | Row[Any]
) -> None:
    """The weights the run would start from are the ones the approver was shown (the source
    run may have committed that step again since, with other weights)."""
    approved = (confirmation.details or {}).get("initial_weights")
    resolved = initial.to_dict() if initial is not None else None
    if approved != resolved:
        raise ItoError(
            "confirmation_mismatch",
            "the initial weights are not the ones the confirmation approved",
            approved_sha256=(approved or {}).get("sha256"),
            resolved_sha256=(resolved or {}).get("sha256"),
        )


def _insert_run(
    session: Session,
    ctx: AuthContext,
    req: CreateRunRequest,
    run_id: str,
    booking_id: str,
    confirmation: Confirmation | Row[Any],
    checked: ResourceCheck,
    initial: InitialWeights | None,
    now: datetime,
) -> None:
    """The run and its ``created`` event: two plain INSERTs on the session's connection (no
    ORM unit of work for rows this transaction only writes)."""
    connection = session.connection()
    connection.execute(
        _INSERT_RUN,
        {
            "id": run_id,
            "account_id": ctx.account_id,
            "booking_id": booking_id,
            "manifest_digest": req.manifest_digest,
            "idempotency_key": req.idempotency_key,
            "confirmation_id": confirmation.id,
            "state": RunState.queued.value,
            "stage": None,
            "cleanup_state": "none",
            "estimate": checked.estimate.to_dict()
            | ({"initial_weights": initial.to_dict()} if initial is not None else {}),
            "checkpoint_uri": checked.checkpoint_uri,
            "created_by": ctx.principal_id,
            "created_at": now,
            "updated_at": now,
            "finished_at": None,
            "failure_code": None,
            # The approved bound is a spending limit, held live (DESIGN §7.7).
            "cost_bound_usd": confirmation.cost_usd,
        },
    )
    connection.execute(
        _INSERT_EVENT,
        {
            "run_id": run_id,
            "account_id": ctx.account_id,
            "kind": "created",
            "from_state": None,
            "to_state": RunState.queued.value,
            "message": "run created behind all five gates",
            "data": {
                "confirmation_ref": confirmation.id,
                "cost_usd": checked.estimate.cost_usd,
                "idempotency_key": req.idempotency_key,
            },
            "created_at": now,
        },
    )


def _created(req: CreateRunRequest, run_id: str) -> dict[str, Any]:
    """The answer to a create (and what a retry with its key replays)."""
    return {
        "booking_id": req.booking_id,
        "run_id": run_id,
        "manifest_id": req.manifest_digest,
        "idempotency_key": req.idempotency_key,
        "state": RunState.queued.value,
        "stage": None,
    }


def _decode_manifest(req: CreateRunRequest) -> bytes | None:
    if req.manifest_raw is None:
        return None
    if manifest_digest(req.manifest_raw) != req.manifest_digest:
        raise ItoError(
            "manifest_digest_mismatch", "the manifest bytes do not hash to the presented digest"
        )
    return req.manifest_raw


def _replay(session: Session, record: IdempotencyRecord, fingerprint: str) -> CreateRunResult:
    data = replayable(record, fingerprint)
    run = session.get(Run, record.run_id)
    assert run is not None
    data["state"] = run.state
    data["stage"] = run.stage
    return CreateRunResult(data=data, replayed=True)


def transition_run(
    session: Session,
    run: Run,
    target: RunState,
    *,
    reason: str,
    stage: str | None = None,
    failure_code: str | None = None,
    data: dict[str, Any] | None = None,
) -> RunEvent:
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
    return record_event(
        session,
        run,
        "state",
        reason,
        from_state=current.value,
        to_state=target.value,
        data=data or {},
    )


def get_run(session: Session, account_id: str, run_id: str) -> Run:
    """This account's run; another tenant's answers exactly like a missing one."""
    run = session.scalar(_RUN, {"run_id": run_id, "account_id": account_id})
    if run is None:
        raise ItoError("run_not_found")
    return run


def list_runs(
    session: Session,
    account_id: str,
    *,
    idempotency_key: str | None = None,
    booking_id: str | None = None,
    state: str | None = None,
    limit: int = 50,
) -> list[Run]:
    query = select(Run).where(Run.account_id == account_id)
    if state is not None:
        query = query.where(Run.state == state)
    if idempotency_key is not None:
        query = query.where(Run.idempotency_key == idempotency_key)
    if booking_id is not None:
        query = query.where(Run.booking_id == booking_id)
    return list(session.scalars(query.order_by(Run.created_at.desc(), Run.id).limit(limit)))


def list_events(
    session: Session, account_id: str, run_id: str, *, after: int = 0, limit: int = 200
) -> list[RunEvent]:
    return _events_of(session, get_run(session, account_id, run_id), after=after, limit=limit)


def _events_of(session: Session, run: Run, *, after: int = 0, limit: int = 200) -> list[RunEvent]:
    """One indexed page (``run_id, id``) of a run already checked to be the caller's."""
    return list(
        session.scalars(
            _EVENTS,
            {"run_id": run.id, "account_id": run.account_id, "after": after, "limit": limit},
        )
    )


def run_status(session: Session | Connection, account_id: str, run_id: str) -> dict[str, Any]:
    """A run, each stage's progress and its first page of events: indexed queries, answered
    as plain rows (call it inside one read transaction,
    :meth:`ito.server.store.db.Database.read_rows`)."""
    params = {"run_id": run_id, "account_id": account_id}
    run = session.execute(_RUN_ROW, params).first()
    if run is None:
        raise ItoError("run_not_found")
    data = run_dict(run)
    data["progress"] = run_progress(session, run)
    data["events"] = [event_dict(e) for e in session.execute(_EVENT_ROWS, params)]
    latest = session.execute(_LATEST_EVENT, params).first()
    data["latest_event"] = event_dict(latest) if latest is not None else None
    return data


def run_dict(run: Run | Row[Any]) -> dict[str, Any]:
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
        "stage_plan": stored_stage_plan(run.estimate).model_dump(),
        "checkpoint_uri": run.checkpoint_uri,
        "failure_code": run.failure_code,
        "provenance_sha256": run.provenance_sha256,
        "cost_bound_usd": run.cost_bound_usd,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def event_dict(event: RunEvent | Row[Any]) -> dict[str, Any]:
    return {
        "id": event.id,
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "message": event.message,
        "data": event.data,
        "at": event.created_at.isoformat(),
    }
