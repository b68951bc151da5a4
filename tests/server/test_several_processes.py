"""``ito-server serve --workers 2`` on each backend (PostgreSQL, SQLite in WAL): the API works,
the failed-authentication window is shared by the processes (it lives in the database), and
the per-credential request rate is counted per process, as the README says."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from tests.support import Server, Tenant, extra_server

LIMIT = 4
GUESS = "ito_req_" + "x" * 40


def _serve_two(server: Server, tmp_path: Path, **settings: str) -> AbstractContextManager[str]:
    """A second server on the same database, serving with two worker processes."""
    return extra_server(server, tmp_path, "--workers", "2", **settings)


@pytest.fixture
def two_processes(server: Server, tmp_path: Path) -> Iterator[str]:
    server.sql("DELETE FROM auth_failures")  # a fresh minute for this test's address
    with _serve_two(server, tmp_path, ITO_AUTH_FAILURES_PER_MINUTE=str(LIMIT)) as url:
        yield url
    server.sql("DELETE FROM auth_failures")  # and none of its failures left for the next


def _fresh(url: str, key: str, path: str = "/v1/runs") -> httpx.Response:
    """One request on a new connection: the kernel hands it to either worker process."""
    with httpx.Client(timeout=30) as client:
        return client.get(
            url + path, headers={"authorization": f"Bearer {key}", "connection": "close"}
        )


def test_the_api_works_behind_two_processes(two_processes: str, tenant: Tenant) -> None:
    for _ in range(8):
        answer = _fresh(two_processes, tenant.requester_key)
        assert answer.status_code == 200 and answer.json()["ok"]
    assert _fresh(two_processes, tenant.requester_key, "/v1/bookings").status_code == 200


def test_the_failure_lockout_holds_across_processes(two_processes: str, tenant: Tenant) -> None:
    # Each guess on a fresh connection, so both processes answer some of them. Counted per
    # process, neither would have seen LIMIT failures yet and the guesses after would still be
    # ``not_authenticated``; counted in the database, every one past LIMIT is refused.
    codes = [_fresh(two_processes, GUESS).json()["error"]["code"] for _ in range(LIMIT)]
    assert codes == ["not_authenticated"] * LIMIT
    for _ in range(2 * LIMIT):
        refused = _fresh(two_processes, GUESS)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limited"
    # A key that verifies still gets in, from either process.
    for _ in range(4):
        assert _fresh(two_processes, tenant.requester_key).status_code == 200


def test_the_request_rate_is_counted_per_process_as_documented(
    server: Server, tenant: Tenant, tmp_path: Path
) -> None:
    """README: the per-credential rate lives in each process, so behind N processes a
    credential gets up to N times its burst, and never more; each process still refuses."""
    burst = 5
    with _serve_two(
        server, tmp_path, ITO_RATE_LIMIT_PER_SECOND="0.2", ITO_RATE_LIMIT_BURST=str(burst)
    ) as url:
        started = time.monotonic()
        answers = [_fresh(url, tenant.requester_key) for _ in range(6 * burst)]
        elapsed = time.monotonic() - started
    admitted = sum(1 for a in answers if a.status_code == 200)
    refused = [a for a in answers if a.status_code != 200]
    assert burst <= admitted <= 2 * (burst + 0.2 * elapsed + 1)
    assert refused and all(a.json()["error"]["code"] == "rate_limited" for a in refused)


def test_failures_counted_by_one_server_process_lock_out_at_another(
    server: Server, two_processes: str
) -> None:
    """Proof that does not depend on how the kernel spreads connections: the guesses go to the
    test's own server (another process, whose limit is far above LIMIT, so it refuses none),
    and the next guess, at the two-process server, is refused — it can only have counted them
    in the database."""
    codes = [_fresh(server.url, GUESS).json()["error"]["code"] for _ in range(LIMIT)]
    assert codes == ["not_authenticated"] * LIMIT
    refused = _fresh(two_processes, GUESS)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
