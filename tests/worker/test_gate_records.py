"""Gate records served (DESIGN §7.5): the engine's ``gate`` events, reported by the worker, come
back from ``GET /v1/runs/{id}/gates`` and ``ito runs gates R`` one record per eval, to the
run's tenant only (SQLite and PostgreSQL, real server)."""

from __future__ import annotations

import pytest

from ito.core.pipeline_events import GateEvent, GateResult
from ito.worker.api import WorkerApi
from tests.support import Tenant

pytestmark = pytest.mark.slow


def test_gate_records_are_served_per_eval_to_their_tenant_only(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    manifest = tenant.manifest(name="gates")
    run_id = tenant.train(manifest, "gates")
    worker_key = tenant.server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )["api_key"]
    api = WorkerApi(tenant.server.url, str(worker_key))
    lease = api.lease()
    assert lease is not None and lease.run_id == run_id
    assert tenant.ito("runs", "gates", run_id).data["gates"] == []

    loss = GateResult(
        eval="heldout_loss",
        data="web",
        value=3.1,
        initial=6.25,
        threshold=0.6 * 6.25,
        rule="heldout_loss(web) ≤ 0.6 × step 0",
        passed=True,
    )
    exact = GateResult(
        eval="exact_match",
        data="arith-heldout",
        value=0.0,
        initial=0.0,
        threshold=0.5,
        rule="exact_match(arith-heldout) ≥ 0.5",
        passed=False,
    )
    api.report(
        run_id,
        1,
        [GateEvent(stage="pretrain", battery="core", results=[loss, exact], passed=False)],
    )
    served = tenant.ito("runs", "gates", run_id)
    assert served.rc == 0, served.stdout
    records = [{k: v for k, v in g.items() if k != "at"} for g in served.data["gates"]]
    assert records == [
        {"stage": "pretrain", "battery": "core", **loss.model_dump()},
        {"stage": "pretrain", "battery": "core", **exact.model_dump()},
    ]
    theirs = other_tenant.ito("runs", "gates", run_id)
    absent = run_id[:-1] + ("a" if run_id[-1] != "a" else "b")
    missing = other_tenant.ito("runs", "gates", absent)
    assert theirs.code == missing.code == "run_not_found"
    api.close()
