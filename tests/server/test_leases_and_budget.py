"""Leases and the running budget at the service level, on the real store of both backends, with
an explicit clock: time held accrues cost; before the next interval would cross the ceiling the
worker is told to stop; an expired lease becomes ``recovering`` and the next lease resumes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ito.core.errors import ItoError
from ito.server.services.credentials import authenticate
from ito.server.services.leases import LeaseSettings, expire_leases, heartbeat, lease_next
from ito.server.store.db import Database
from ito.server.store.runtime_tables import RunLease
from ito.server.store.tables import Run, utcnow
from tests.support import Tenant

pytestmark = pytest.mark.slow
SETTINGS = LeaseSettings(ttl_seconds=30, heartbeat_seconds=5)


def _run_with_worker(tenant: Tenant, rate: float):  # type: ignore[no-untyped-def]
    booking = tenant.booking(rate_usd_per_gpu_hour=rate)
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest, booking_id=booking)
    run_id = tenant.ito("train", "--booking", booking, "--manifest", str(manifest),
                        "--confirmation-ref", ref, "--idempotency-key", "k").data["run_id"]
    key = tenant.server.desk("/v1/desk/keys", {"account_id": tenant.account_id,
                                               "role": "worker", "booking_id": booking})
    db = Database(tenant.server.database_url)
    with db.read() as session:
        worker = authenticate(session, tenant.server.env["ITO_PEPPER"], key["api_key"])
    return db, worker, run_id


def test_cost_accrues_while_held_and_the_worker_is_stopped_before_the_ceiling(
    tenant: Tenant,
) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=9.0)
    now = utcnow()
    with db.write() as session:
        leased = lease_next(session, worker, SETTINGS, now)
    assert leased is not None and leased["run_id"] == run_id
    stops, costs = [], []
    for beat in range(1, 40):
        with db.write() as session:
            answer = heartbeat(session, worker, SETTINGS, run_id, 1,
                               now + timedelta(seconds=30 * beat))
        stops.append(answer["stop"])
        costs.append(answer["cost_usd"])
        if answer["stop"]:
            break
    assert stops[-1] == "budget" and set(stops[:-1]) == {None}
    ceiling = 5.0
    assert costs[-1] <= ceiling  # stopped before crossing, not after
    # 2 accelerators × $9/h for 30 s per beat.
    assert costs[0] == pytest.approx(30 / 3600 * 2 * 9.0, rel=1e-6)
    db.dispose()


def test_an_expired_lease_goes_recovering_and_the_next_lease_resumes(tenant: Tenant) -> None:
    db, worker, run_id = _run_with_worker(tenant, rate=0.5)
    now = utcnow()
    with db.write() as session:
        assert lease_next(session, worker, SETTINGS, now) is not None
    with db.write() as session:
        assert expire_leases(session, now + timedelta(seconds=29)) == 0
    with db.write() as session:
        assert expire_leases(session, now + timedelta(seconds=31)) == 1
    with db.read() as session:
        run = session.get(Run, run_id)
        lease = session.get(RunLease, run_id)
        assert run is not None and run.state == "recovering"
        assert lease is not None and lease.interruptions == 1
    # The old holder's attempt is dead: its heartbeat is refused.
    with pytest.raises(ItoError) as lost, db.write() as session:
        heartbeat(session, worker, SETTINGS, run_id, 1, now + timedelta(seconds=32))
    assert lost.value.code == "lease_lost"
    with db.write() as session:
        again = lease_next(session, worker, SETTINGS, now + timedelta(seconds=33))
    assert again is not None and again["attempt"] == 2 and again["resuming"] is True
    db.dispose()
