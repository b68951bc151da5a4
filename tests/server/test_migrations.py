"""Migrations round-trip on a fresh database of each backend: upgrade to head, the schema
equals the models, downgrade to base leaves nothing, upgrade again works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from ito.server.store.db import Database, migrate, require_current_schema, schema_revision
from ito.server.store.tables import Base
from tests.support import pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        db = Database(f"sqlite:///{tmp_path / 'fresh.db'}")
        yield db
        db.dispose()
    else:
        for url in pg_database():
            db = Database(url)
            yield db
            db.dispose()


def test_migration_round_trip(fresh_db: Database) -> None:
    from ito.core.errors import ItoError

    with pytest.raises(ItoError) as refused:
        require_current_schema(fresh_db)
    assert refused.value.code == "store_not_migrated"

    migrate(fresh_db)
    current, head = schema_revision(fresh_db)
    assert current == head is not None
    require_current_schema(fresh_db)
    with fresh_db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
        assert set(inspect(conn).get_table_names()) >= set(Base.metadata.tables)

    migrate(fresh_db, "base", downgrade=True)
    with fresh_db.engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) & set(Base.metadata.tables) == set()

    migrate(fresh_db)
    assert schema_revision(fresh_db)[0] == head
