"""The embedded worker's per-booking keys, on the real store of both backends: a loop restarted
for a booking revokes the key of the loop it replaces, stopping revokes the last one, and every
key it mints is in the desk's audit trail like a key the desk mints."""

from __future__ import annotations

from pathlib import Path

from ito.server.embedded_worker import EmbeddedWorkers
from ito.server.services.audit import list_audit
from ito.server.store.db import Database
from ito.server.store.tables import ApiKey
from tests.support import Tenant


def test_a_restarted_loop_revokes_the_key_it_replaces(tenant: Tenant, tmp_path: Path) -> None:
    db = Database(tenant.server.database_url)
    workers = EmbeddedWorkers(db, tenant.server.env["ITO_PEPPER"], tenant.server.url, tmp_path)
    workers.stop_event.set()  # the loops end at once: nothing is leased
    try:
        workers._start_loop(tenant.booking_id)
        first = workers.keys[tenant.booking_id]
        workers.loops[tenant.booking_id].join(timeout=30)
        workers._start_loop(tenant.booking_id)  # as the scanner does for a dead loop
        second = workers.keys[tenant.booking_id]
        assert second != first
        with db.read() as session:
            old, new = session.get(ApiKey, first), session.get(ApiKey, second)
            assert old is not None and old.revoked_at is not None
            assert new is not None and new.revoked_at is None
        with db.read() as session:
            minted = [
                (e.action, e.target_id, e.account_id, e.outcome, e.details)
                for e in reversed(list_audit(session))
                if e.actor == "server:embedded-worker"
            ]
        assert [m[:4] for m in minted] == [
            ("key.create", key, tenant.account_id, "ok") for key in (first, second)
        ]
        assert minted[0][4]["booking_id"] == tenant.booking_id
        assert minted[1][4]["revoked_key_id"] == first
        workers.stop()
        with db.read() as session:
            last = session.get(ApiKey, second)
            assert last is not None and last.revoked_at is not None
    finally:
        db.dispose()
