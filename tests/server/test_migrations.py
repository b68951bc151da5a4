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


def test_desk_keys_bound_to_an_account_move_to_the_operator_and_back(fresh_db: Database) -> None:
    """0004 takes each old desk key out of its tenant (same prefix and hash, so it keeps
    working as the operator's) and records the move; downgrading binds them to an account."""
    from sqlalchemy import text

    from ito.server.services.credentials import OperatorContext, authenticate, hmac_hex
    from ito.server.store.tables import utcnow

    migrate(fresh_db, "0003")
    pepper = "migration-pepper"
    desk_key = "ito_dsk_AbCdEfGh_" + "s" * 43
    with fresh_db.engine.begin() as conn:
        now = utcnow().replace(tzinfo=None)
        conn.execute(
            text("INSERT INTO accounts (id, name, created_at) VALUES ('acc_b', 'tenant b', :now)"),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO principals (id, account_id, role, name, created_at) "
                "VALUES ('prn_d', 'acc_b', 'desk', 'old desk', :now)"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO api_keys (id, account_id, principal_id, prefix, secret_hash, role, "
                "created_at) VALUES ('key_d', 'acc_b', 'prn_d', 'ito_dsk_AbCdEfGh', :hash, 'desk', "
                ":now)"
            ),
            {"hash": hmac_hex(pepper, desk_key), "now": now},
        )

    migrate(fresh_db)
    with fresh_db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_keys")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM principals")).scalar_one() == 0
        assert conn.execute(text("SELECT id, name FROM operator_keys")).all() == [
            ("key_d", "old desk")
        ]
        assert conn.execute(
            text("SELECT action, account_id, target_id FROM audit_events")
        ).all() == [("key.unbind", "acc_b", "key_d")]
    with fresh_db.read() as session:
        caller = authenticate(session, pepper, desk_key)
    assert isinstance(caller, OperatorContext) and caller.account_id is None

    migrate(fresh_db, "0003", downgrade=True)
    with fresh_db.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT k.id, k.role, k.prefix, a.name FROM api_keys k "
                "JOIN accounts a ON a.id = k.account_id"
            )
        ).all()
        assert rows == [("key_d", "desk", "ito_dsk_AbCdEfGh", "operator (desk)")]
