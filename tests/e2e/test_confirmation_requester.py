"""A confirmation is bound to the principal that requested it (DESIGN §5.5): another requester
of the same account cannot spend it — not for a train, not for a cancel — and the refusal
consumes nothing, so its requester still can. Real CLI, real server, SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import Result, Tenant

pytestmark = pytest.mark.slow


def train(t: Tenant, manifest: Path, ref: str, key: str, who: str) -> Result:
    return t.ito(
        "train",
        "--booking",
        t.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        key,
        key=who,
    )


def second_requester(t: Tenant) -> str:
    minted = t.server.desk("/v1/desk/keys", {"account_id": t.account_id, "role": "requester"})
    return str(minted["api_key"])


def test_another_requesters_train_confirmation_is_a_mismatch(tenant: Tenant) -> None:
    other = second_requester(tenant)
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    before = tenant.counts()
    assert before["confirmations"] == {"approved": 1}

    stolen = train(tenant, manifest, ref, "b-1", other)
    assert (stolen.rc, stolen.code) == (1, "confirmation_mismatch"), stolen.stdout
    assert stolen.envelope is not None and stolen.envelope["live_api_contacted"] is True
    assert tenant.counts() == before  # nothing created, nothing consumed

    own = train(tenant, manifest, ref, "a-1", "requester")
    assert own.rc == 0, own.stdout
    assert own.data["state"] == "queued" and own.data["replayed"] is False
    assert tenant.counts()["confirmations"] == {"consumed": 1}


def test_another_requesters_cancel_confirmation_is_a_mismatch(tenant: Tenant) -> None:
    other = second_requester(tenant)
    manifest = tenant.manifest()
    run_id = train(
        tenant, manifest, tenant.approved_confirmation(manifest), "a-1", "requester"
    ).data["run_id"]
    ref = tenant.ito("confirm", "--action", "cancel", "--run", run_id).data["confirmation_ref"]
    assert tenant.ito("approve", ref, key="approver").rc == 0
    before = tenant.counts()

    stolen = tenant.ito(
        "runs",
        "cancel",
        run_id,
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        "b-cancel",
        key=other,
    )
    assert (stolen.rc, stolen.code) == (1, "confirmation_mismatch"), stolen.stdout
    assert tenant.counts() == before
    assert tenant.ito("status", "--run", run_id).data["state"] == "queued"

    own = tenant.ito(
        "runs", "cancel", run_id, "--confirmation-ref", ref, "--idempotency-key", "a-cancel"
    )
    assert own.rc == 0, own.stdout
    assert own.data["state"] in ("cancelled", "cancelling")
