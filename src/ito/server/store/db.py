"""Engines, sessions and migrations for SQLite (embedded default, WAL) and PostgreSQL (psycopg 3).

Writes and reads get different transactions on SQLite: a write transaction starts with
``BEGIN IMMEDIATE`` so concurrent writers queue on the database lock (bounded by
``busy_timeout``) instead of failing when a snapshot turns stale; reads stay deferred and never
block in WAL mode. On PostgreSQL both are READ COMMITTED transactions and writes rely on
row locks and unique constraints.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ito.core.errors import ItoError

__all__ = ["Database", "is_lock_timeout", "migrate", "schema_revision",
           "several_processes_refusal"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
POSTGRES_LOCK_TIMEOUT_MS = 10_000
MIGRATIONS_DIR = Path(__file__).parent / "migrations"


class Database:
    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            self._read_engine = _sqlite_engine(url, immediate=False)
            self._write_engine = _sqlite_engine(url, immediate=True)
        else:
            engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size * 2,
                                   pool_pre_ping=True)
            event.listen(engine, "begin", _postgres_lock_timeout)
            self._read_engine = self._write_engine = engine
        self._read = sessionmaker(self._read_engine, expire_on_commit=False)
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)

    @property
    def engine(self) -> Engine:
        return self._write_engine

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed on success, rolled back on any exception."""
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
    return "database is locked" in text or "lock timeout" in text or "lock_timeout" in text \
        or "canceling statement due to lock timeout" in text


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


def _sqlite_engine(url: str, *, immediate: bool) -> Engine:
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

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
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _postgres_lock_timeout(conn: Connection) -> None:
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {POSTGRES_LOCK_TIMEOUT_MS}")


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
