"""The desk's audit trail: every desk action, through the desk API or ``ito-server``, appends one
row saying who acted, what they did, to which account and target, when, and how it ended.

:func:`audited` wraps the action's write transaction: a successful action commits together with
its row (no action without its record); a refused one rolls back and is then recorded in a
transaction of its own. Values that look like credentials never reach a row (a key pasted where
an id belongs is stored as ``<redacted>``); keys are named by their public prefix only.

The operator reads the whole trail; a tenant reads the successful desk actions on its own account
and nothing else (:func:`list_account_events`).
"""

from __future__ import annotations

import getpass
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.core.secret_scan import scan_json_value, scan_text
from ito.server.services.credentials import OperatorContext
from ito.server.store.db import Database
from ito.server.store.operator_tables import AuditEvent
from ito.server.store.tables import ApiKey, Booking, Run, utcnow

__all__ = [
    "Actor",
    "AuditNote",
    "account_event_dict",
    "audit_dict",
    "audited",
    "list_account_events",
    "list_audit",
]

log = logging.getLogger("ito.server.audit")

REDACTED = "<redacted>"


@dataclass(frozen=True)
class Actor:
    """Who performs a desk action; never carries a secret."""

    label: str
    """``key:<operator key prefix>`` or ``cli:<os user>``."""
    key_id: str | None = None

    @classmethod
    def of(cls, operator: OperatorContext) -> Actor:
        return cls(f"key:{operator.key_prefix}", operator.key_id)

    @classmethod
    def cli(cls) -> Actor:
        """``ito-server`` run on the host that holds the database."""
        try:
            user = getpass.getuser()
        except (OSError, KeyError):
            user = "local operator"
        return cls(f"cli:{user}"[:200])


@dataclass
class AuditNote:
    """What the audited action fills in as it learns it (the account a booking belongs to, the
    key it minted)."""

    account_id: str | None = None
    target_kind: str | None = None
    target_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@contextmanager
def audited(
    db: Database,
    actor: Actor,
    action: str,
    *,
    account_id: str | None = None,
    target_kind: str | None = None,
    target_id: str | None = None,
    details: dict[str, Any] | None = None,
) -> Iterator[tuple[Session, AuditNote]]:
    """One desk action's write transaction, recorded in the trail whatever its outcome."""
    note = AuditNote(account_id, target_kind, target_id, dict(details or {}))
    try:
        with db.write() as session:
            yield session, note
            _append(session, actor, action, note, outcome="ok", error_code=None)
    except Exception as exc:
        code = exc.code if isinstance(exc, ItoError) else "internal_error"
        try:
            with db.write() as session:
                _append(session, actor, action, note, outcome="refused", error_code=code)
        except Exception:  # the refusal itself is what the caller must see
            log.exception("could not record the refused desk action %s", action)
        raise


def _append(
    session: Session,
    actor: Actor,
    action: str,
    note: AuditNote,
    *,
    outcome: str,
    error_code: str | None,
) -> None:
    account_id = note.account_id or _owner(session, note.target_kind, note.target_id)
    findings = scan_json_value(note.details)
    details = {"redacted": sorted({f.path for f in findings})} if findings else note.details
    session.add(
        AuditEvent(
            at=utcnow(),
            actor=actor.label,
            actor_key_id=actor.key_id,
            action=action,
            account_id=_safe(account_id, 40),
            target_kind=note.target_kind,
            target_id=_safe(note.target_id, 80),
            outcome=outcome,
            error_code=error_code,
            details=details,
        )
    )
    session.flush()


def _safe(value: str | None, limit: int) -> str | None:
    """An id as asked for, unless it looks like a credential; bounded to its column."""
    if value is None:
        return None
    if scan_text(value):
        return REDACTED
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _owner(session: Session, kind: str | None, target_id: str | None) -> str | None:
    """The tenant a target belongs to, when the action did not say (a refused one, say)."""
    if target_id is None:
        return None
    if kind == "booking":
        return session.scalar(select(Booking.account_id).where(Booking.id == target_id))
    if kind == "run":
        return session.scalar(select(Run.account_id).where(Run.id == target_id))
    if kind == "key":
        return session.scalar(select(ApiKey.account_id).where(ApiKey.id == target_id))
    return None


def list_audit(
    session: Session, *, account_id: str | None = None, limit: int = 100
) -> list[AuditEvent]:
    """The operator's view: newest first, optionally one account's."""
    query = select(AuditEvent)
    if account_id is not None:
        query = query.where(AuditEvent.account_id == account_id)
    return list(session.scalars(query.order_by(AuditEvent.id.desc()).limit(limit)))


def list_account_events(
    session: Session, account_id: str, *, booking_id: str | None = None, limit: int = 100
) -> list[AuditEvent]:
    """A tenant's view: what the desk did to this account (successful actions only), newest
    first, optionally about one booking."""
    query = select(AuditEvent).where(
        AuditEvent.account_id == account_id, AuditEvent.outcome == "ok"
    )
    if booking_id is not None:
        query = query.where(AuditEvent.target_kind == "booking", AuditEvent.target_id == booking_id)
    return list(session.scalars(query.order_by(AuditEvent.id.desc()).limit(limit)))


def audit_dict(row: AuditEvent) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": row.at.isoformat(),
        "actor": row.actor,
        "actor_key_id": row.actor_key_id,
        "action": row.action,
        "account_id": row.account_id,
        "target_kind": row.target_kind,
        "target_id": row.target_id,
        "outcome": row.outcome,
        "error_code": row.error_code,
        "details": row.details,
    }


def account_event_dict(row: AuditEvent) -> dict[str, Any]:
    """What a tenant sees of a desk action on its account: the operator is named as ``desk``."""
    return {
        "id": row.id,
        "at": row.at.isoformat(),
        "actor": "desk",
        "action": row.action,
        "target_kind": row.target_kind,
        "target_id": row.target_id,
        "details": row.details,
    }
