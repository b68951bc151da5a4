"""Idempotency keys (DESIGN §5.6): scoped to (account, action), reserved in the transaction that
does the work, replayed with the original ids, refused when reused for something else."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.server.store.db import Database
from ito.server.store.tables import IdempotencyRecord, utcnow

__all__ = ["bind_key", "find_key", "lock_key", "replayable", "reserve_key"]


def lock_key(session: Session, db: Database, account_id: str, action: str, key: str) -> None:
    """Serialise holders of one key. SQLite's ``BEGIN IMMEDIATE`` already serialises writers;
    on PostgreSQL a transaction-scoped advisory lock makes a second request wait for the first
    to commit, then see its record and replay — instead of racing it through the gates. A wait
    past the lock timeout surfaces as ``store_busy``."""
    if not db.is_sqlite:
        session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                        {"k": f"{account_id}\x1f{action}\x1f{key}"})


def find_key(session: Session, account_id: str, action: str,
             key: str) -> IdempotencyRecord | None:
    return session.scalar(select(IdempotencyRecord).where(
        IdempotencyRecord.account_id == account_id, IdempotencyRecord.action == action,
        IdempotencyRecord.key == key))


def reserve_key(session: Session, db: Database, account_id: str, action: str, key: str,
                fingerprint: str) -> int | None:
    """Insert the record and return its id, or ``None`` if another transaction holds the key.
    The record is bound to what it created by :func:`bind_key`, in the same transaction."""
    insert = sqlite_insert if db.is_sqlite else pg_insert
    statement = (
        insert(IdempotencyRecord)
        .values(account_id=account_id, action=action, key=key, fingerprint=fingerprint,
                created_at=utcnow())
        .on_conflict_do_nothing(index_elements=["account_id", "action", "key"])
        .returning(IdempotencyRecord.id)
    )
    inserted = session.execute(statement).scalar_one_or_none()
    return None if inserted is None else int(inserted)


def bind_key(session: Session, record_id: int, run_id: str, response: dict[str, Any]) -> None:
    """Bind a reserved record to the run it created and the response a retry replays: one
    UPDATE, no read back."""
    session.execute(update(IdempotencyRecord).where(IdempotencyRecord.id == record_id)
                    .values(run_id=run_id, response=response)
                    .execution_options(synchronize_session=False))


def replayable(record: IdempotencyRecord, fingerprint: str) -> dict[str, Any]:
    """The original response of a completed record with the same fingerprint."""
    if record.fingerprint != fingerprint:
        raise ItoError("idempotency_key_reused", idempotency_key=record.key)
    if record.run_id is None or record.response is None:
        raise ItoError("idempotency_in_progress", idempotency_key=record.key)
    return dict(record.response)
