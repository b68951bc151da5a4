"""The real ``ito`` CLI against the real ``ito-server serve`` on loopback, on SQLite and on
PostgreSQL: the happy path, and every refusal family of run creation (DESIGN §5.8) — each
asserting its stable code and that nothing was created or consumed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from ito.core.manifest import manifest_digest
from ito.server.services.confirmations import _seal
from ito.server.store.tables import Confirmation
from tests.support import ITO, Tenant, run_cli, wait_until

pytestmark = pytest.mark.slow


def train(t: Tenant, manifest: Path, ref: str, key: str, booking: str | None = None):  # type: ignore[no-untyped-def]
    return t.ito(
        "train",
        "--booking",
        booking or t.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        key,
    )


def assert_refused(result, code: str, *, live: bool = True) -> None:  # type: ignore[no-untyped-def]
    assert result.rc == 1, (result.stdout, result.stderr)
    assert result.code == code, result.stdout
    assert result.envelope["live_api_contacted"] is live


def test_happy_path_creates_exactly_one_queued_run_and_replays_it(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is True
    assert plan.data["cost"]["cost_usd"] <= plan.data["cost"]["ceiling_usd"]
    # The recipe asks for nothing this version does not run: no warning, nothing unpriced.
    assert plan.data["warnings"] == []
    # The CPU stand-in trains the engine's own layout, checked by the planner: FSDP2 over both
    # processes, the engine's four sequences per rank.
    parallelism = plan.data["parallelism"]
    assert parallelism["ok"] is True
    assert (parallelism["mode"], parallelism["applied"]) == ("cpu_stand_in", True)
    assert parallelism["plan"]["mesh"] == {
        "pp": 1,
        "dp_replicate": 1,
        "dp_shard": 2,
        "cp": 1,
        "tp": 1,
    }
    assert parallelism["plan"]["micro_batch"] == 4

    confirm = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    )
    assert confirm.rc == 0
    ref = confirm.data["confirmation_ref"]
    assert ref.startswith("cfr_") and confirm.data["state"] == "pending"
    assert confirm.data["manifest_id"] == plan.data["manifest_id"]
    approved = tenant.ito("approve", ref, key="approver")
    assert approved.rc == 0 and approved.data["state"] == "approved"

    created = train(tenant, manifest, ref, "key-1")
    assert created.rc == 0, created.stdout
    run = created.data
    assert run["state"] == "queued" and run["replayed"] is False
    assert run["booking_id"] == tenant.booking_id
    assert run["manifest_id"] == plan.data["manifest_id"]
    assert run["idempotency_key"] == "key-1"

    replay = train(tenant, manifest, ref, "key-1")
    assert replay.rc == 0 and replay.data["replayed"] is True
    assert replay.data["run_id"] == run["run_id"]

    by_key = tenant.ito("status", "--idempotency-key", "key-1")
    assert by_key.data["run_id"] == run["run_id"]
    shown = tenant.ito("status", "--run", run["run_id"])
    assert shown.data["state"] == "queued"
    # The run carries the accepted plan (stored with its estimate) for its engine.
    assert shown.data["estimate"]["parallelism"] == {
        k: v for k, v in parallelism.items() if k != "ok"
    }
    assert [e["kind"] for e in shown.data["events"]] == ["created"]
    listed = tenant.ito("runs", "list")
    assert [r["run_id"] for r in listed.data["runs"]] == [run["run_id"]]
    counts = tenant.counts()
    assert counts["runs"] == 1 and counts["idempotency"] == 1
    assert counts["confirmations"] == {"consumed": 1}


def test_plan_creates_nothing(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    before = tenant.counts()
    for _ in range(2):
        result = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
        assert result.rc == 0 and result.data["ready"] is True
        assert result.envelope is not None and result.envelope["live_api_contacted"] is True
    shown = run_cli(
        [ITO, "plan", "--booking", tenant.booking_id, "--manifest", str(manifest)],
        tenant.env(tenant.requester_key),
    )
    assert shown.rc == 0, shown.stderr
    assert "parallelism" in shown.stdout and "dp_shard=2" in shown.stdout
    assert "MFU" in shown.stdout and "cpu_stand_in" in shown.stdout
    assert (
        tenant.counts()
        == before
        == {"runs": 0, "idempotency": 0, "manifests": 0, "events": 0, "confirmations": {}}
    )


# --- bookings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ("expired", "booking_expired"),
        ("revoked", "booking_revoked"),
        ("released", "booking_released"),
    ],
)
def test_booking_that_changed_after_approval_refuses_the_run(
    tenant: Tenant, state: str, code: str
) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    tenant.set_booking_state(tenant.booking_id, state)
    before = tenant.counts()
    assert_refused(train(tenant, manifest, ref, "k"), code)
    assert tenant.counts() == before
    assert before["confirmations"] == {"approved": 1}


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"state": "pending"}, "booking_not_completed"),
        (
            {"start": "2020-01-01T00:00:00+00:00", "end": "2020-02-01T00:00:00+00:00"},
            "booking_expired",
        ),
        ({"gpus_per_node": 1}, "capacity_insufficient"),
        ({"gpu": "h100"}, "booking_mismatch"),
    ],
)
def test_unusable_booking_gets_no_confirmation(
    tenant: Tenant, overrides: dict[str, object], code: str
) -> None:
    booking = tenant.booking(**overrides)
    manifest = tenant.manifest()
    before = tenant.counts()
    result = tenant.ito(
        "confirm", "--action", "train", "--booking", booking, "--manifest", str(manifest)
    )
    assert_refused(result, code)
    assert (
        tenant.counts()
        == before
        == {"runs": 0, "idempotency": 0, "manifests": 0, "events": 0, "confirmations": {}}
    )
    plan = tenant.ito("plan", "--booking", booking, "--manifest", str(manifest))
    assert plan.data["ready"] is False
    assert code in [r["code"] for r in plan.data["refusals"]]


def test_another_accounts_booking_looks_missing(tenant: Tenant, other_tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    before = tenant.counts()
    assert_refused(
        train(tenant, manifest, ref, "k", booking=other_tenant.booking_id), "booking_not_found"
    )
    assert_refused(
        tenant.ito(
            "confirm",
            "--action",
            "train",
            "--booking",
            other_tenant.booking_id,
            "--manifest",
            str(manifest),
        ),
        "booking_not_found",
    )
    assert_refused(
        tenant.ito("plan", "--booking", other_tenant.booking_id, "--manifest", str(manifest)),
        "booking_not_found",
    )
    assert tenant.counts() == before
    assert other_tenant.counts()["confirmations"] == {}


# --- manifests -------------------------------------------------------------------------------


def test_invalid_manifest_is_refused_with_json_paths(tenant: Tenant) -> None:
    manifest = tenant.manifest(
        budget={"ceiling_usd": "5", "max_incremental_cost_usd": 2}, surprise=True
    )
    for args in (
        ["manifest", "validate", str(manifest)],
        ["plan", "--booking", tenant.booking_id, "--manifest", str(manifest)],
        [
            "confirm",
            "--action",
            "train",
            "--booking",
            tenant.booking_id,
            "--manifest",
            str(manifest),
        ],
    ):
        result = tenant.ito(*args)
        assert result.code == "manifest_invalid", result.stdout
        assert result.envelope is not None
        paths = {e["path"] for e in result.envelope["error"]["details"]["errors"]}
        assert {"$.budget.ceiling_usd", "$.surprise"} <= paths
    assert tenant.counts()["manifests"] == 0


def test_secret_bearing_manifest_is_refused_without_echoing_the_secret(tenant: Tenant) -> None:
    secret = "AKIA" + "ABCDEFGHIJKLMNOP"
    manifest = tenant.manifest()
    document = json.loads(manifest.read_text())
    document["data"][0]["uri"] = f"s3://{secret}:hunter2hunter2@bucket/web.jsonl"
    manifest.write_text(json.dumps(document))
    result = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    )
    # Refused by the client before anything is sent (DESIGN §6.1), with the server's code.
    assert_refused(result, "manifest_contains_secret", live=False)
    assert secret not in result.stdout + result.stderr
    assert "hunter2" not in result.stdout + result.stderr
    assert tenant.counts()["manifests"] == 0


def _oversize(path: Path) -> None:
    document = json.loads(path.read_text())
    document["name"] = "x" * (1024 * 1024)
    path.write_text(json.dumps(document))


def _symlink(path: Path) -> Path:
    link = path.parent / "link.json"
    link.symlink_to(path)
    return link


def _world_writable(path: Path) -> None:
    os.chmod(path, 0o666)


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (_oversize, "manifest_too_large"),
        (_symlink, "manifest_symlink"),
        (_world_writable, "manifest_unsafe_permissions"),
        (lambda p: Path(os.path.relpath(p)), "manifest_path_not_absolute"),
    ],
)
def test_unsafe_manifest_file_is_refused_before_anything_is_sent(
    tenant: Tenant, mutate: Callable[[Path], Path | None], code: str
) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    target = mutate(manifest) or manifest
    before = tenant.counts()
    for args in (
        [
            "train",
            "--booking",
            tenant.booking_id,
            "--manifest",
            str(target),
            "--confirmation-ref",
            ref,
            "--idempotency-key",
            "k",
        ],
        ["confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(target)],
        ["plan", "--booking", tenant.booking_id, "--manifest", str(target)],
    ):
        assert_refused(tenant.ito(*args), code, live=False)
    assert tenant.counts() == before


def test_manifest_changed_after_confirmation_is_a_digest_mismatch(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    document = json.loads(manifest.read_text())
    document["budget"]["ceiling_usd"] = 4.0
    manifest.write_text(json.dumps(document, indent=2))
    before = tenant.counts()
    assert_refused(train(tenant, manifest, ref, "k"), "manifest_digest_mismatch")
    assert tenant.counts() == before


# --- confirmations ---------------------------------------------------------------------------


def test_missing_pending_and_rejected_confirmations_are_refused(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    before = tenant.counts()
    assert_refused(train(tenant, manifest, "cfr_doesnotexist", "k1"), "confirmation_not_found")

    pending = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    ).data["confirmation_ref"]
    assert_refused(train(tenant, manifest, pending, "k2"), "confirmation_pending")

    assert tenant.ito("reject", pending, key="approver").rc == 0
    assert_refused(train(tenant, manifest, pending, "k3"), "confirmation_rejected")
    assert_refused(tenant.ito("approve", pending, key="approver"), "confirmation_not_pending")
    after = tenant.counts()
    assert after["runs"] == after["idempotency"] == before["runs"] == 0
    assert after["confirmations"] == {"rejected": 1}


def test_expired_confirmation_is_refused(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest, ttl_seconds=2)

    def expired() -> bool:
        shown = tenant.api("GET", f"/v1/confirmations/{ref}")
        return bool(shown["data"]["state"] == "expired")

    wait_until(expired, timeout=15, interval=0.2)
    assert_refused(train(tenant, manifest, ref, "k"), "confirmation_expired")
    assert tenant.counts()["runs"] == 0
    assert tenant.counts()["confirmations"] == {"approved": 1}


def test_consumed_confirmation_cannot_create_a_second_run(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    assert train(tenant, manifest, ref, "first").rc == 0
    before = tenant.counts()
    assert_refused(train(tenant, manifest, ref, "second"), "confirmation_consumed")
    assert tenant.counts() == before


def test_confirmation_bound_to_another_booking_digest_or_action_is_refused(
    tenant: Tenant,
) -> None:
    manifest = tenant.manifest("one")
    other_manifest = tenant.manifest(
        "two", budget={"ceiling_usd": 4.0, "max_incremental_cost_usd": 2.0}
    )
    second_booking = tenant.booking()
    ref = tenant.approved_confirmation(manifest)
    before = tenant.counts()
    assert_refused(
        train(tenant, manifest, ref, "k1", booking=second_booking), "confirmation_mismatch"
    )
    assert_refused(train(tenant, other_manifest, ref, "k2"), "manifest_digest_mismatch")
    assert tenant.counts() == before

    run = train(tenant, manifest, ref, "k3").data
    cancel = tenant.ito("confirm", "--action", "cancel", "--run", run["run_id"])
    cancel_ref = cancel.data["confirmation_ref"]
    assert cancel.data["action"] == "run.cancel"
    assert tenant.ito("approve", cancel_ref, key="approver").rc == 0
    before = tenant.counts()
    assert_refused(train(tenant, manifest, cancel_ref, "k4"), "confirmation_mismatch")
    assert tenant.counts() == before


def test_confirmation_of_another_account_looks_missing(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    manifest = other_tenant.manifest()
    foreign_ref = other_tenant.approved_confirmation(manifest)
    mine = tenant.manifest()
    before = (tenant.counts(), other_tenant.counts())
    assert_refused(train(tenant, mine, foreign_ref, "k"), "confirmation_not_found")
    assert_refused(tenant.ito("approve", foreign_ref, key="approver"), "confirmation_not_found")
    assert (tenant.counts(), other_tenant.counts()) == before


def test_requester_cannot_approve_its_own_confirmation(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    ).data["confirmation_ref"]
    assert_refused(tenant.ito("approve", ref, key="requester"), "forbidden_scope")
    assert tenant.counts()["confirmations"] == {"pending": 1}
    assert_refused(train(tenant, manifest, ref, "k"), "confirmation_pending")


def test_approver_credential_cannot_request_or_create(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    assert_refused(
        tenant.ito(
            "confirm",
            "--action",
            "train",
            "--booking",
            tenant.booking_id,
            "--manifest",
            str(manifest),
            key="approver",
        ),
        "forbidden_scope",
    )
    assert_refused(
        tenant.ito(
            "train",
            "--booking",
            tenant.booking_id,
            "--manifest",
            str(manifest),
            "--confirmation-ref",
            ref,
            "--idempotency-key",
            "k",
            key="approver",
        ),
        "forbidden_scope",
    )
    assert tenant.counts()["runs"] == 0


# --- idempotency -----------------------------------------------------------------------------


def test_idempotency_key_reused_with_another_payload_is_refused(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    first = tenant.approved_confirmation(manifest)
    assert train(tenant, manifest, first, "same-key").rc == 0
    second = tenant.approved_confirmation(manifest)
    before = tenant.counts()
    assert_refused(train(tenant, manifest, second, "same-key"), "idempotency_key_reused")
    assert tenant.counts() == before
    assert before["confirmations"] == {"consumed": 1, "approved": 1}


def test_replay_short_circuits_before_gates_even_after_the_booking_changed(
    tenant: Tenant,
) -> None:
    manifest = tenant.manifest()
    ref = tenant.approved_confirmation(manifest)
    run_id = train(tenant, manifest, ref, "k").data["run_id"]
    tenant.set_booking_state(tenant.booking_id, "released")
    replay = train(tenant, manifest, ref, "k")
    assert replay.rc == 0 and replay.data["run_id"] == run_id and replay.data["replayed"]


def test_invalid_idempotency_key_is_a_local_refusal(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    result = train(tenant, manifest, "cfr_x", "k" * 256)
    assert_refused(result, "idempotency_key_invalid", live=False)


# --- credentials -----------------------------------------------------------------------------


def test_revoked_key_gets_credential_revoked(tenant: Tenant) -> None:
    shown = tenant.api("GET", "/v1/me")
    key_id = shown["data"]["key_prefix"]
    assert key_id.startswith("ito_req_")
    with tenant.server.engine.connect() as conn:
        from sqlalchemy import text

        real_id = conn.execute(
            text("SELECT id FROM api_keys WHERE prefix = :p"), {"p": key_id}
        ).scalar_one()
    tenant.server.desk(f"/v1/desk/keys/{real_id}/revoke", {})
    for args in (["status"], ["auth"], ["bookings", "list"]):
        assert_refused(tenant.ito(*args), "credential_revoked")


def test_unknown_key_and_missing_key_are_not_authenticated(tenant: Tenant) -> None:
    assert_refused(tenant.ito("status", key="ito_req_AAAAAAAA_" + "x" * 40), "not_authenticated")
    result = tenant.ito("status", key=None)
    assert_refused(result, "not_authenticated", live=False)


def test_booking_past_its_term_is_not_eligible(tenant: Tenant) -> None:
    now = datetime.now(UTC)
    past = tenant.booking(
        start=(now - timedelta(days=3)).isoformat(), end=(now - timedelta(days=1)).isoformat()
    )
    assert_refused(tenant.ito("bookings", "eligibility", past), "booking_expired")
    fresh = tenant.ito("bookings", "eligibility", tenant.booking_id)
    assert fresh.data["eligible"] is True
    assert fresh.data["topology"] == {
        "gpu": "cpu",
        "nodes": 1,
        "gpus_per_node": 2,
        "gpu_memory_gb": 8,
    }


# --- checkpoint storage ----------------------------------------------------------------------


def _rebind_approved_confirmation(tenant: Tenant, ref: str, manifest: Path) -> None:
    """Re-seal an approved confirmation for another manifest, as a server without the storage
    check could have approved it: gate 3 then passes and gate 5 alone has to refuse."""
    with Session(tenant.server.engine) as session, session.begin():
        confirmation = session.get(Confirmation, ref)
        assert confirmation is not None and confirmation.state == "approved"
        confirmation.manifest_digest = manifest_digest(manifest.read_bytes())
        confirmation.capability_hash = _seal(tenant.server.env["ITO_PEPPER"], confirmation)


def test_checkpoint_storage_escaping_the_booking_is_refused_and_creates_nothing(
    tenant: Tenant,
) -> None:
    # A run whose checkpoint directory a hostile manifest tries to take over.
    good = tenant.manifest("good")
    victim = train(tenant, good, tenant.approved_confirmation(good), "victim").data["run_id"]
    spare_ref = tenant.approved_confirmation(good)
    root = f"file://{tenant.workdir}/storage"
    hostile = {
        "encoded-dotdot-and-fragment": f"{root}/%2e%2e/%2e%2e/home/worker#",
        "another-run-and-fragment": f"{root}/runs/{victim}#",
        "inside-another-run": f"{root}/runs/{victim}",
        "encoded-slash": f"{root}/x%2f..%2f..%2fetc",
        "empty-segment": f"{root}//x",
    }
    before = tenant.counts()
    assert before["runs"] == 1 and before["confirmations"] == {"consumed": 1, "approved": 1}
    for name, storage in hostile.items():
        manifest = tenant.manifest(name)
        document = json.loads(manifest.read_text())
        document["checkpoint"]["storage"] = storage
        manifest.write_text(json.dumps(document, indent=2))

        plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
        assert plan.rc == 0 and plan.data["ready"] is False, (name, plan.stdout)
        assert [r["code"] for r in plan.data["refusals"]] == ["checkpoint_storage_invalid"]
        assert_refused(
            tenant.ito(
                "confirm",
                "--action",
                "train",
                "--booking",
                tenant.booking_id,
                "--manifest",
                str(manifest),
            ),
            "checkpoint_storage_invalid",
        )
        _rebind_approved_confirmation(tenant, spare_ref, manifest)
        assert_refused(
            train(tenant, manifest, spare_ref, f"k-{name}"), "checkpoint_storage_invalid"
        )
        assert tenant.counts() == before, name
    # Nothing was created for a run (the manifests and their data live in the storage too).
    assert not (tenant.workdir / "storage" / "runs").exists()


@pytest.mark.parametrize("target", ["/etc/shadow", "/nonexistent/web.jsonl", "{workdir}/web.jsonl"])
def test_a_data_file_outside_the_bookings_storage_is_refused_and_says_nothing_of_it(
    tenant: Tenant, target: str
) -> None:
    """The worker's host holds other tenants' files and the server's own: a data URI names
    only what lies in the booking's storage. Refused on the URI alone — the answer is the same
    for a file that exists, one that does not, and one that is readable — and nothing is
    created."""
    manifest = tenant.manifest("outside")
    document = json.loads(manifest.read_text())
    document["data"][0]["uri"] = "file://" + target.format(workdir=tenant.workdir)
    manifest.write_text(json.dumps(document, indent=2))
    before = tenant.counts()
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is False, plan.stdout
    (refusal,) = plan.data["refusals"]
    assert refusal["code"] == "data_policy_violation"
    assert refusal["details"]["violations"] == [
        {"path": "$.data[0].uri", "reason": "not inside the booking's storage"}
    ]
    confirm = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    )
    assert_refused(confirm, "data_policy_violation")
    assert tenant.counts() == before


def test_an_unplannable_manifest_is_refused_plan_refused_and_creates_nothing(
    tenant: Tenant,
) -> None:
    good = tenant.manifest("good")
    spare_ref = tenant.approved_confirmation(good)
    before = tenant.counts()
    # Context parallelism the engine cannot apply: refused, never silently ignored.
    manifest = tenant.manifest("cp")
    document = json.loads(manifest.read_text())
    document["resources"]["parallelism"] = {"cp": 2}
    manifest.write_text(json.dumps(document, indent=2))

    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is False, plan.stdout
    assert [r["code"] for r in plan.data["refusals"]] == ["plan_refused"]
    refusal = plan.data["refusals"][0]
    assert "cp_unsupported" in [r["code"] for r in refusal["reasons"]]
    assert plan.data["parallelism"]["ok"] is False
    assert plan.data["parallelism"]["error"]["code"] == "plan_refused"
    assert_refused(
        tenant.ito(
            "confirm",
            "--action",
            "train",
            "--booking",
            tenant.booking_id,
            "--manifest",
            str(manifest),
        ),
        "plan_refused",
    )
    _rebind_approved_confirmation(tenant, spare_ref, manifest)
    refused = train(tenant, manifest, spare_ref, "k-cp")
    assert_refused(refused, "plan_refused")
    assert "cp_unsupported" in [r["code"] for r in refused.envelope["error"]["reasons"]]
    # Nothing created, the confirmation still approved (not consumed).
    assert tenant.counts() == before
    assert before["confirmations"] == {"approved": 1}
