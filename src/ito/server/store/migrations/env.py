"""Alembic environment: runs on the connection ``ito.server.store.db.migrate`` hands it."""

from __future__ import annotations

from alembic import context

from ito.server.store.tables import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
context.run_migrations()
