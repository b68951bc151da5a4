"""Idempotency keys (DESIGN §5.6): scoped to (account, action), reserved in the transaction that
does the work, replayed with the original ids, refused when reused for something else."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from ito.core.errors import ItoError
from ito.server.store.db import Database
from ito.server.store.tables import IdempotencyRecord, table_of, utcnow

__all__ = ["bind_key", "find_key", "lock_key", "replayable", "reserve_key"]


_FIND = select(IdempotencyRecord).where(
    IdempotencyRecord.account_id == bindparam("account_id"),
    IdempotencyRecord.action == bindparam("action"),
    IdempotencyRecord.key == bindparam("key"),
)
# The two writes every confirmed action makes run on the session's connection as plain
# statements: the ORM's bulk machinery and autoflush would cost more than the statements.
_RECORDS = table_of(IdempotencyRecord)
_BIND = (
    update(_RECORDS)
    .where(_RECORDS.c.id == bindparam("record_id"))
    .values(run_id=bindparam("run_id"), response=bindparam("response"))
)


def _reserve_statement(insert: Any) -> Any:
    return (
        insert(_RECORDS)
        .values(
            account_id=bindparam("account_id"),
            action=bindparam("action"),
            key=bindparam("key"),
            fingerprint=bindparam("fingerprint"),
            run_id=bindparam("run_id"),
            response=bindparam("response"),
            created_at=bindparam("created_at"),
        )
        .on_conflict_do_nothing(index_elements=["account_id", "action", "key"])
        .returning(_RECORDS.c.id)
    )


# Built once per dialect: a create pays for the statements, not for building them.
_RESERVE = {True: _reserve_statement(sqlite_insert), False: _reserve_statement(pg_insert)}


def lock_key(session: Session, db: Database, account_id: str, action: str, key: str) -> None:
    """Serialise holders of one key. SQLite's ``BEGIN IMMEDIATE`` already serialises writers;
    on PostgreSQL a transaction-scoped advisory lock makes a second request wait for the first
    to commit, then see its record and replay — instead of racing it through the gates. A wait
    past the lock timeout surfaces as ``store_busy``."""
    if not db.is_sqlite:
        session.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
            {"k": f"{account_id}\x1f{action}\x1f{key}"},
        )


def find_key(session: Session, account_id: str, action: str, key: str) -> IdempotencyRecord | None:
    return session.scalar(_FIND, {"account_id": account_id, "action": action, "key": key})


def reserve_key(
    session: Session,
    db: Database,
    account_id: str,
    action: str,
    key: str,
    fingerprint: str,
    *,
    bound: tuple[str, dict[str, Any]] | None = None,
) -> int | None:
    """Insert the record and return its id, or ``None`` if another transaction holds the key.
    The record is bound to what it created, in the same transaction: at once when the caller
    already knows the run and the response a retry replays (``bound``: the run's id and that
    response; a refusal later in the transaction rolls the record back with everything else, so
    no other transaction ever sees it bound to a run that does not exist), else by
    :func:`bind_key`."""
    run_id, response = bound if bound is not None else (None, None)
    inserted = (
        session.connection()
        .execute(
            _RESERVE[db.is_sqlite],
            {
                "account_id": account_id,
                "action": action,
                "key": key,
                "fingerprint": fingerprint,
                "run_id": run_id,
                "response": response,
                "created_at": utcnow(),
            },
        )
        .scalar_one_or_none()
    )
    return None if inserted is None else int(inserted)


def bind_key(session: Session, record_id: int, run_id: str, response: dict[str, Any]) -> None:
    """Bind a reserved record to the run it created and the response a retry replays: one
    UPDATE, no read back."""
    session.connection().execute(
        _BIND, {"record_id": record_id, "run_id": run_id, "response": response}
    )


def replayable(record: IdempotencyRecord, fingerprint: str) -> dict[str, Any]:
    """The original response of a completed record with the same fingerprint."""
    if record.fingerprint != fingerprint:
        raise ItoError("idempotency_key_reused", idempotency_key=record.key)
    if record.run_id is None or record.response is None:
        raise ItoError("idempotency_in_progress", idempotency_key=record.key)
    return dict(record.response)
