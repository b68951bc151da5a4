"""PostgreSQL connections of the server's pool: a lock bound on every connection, and a pooled
connection the server closed meanwhile is replaced before use, not handed to a request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from ito.server.store.db import POSTGRES_LOCK_TIMEOUT_MS, Database
from tests.support import PG_ADMIN_URL, pg_database


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg_database()


def _backend_pid(db: Database) -> int:
    with db.read() as session:
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_every_transaction_is_bounded_by_the_lock_timeout(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1)
    try:
        for _ in range(2):  # a fresh connection and a pooled one
            with db.write() as session:
                shown = session.execute(text("SHOW lock_timeout")).scalar_one()
            assert shown == f"{POSTGRES_LOCK_TIMEOUT_MS // 1000}s"
    finally:
        db.dispose()


def test_an_idle_connection_closed_by_the_server_is_replaced_before_use(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, ping_idle_s=0.0)  # every checkout counts as idle
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        first = _backend_pid(db)
        with admin.connect() as conn:
            assert conn.execute(
                text("SELECT pg_terminate_backend(:pid)"), {"pid": first}
            ).scalar_one()
        second = _backend_pid(db)  # no error: the dead connection never reached the request
        assert second != first
    finally:
        admin.dispose()
        db.dispose()
