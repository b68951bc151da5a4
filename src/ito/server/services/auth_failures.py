"""The failed-authentication window, held in the database so every server process shares it.

Guessing API keys or passwords gets ``limit`` tries per window (a minute) per key — a source
address, a key's public prefix, an email — across all the processes of ``ito-server serve
--workers N``: a process that never saw a guess still refuses the next one. Same rule as
:class:`ito.core.rate_limit.FailureWindow`: past the limit a key is refused until its oldest
counted failure (of the last ``limit``) leaves the window. Keys are stored as their HMAC under
the server's pepper, so the table names no address or email, nor can one be guessed back by
hashing candidates. Rows older than the window are deleted as new failures arrive; only failures
write, so successful requests never touch this table.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select, text
from sqlalchemy.orm import Session

from ito.server.services.credentials import hmac_hex
from ito.server.store.db import Database
from ito.server.store.operator_tables import AuthFailure

__all__ = ["AuthFailures"]

_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 1))")
"""A transaction-scoped lock on one hashed key (seed 1: apart from the idempotency locks)."""


class AuthFailures:
    def __init__(self, db: Database, pepper: str, limit: int, window_seconds: float) -> None:
        if limit < 1 or window_seconds <= 0:
            raise ValueError("limit must be >= 1 and window_seconds > 0")
        self.db = db
        self.pepper = pepper
        self.limit = limit
        self.window = timedelta(seconds=window_seconds)

    def blocked(self, keys: list[str], now: datetime) -> float | None:
        """``None`` if every key may try, else seconds until the last of them may."""
        with self.db.read() as session:
            return self._wait(session, [self._hashed(key) for key in keys], now)

    def record(self, keys: list[str], now: datetime) -> float | None:
        """Count one failure against each key and say whether any of them was already past
        the limit (``None``, or seconds until the last may try again) — both in one write
        transaction, with the keys locked on PostgreSQL (SQLite serialises writers), so that
        concurrent failures are counted one after the other: of ``limit + n`` guesses at once,
        exactly ``n`` are told they were past it, whichever processes answer them."""
        hashed = sorted({self._hashed(key) for key in keys})
        with self.db.write() as session:
            if not self.db.is_sqlite:
                for key in hashed:  # in one order everywhere: no two transactions deadlock
                    session.execute(_LOCK, {"k": key})
            wait = self._wait(session, hashed, now)
            session.execute(delete(AuthFailure).where(AuthFailure.at <= now - self.window))
            session.add_all([AuthFailure(key=key, at=now) for key in hashed])
        return wait

    def _wait(self, session: Session, hashed: list[str], now: datetime) -> float | None:
        waits: list[float] = []
        for key in hashed:
            times = list(
                session.scalars(
                    select(AuthFailure.at)
                    .where(AuthFailure.key == key, AuthFailure.at > now - self.window)
                    .order_by(AuthFailure.at.desc())
                    .limit(self.limit)
                )
            )
            if len(times) >= self.limit:
                oldest = min(times)
                waits.append(max((oldest + self.window - now).total_seconds(), 0.001))
        return max(waits) if waits else None

    def _hashed(self, key: str) -> str:
        return hmac_hex(self.pepper, key)
