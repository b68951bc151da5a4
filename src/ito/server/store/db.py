"""Engines, sessions and migrations for SQLite (embedded default, WAL) and PostgreSQL (psycopg 3).

Writes and reads get different transactions on SQLite: a write transaction starts with
``BEGIN IMMEDIATE`` so concurrent writers queue on the database lock (bounded by
``busy_timeout``) instead of failing when a snapshot turns stale — the writers of one process
first on a lock of that process (:meth:`Database.write`), so the worst wait is that lock's
timeout and then ``busy_timeout``; reads stay deferred and never block in WAL mode.
On PostgreSQL both are READ COMMITTED transactions and writes rely on row locks and unique
constraints; each connection waits at most ``POSTGRES_LOCK_TIMEOUT_MS`` for a lock
(``store_busy``), and is pinged before use only after being idle a while.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ito.core.errors import ItoError

__all__ = ["Database", "is_lock_timeout", "migrate", "schema_revision", "several_processes_refusal"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
POSTGRES_LOCK_TIMEOUT_MS = 10_000
POSTGRES_PING_IDLE_S = 5.0
"""A pooled PostgreSQL connection idle this long is pinged before use; a busier one is not."""
POSTGRES_RECYCLE_S = 1800
_LAST_USED = "ito_last_used"
_NO_BEGIN = "ito_no_begin"
"""An execution option: on SQLite, run this connection's statements without ``BEGIN``."""
MIGRATIONS_DIR = Path(__file__).parent / "migrations"


class Database:
    def __init__(
        self, url: str, *, pool_size: int = 10, ping_idle_s: float = POSTGRES_PING_IDLE_S
    ) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            self._read_engine = _sqlite_engine(url, pool_size, immediate=False)
            self._write_engine = _sqlite_engine(url, pool_size, immediate=True)
        else:
            engine = create_engine(
                url,
                pool_size=pool_size,
                max_overflow=pool_size * 2,
                pool_recycle=POSTGRES_RECYCLE_S,
                # A statement's error never carries its bound parameters (a key's hash, a
                # tenant's text) into a traceback or a log line.
                hide_parameters=True,
            )
            event.listen(engine, "connect", _postgres_on_connect)
            event.listen(engine, "checkout", _ping_if_idle(engine, ping_idle_s))
            event.listen(engine, "checkin", _mark_used)
            self._read_engine = self._write_engine = engine
        self._writer = threading.Lock()
        """SQLite: this process's writers queue here before ``BEGIN IMMEDIATE`` (:meth:`write`)."""
        self._read = sessionmaker(self._read_engine, expire_on_commit=False)
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        # Same pool as the reads; only how a transaction starts differs (see :meth:`lookup`).
        autocommit = {_NO_BEGIN: True} if self.is_sqlite else {"isolation_level": "AUTOCOMMIT"}
        self._lookup_engine = self._read_engine.execution_options(**autocommit)

    @property
    def engine(self) -> Engine:
        return self._write_engine

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    @contextmanager
    def read_rows(self) -> Iterator[Connection]:
        """One read transaction, like :meth:`read`, on a plain connection: for hot reads that
        answer rows (the tables' columns), not ORM objects."""
        with self._read_engine.connect() as connection, connection.begin():
            yield connection

    @contextmanager
    def lookup(self) -> Iterator[Connection]:
        """A connection for one read statement outside any transaction: no ``BEGIN`` before it
        and no ``COMMIT`` after (SQLite's autocommit; PostgreSQL's ``AUTOCOMMIT``), so the
        statement is its own snapshot and costs one round trip, not three; and no ORM session
        (its identity map and bookkeeping cost more than such a query). For the single
        ``SELECT`` on every request (an API key by its prefix) and for one-statement pages
        answered as plain rows; anything that reads twice and needs both answers from one
        snapshot uses :meth:`read`."""
        with self._lookup_engine.connect() as connection:
            yield connection

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed on success, rolled back on any exception.

        On SQLite the threads of one process first queue on a lock of this process, then take
        the database's write lock (``BEGIN IMMEDIATE``): SQLite's busy handler polls a held
        lock with sleeps that grow to 100 ms, so writers of one process that queued on it would
        leave the lock idle between holders; on a Python lock the next one starts the moment
        the last commits. Other processes still wait on the database lock (``busy_timeout``)."""
        if self.is_sqlite:
            if not self._writer.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
                raise ItoError("store_busy")
            try:
                with self._transaction() as session:
                    yield session
            finally:
                self._writer.release()
        else:
            with self._transaction() as session:
                yield session

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        try:
            with self._write() as session, session.begin():
                yield session
        except OperationalError as exc:
            if is_lock_timeout(exc):
                raise ItoError("store_busy") from None
            raise

    def dispose(self) -> None:
        self._read_engine.dispose()
        if self._write_engine is not self._read_engine:
            self._write_engine.dispose()


def is_lock_timeout(exc: BaseException) -> bool:
    text = str(getattr(exc, "orig", exc)).lower()
    return (
        "database is locked" in text
        or "lock timeout" in text
        or "lock_timeout" in text
        or "canceling statement due to lock timeout" in text
    )


def several_processes_refusal(db: Database) -> str | None:
    """Why several server processes cannot share this store, or ``None`` if they can:
    PostgreSQL always can; SQLite only as a file in WAL mode (readers and the one writer of
    different processes then do not block each other; the write lock serialises writers)."""
    if not db.is_sqlite:
        return None
    with db.read() as session:
        mode = str(session.connection().exec_driver_sql("PRAGMA journal_mode").scalar())
    if mode.lower() != "wal":
        return f"this SQLite database is in {mode} journal mode, not WAL"
    return None


def _sqlite_engine(url: str, pool_size: int, *, immediate: bool) -> Engine:
    # The pool keeps as many connections as there are request threads (not SQLAlchemy's
    # default 5), so a busy server does not reconnect and rerun the pragmas per request.
    kwargs: dict[str, Any] = {}
    if ":memory:" not in url and url.rstrip("/") not in ("sqlite:", "sqlite+pysqlite:"):
        kwargs = {"pool_size": pool_size, "max_overflow": pool_size * 2}
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 30},
        hide_parameters=True,
        **kwargs,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (SQLAlchemy docs,
        # "Serializable isolation / Savepoints / Transactional DDL" for pysqlite).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_NO_BEGIN):
            return  # Database.lookup(): one statement, autocommit
        # Straight to the driver: this runs once per transaction, and SQLAlchemy's execution
        # machinery (context, cursor wrapper, events) would cost more than the statement.
        conn.connection.driver_connection.execute(  # type: ignore[union-attr]
            "BEGIN IMMEDIATE" if immediate else "BEGIN"
        )

    return engine


def _postgres_on_connect(dbapi_connection: Any, record: Any) -> None:
    """Once per connection, not per transaction: the lock bound (a session setting, so no
    round trip on every ``BEGIN``) and the time the connection was last known alive."""
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"SET lock_timeout = {POSTGRES_LOCK_TIMEOUT_MS}")
    finally:
        cursor.close()
        dbapi_connection.autocommit = autocommit
    _mark_used(dbapi_connection, record)


def _mark_used(_dbapi_connection: Any, record: Any) -> None:
    record.info[_LAST_USED] = time.monotonic()


def _ping_if_idle(engine: Engine, idle_s: float) -> Any:
    """A checkout listener that pings only a connection idle for ``idle_s`` or more (the
    server may have closed it meanwhile: restart, idle timeout, failover). A dead one is
    invalidated and the pool hands out a fresh connection (SQLAlchemy retries a checkout
    that raises ``DisconnectionError``). A busy pool thus skips the round trip that
    ``pool_pre_ping`` spends on every checkout; a connection that dies while in use fails
    its one request, and SQLAlchemy then invalidates the whole pool."""

    def listener(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        last = record.info.get(_LAST_USED)
        if last is not None and time.monotonic() - last < idle_s:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError("connection found closed on checkout") from exc
        record.info[_LAST_USED] = time.monotonic()

    return listener


def _alembic_config(connection: Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def migrate(db: Database, revision: str = "head", *, downgrade: bool = False) -> None:
    from alembic import command

    with db.engine.begin() as connection:
        config = _alembic_config(connection)
        if downgrade:
            command.downgrade(config, revision)
        else:
            command.upgrade(config, revision)


def schema_revision(db: Database) -> tuple[str | None, str | None]:
    """(current revision of the database, head revision of the code)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    with db.engine.connect() as connection:
        config = _alembic_config(connection)
        head = ScriptDirectory.from_config(config).get_current_head()
        if not inspect(connection).has_table("alembic_version"):
            return None, head
        current = MigrationContext.configure(connection).get_current_revision()
    return current, head


def require_current_schema(db: Database) -> None:
    current, head = schema_revision(db)
    if current != head:
        raise ItoError("store_not_migrated", current=current, head=head)
