"""The failed-authentication window counts concurrent failures one after the other: of
``limit + n`` failures against one key at once — threads of one process, each its own
transaction, as requests of several server processes would be — exactly ``n`` learn that the
key was already past the limit, on SQLite and on PostgreSQL (DESIGN §5.1)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ito.server.services.auth_failures import AuthFailures
from ito.server.store.db import Database
from ito.server.store.tables import utcnow
from tests.support import Server

pytestmark = pytest.mark.slow

LIMIT = 5
EXTRA = 7


@pytest.mark.usefixtures("fresh_failure_window")
def test_concurrent_failures_past_the_limit_are_refused_exactly_as_often_as_they_exceed_it(
    server: Server,
) -> None:
    db = Database(server.database_url)
    window = AuthFailures(db, "pepper-under-test", LIMIT, 60.0)
    key = "ip:198.51.100.7"  # the fixture empties the window before and after
    start = threading.Barrier(LIMIT + EXTRA)
    now = utcnow()

    def guess(_: int) -> float | None:
        start.wait()
        return window.record([key, "prefix:ito_req_AbCdEfGh"], now)

    try:
        with ThreadPoolExecutor(LIMIT + EXTRA) as pool:
            answers = list(pool.map(guess, range(LIMIT + EXTRA)))
        refused = [wait for wait in answers if wait is not None]
        assert len(refused) == EXTRA
        assert all(0 < wait <= 60.0 for wait in refused)
        # And the window now says so to anyone who asks.
        assert window.blocked([key], now) is not None
        assert window.blocked(["ip:203.0.113.9"], now) is None
    finally:
        db.dispose()
