"""Fail closed before confirmation (DESIGN §5.8 gate 5, ``ito.core.runtime_support``): a manifest
whose data or tokenizer the runtime cannot read, whose gate it cannot measure, or whose
decontamination names an eval suite it does not define is refused by ``ito plan``, ``ito confirm``
and ``ito train`` with its stable code and JSON paths — nothing created, no confirmation consumed.
Through the real CLI and server, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from ito.core.manifest import manifest_digest
from ito.server.services.confirmations import _seal
from ito.server.store.tables import Confirmation
from tests.support import Result, Tenant

pytestmark = pytest.mark.slow


def _edited(tenant: Tenant, name: str, edit: Any) -> Path:
    manifest = tenant.manifest(name)
    document = json.loads(manifest.read_text())
    edit(document)
    manifest.write_text(json.dumps(document, indent=2))
    return manifest


def _rebind(tenant: Tenant, ref: str, manifest: Path) -> None:
    """Re-seal an approved confirmation for ``manifest``, as a server without this check could
    have approved it: gates 1–4 then pass and gate 5 alone has to refuse."""
    with Session(tenant.server.engine) as session, session.begin():
        confirmation = session.get(Confirmation, ref)
        assert confirmation is not None and confirmation.state == "approved"
        confirmation.manifest_digest = manifest_digest(manifest.read_bytes())
        confirmation.capability_hash = _seal(tenant.server.env["ITO_PEPPER"], confirmation)


def _confirm(tenant: Tenant, manifest: Path) -> Result:
    return tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    )


def _train(tenant: Tenant, manifest: Path, ref: str, key: str) -> Result:
    return tenant.ito(
        "train",
        "--booking",
        tenant.booking_id,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        ref,
        "--idempotency-key",
        key,
    )


def _refused(result: Result, code: str) -> dict[str, Any]:
    assert result.rc == 1 and result.code == code, (result.stdout, result.stderr)
    assert result.envelope is not None
    error: dict[str, Any] = result.envelope["error"]
    return error


def _assert_unsupported_everywhere(
    tenant: Tenant, manifest: Path, spare_ref: str, key: str, paths: list[str]
) -> None:
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is False, plan.stdout
    assert [r["code"] for r in plan.data["refusals"]] == ["capability_unavailable"]
    unsupported = plan.data["refusals"][0]["details"]["unsupported"]
    assert [u["path"] for u in unsupported] == paths

    confirm = _refused(_confirm(tenant, manifest), "capability_unavailable")
    assert [u["path"] for u in confirm["details"]["unsupported"]] == paths

    _rebind(tenant, spare_ref, manifest)
    created = _refused(_train(tenant, manifest, spare_ref, key), "capability_unavailable")
    assert [u["path"] for u in created["details"]["unsupported"]] == paths


@pytest.mark.parametrize(
    "uri",
    ["s3://bucket/web.jsonl", "https://data.example.com/web.jsonl", "gs://bucket/web.parquet"],
)
def test_data_at_an_unreadable_uri_scheme_is_refused_at_plan_confirm_and_create(
    tenant: Tenant, uri: str
) -> None:
    spare_ref = tenant.approved_confirmation(tenant.manifest("good"))
    before = tenant.counts()
    assert before["runs"] == 0 and before["confirmations"] == {"approved": 1}

    def edit(doc: dict[str, Any]) -> None:
        doc["data"][0]["uri"] = uri

    manifest = _edited(tenant, "remote", edit)
    _assert_unsupported_everywhere(tenant, manifest, spare_ref, "k-remote", ["$.data[0].uri"])
    # Nothing created, the confirmation still approved, not consumed.
    assert tenant.counts() == before


def _hub_tokenizer(doc: dict[str, Any]) -> None:
    doc["model"]["tokenizer"] = {
        "uri": "https://huggingface.co/org/model/resolve/main/tokenizer.json",
        "sha256": "0" * 64,
    }


def _post_training(doc: dict[str, Any]) -> None:
    # Post-training needs the whole model in each forward: not on a two-stage pipeline.
    doc["post_training"]["sft"] = {
        "data": ["arith-sft"],
        "epochs": 1,
        "max_tokens": 4000,
        "battery": "core",
    }
    doc["resources"]["parallelism"] = {"pp": 2, "dp_shard": 1}


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (_hub_tokenizer, "$.model.tokenizer.uri"),
        (_post_training, "$.post_training.sft"),
    ],
    ids=["tokenizer", "post_training"],
)
def test_what_this_version_does_not_run_is_refused_at_plan_confirm_and_create(
    tenant: Tenant, edit: Any, path: str
) -> None:
    spare_ref = tenant.approved_confirmation(tenant.manifest("good"))
    before = tenant.counts()
    manifest = _edited(tenant, "model", edit)
    _assert_unsupported_everywhere(tenant, manifest, spare_ref, "k-model", [path])
    assert tenant.counts() == before
    assert before["confirmations"] == {"approved": 1}


def test_a_gate_the_planned_layout_cannot_measure_is_refused_at_plan_confirm_and_create(
    tenant: Tenant,
) -> None:
    spare_ref = tenant.approved_confirmation(tenant.manifest("good"))
    before = tenant.counts()

    def edit(doc: dict[str, Any]) -> None:
        # exact_match (greedy generation) under a two-stage pipeline: no rank holds the model.
        doc["curriculum"][0]["battery"] = "arith"
        doc["resources"]["parallelism"] = {"pp": 2, "dp_shard": 1}

    manifest = _edited(tenant, "exact", edit)
    _assert_unsupported_everywhere(
        tenant, manifest, spare_ref, "k-exact", ["$.eval_batteries.arith[0].eval"]
    )
    assert tenant.counts() == before
    assert before["confirmations"] == {"approved": 1}


def test_an_undefined_decontamination_suite_is_refused_at_plan_confirm_and_create(
    tenant: Tenant,
) -> None:
    spare_ref = tenant.approved_confirmation(tenant.manifest("good"))
    before = tenant.counts()

    def edit(doc: dict[str, Any]) -> None:
        doc["data"][0]["decontamination"]["eval_suites"] = ["arith-heldout", "mmlu"]

    manifest = _edited(tenant, "suite", edit)
    path = "$.data[0].decontamination.eval_suites[1]"
    for result in (
        tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest)),
        _confirm(tenant, manifest),
    ):
        error = _refused(result, "manifest_invalid")
        assert path in [e["path"] for e in error["details"]["errors"]]
    _rebind(tenant, spare_ref, manifest)
    error = _refused(_train(tenant, manifest, spare_ref, "k-suite"), "manifest_invalid")
    assert path in [e["path"] for e in error["details"]["errors"]]
    assert tenant.counts() == before
    assert before["confirmations"] == {"approved": 1}


@pytest.mark.parametrize("recipe", ["demo", "test"])
def test_the_shipped_recipes_plan_ready(tenant: Tenant, recipe: str) -> None:
    manifest = tenant.manifest(recipe, recipe=recipe)
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is True, plan.stdout
