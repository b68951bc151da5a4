"""A bare FastAPI + SQLAlchemy app: the floor that ``bench/control_plane.py`` compares against.

One ``POST /insert`` endpoint inserts one row into one table in one transaction and answers a
small JSON body; ``GET /health`` answers without touching the database. It is built the way the
ito server is (synchronous handlers in the thread pool, a session per request, the same
connection pool size on PostgreSQL, the same SQLite pragmas: WAL, ``synchronous=NORMAL``, a
busy timeout), so the ratio measures what the gates cost, not a different stack.

Run: ``python bench/baseline_app.py --port 8123 --database-url sqlite:////tmp/b.db``. Loopback
addresses only.
"""

from __future__ import annotations

import argparse
import ipaddress
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import DateTime, Integer, String, create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

TABLE = "bench_baseline_rows"


class _Base(DeclarativeBase):
    pass


class Row(_Base):
    __tablename__ = TABLE
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Body(BaseModel):
    key: str = Field(min_length=1, max_length=255)


def make_engine(url: str, pool_size: int = 10) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size * 2, pool_pre_ping=True)


def create_app(url: str) -> Any:
    from fastapi import FastAPI

    engine = make_engine(url)
    _Base.metadata.create_all(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True}

    @app.post("/insert")
    def insert(body: Body) -> dict[str, Any]:
        with sessions() as session, session.begin():
            row = Row(key=body.key, created_at=datetime.now(UTC))
            session.add(row)
            session.flush()
            row_id = row.id
        return {"ok": True, "data": {"id": row_id}}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    args = parser.parse_args()
    if not ipaddress.ip_address(args.host).is_loopback:
        raise SystemExit("the baseline app listens on loopback addresses only")
    import uvicorn

    uvicorn.run(
        create_app(args.database_url),
        host=args.host,
        port=args.port,
        log_level="warning",
        server_header=False,
    )


if __name__ == "__main__":
    main()
