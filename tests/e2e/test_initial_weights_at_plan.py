"""Initial weights (``model.revision``, DESIGN §7.6) resolved by the server at plan, confirm and
create: a committed checkpoint of an earlier run of the same account (as its worker reported
it) or a Hugging Face directory with its sha256 is recorded on the new run and handed to the
worker with its lease; anything unresolvable is refused with ``revision_unresolvable`` at
``$.model.revision`` by ``ito plan``, ``ito confirm`` and ``ito train`` alike, and nothing is
created or consumed. Through the real CLI, server and worker API, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ito.core.model_sizes import SIZES
from ito.pipeline.model import llama_config
from tests.e2e.test_runtime_support_at_plan import _confirm, _edited, _rebind, _refused, _train
from tests.support import Tenant

pytestmark = pytest.mark.slow

CODE = "revision_unresolvable"
SHA_6 = "b" * 64


def _worker_key(tenant: Tenant) -> str:
    return str(
        tenant.server.desk(
            "/v1/desk/keys",
            {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
        )["api_key"]
    )


def _source_run(tenant: Tenant) -> str:
    """A run of ``tenant`` whose worker reported checkpoints at steps 3, 6 (digest
    :data:`SHA_6`) and 9 (no digest: an older engine); ``keep_last`` 2 pruned step 3."""
    run_id = tenant.train(tenant.manifest("source"), "source-1")
    key = _worker_key(tenant)
    leased = tenant.api("POST", "/v1/worker/lease", key=key)
    assert leased["ok"] and leased["data"]["run_id"] == run_id, leased
    _report(tenant, run_id, key, leased["data"]["attempt"], ((3, "a" * 64), (6, SHA_6), (9, None)))
    return run_id


def _report(tenant: Tenant, run_id: str, key: str, attempt: int, steps: Any) -> None:
    checkpoints: list[dict[str, Any]] = []
    for step, sha in steps:
        event: dict[str, Any] = {
            "type": "checkpoint",
            "stage": "pretrain",
            "step": step,
            "path": f"{tenant.workdir}/storage/runs/{run_id}/pretrain/step_{step:08d}",
            "bytes": 1000,
            "seconds": 0.5,
        }
        if sha is not None:
            event["sha256"] = sha
        checkpoints.append(event)
    reported = tenant.api(
        "POST",
        f"/v1/worker/runs/{run_id}/report",
        key=key,
        json={"attempt": attempt, "events": checkpoints},
    )
    assert reported["ok"] and reported["data"]["checkpoints"] == len(checkpoints), reported


def _revision(revision: str) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        doc["model"]["revision"] = revision

    return edit


def _refused_everywhere(
    actor: Tenant, manifest: Path, reason: str, booking: str | None = None
) -> None:
    """Plan, confirm and create (with an approved confirmation re-sealed for ``manifest``, so
    gates 1–4 pass) all refuse with the code and ``reason``; nothing changes."""
    booking = booking or actor.booking_id
    spare = actor.approved_confirmation(actor.manifest("good"), booking_id=booking)
    before = actor.counts()
    plan = actor.ito("plan", "--booking", booking, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is False, plan.stdout
    refusals = [r for r in plan.data["refusals"] if r["code"] == CODE]
    assert [r["details"]["reason"] for r in refusals] == [reason], plan.data["refusals"]
    assert refusals[0]["details"]["path"] == "$.model.revision"

    confirm = actor.ito(
        "confirm", "--action", "train", "--booking", booking, "--manifest", str(manifest)
    )
    assert _refused(confirm, CODE)["details"]["reason"] == reason

    _rebind(actor, spare, manifest)
    created = actor.ito(
        "train",
        "--booking",
        booking,
        "--manifest",
        str(manifest),
        "--confirmation-ref",
        spare,
        "--idempotency-key",
        f"k-{reason}",
    )
    assert _refused(created, CODE)["details"]["reason"] == reason
    assert actor.counts() == before


def _hf_dir(root: Path, *, vocab: int | None = None) -> tuple[Path, str]:
    """A Hugging Face directory of the tiny size (``vocab`` to make it another architecture);
    the server reads config.json; the engine alone hashes model.safetensors."""
    root.mkdir(parents=True)
    config = llama_config(SIZES["tiny"]).to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    if vocab is not None:
        config["vocab_size"] = vocab
    (root / "config.json").write_text(json.dumps(config))
    weights = b"weights of a tiny model"
    (root / "model.safetensors").write_bytes(weights)
    return root, hashlib.sha256(weights).hexdigest()


def test_a_committed_checkpoint_of_the_same_account_is_resolved_recorded_and_leased(
    tenant: Tenant,
) -> None:
    source = _source_run(tenant)
    manifest = _edited(tenant, "from-run", _revision(f"run:{source}@6"))
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is True, plan.stdout
    weights = plan.data["initial_weights"]
    assert weights["kind"] == "run" and weights["run_id"] == source
    assert (weights["step"], weights["stage"], weights["sha256"]) == (6, "pretrain", SHA_6)

    run_id = tenant.train(manifest, "from-run-1")
    shown = tenant.api("GET", f"/v1/runs/{run_id}")["data"]
    assert shown["estimate"]["initial_weights"] == weights
    # The worker gets it with the lease (the source run holds its own lease still).
    leased = tenant.api("POST", "/v1/worker/lease", key=_worker_key(tenant))
    assert leased["data"]["run_id"] == run_id, leased
    assert leased["data"]["initial_weights"] == weights


def test_weights_that_changed_since_the_approval_are_refused_at_create(tenant: Tenant) -> None:
    """The source run committed step 6 again (a restart from an earlier checkpoint) after the
    confirmation was approved: the run would start from weights the approver never saw."""
    run_id = tenant.train(tenant.manifest("source"), "source-1")
    key = _worker_key(tenant)
    attempt = tenant.api("POST", "/v1/worker/lease", key=key)["data"]["attempt"]
    _report(tenant, run_id, key, attempt, ((6, SHA_6),))
    manifest = _edited(tenant, "from-run", _revision(f"run:{run_id}@6"))
    ref = tenant.approved_confirmation(manifest)
    _report(tenant, run_id, key, attempt, ((6, "d" * 64),))
    before = tenant.counts()
    created = _train(tenant, manifest, ref, "changed-1")
    _refused(created, "confirmation_mismatch")
    assert tenant.counts() == before


def test_a_hugging_face_directory_with_its_digest_is_resolved_and_recorded(
    tenant: Tenant,
) -> None:
    directory, sha = _hf_dir(tenant.workdir / "storage" / "models" / "tiny")
    manifest = _edited(tenant, "from-hf", _revision(f"hf:{directory}@sha256:{sha}"))
    run_id = tenant.train(manifest, "from-hf-1")
    weights = tenant.api("GET", f"/v1/runs/{run_id}")["data"]["estimate"]["initial_weights"]
    assert weights == {
        "kind": "hf",
        "path": str(directory),
        "sha256": sha,
        "revision": f"hf:{directory}@sha256:{sha}",
        "verified_by_engine": "sha256 of model.safetensors, as it loads it, before step 0",
    }


@pytest.mark.parametrize(
    ("revision", "reason"),
    [
        ("run:run_aaaaaaaaaaaaaaaaaaaaaaaa@6", "run_not_found"),
        ("run:{source}@7", "checkpoint_not_committed"),
        ("run:{source}@3", "checkpoint_deleted"),
        ("run:{source}@9", "digest_unknown"),
    ],
    ids=["missing_run", "absent_step", "pruned_step", "no_digest"],
)
def test_an_unresolvable_checkpoint_is_refused_at_plan_confirm_and_create(
    tenant: Tenant, revision: str, reason: str
) -> None:
    source = _source_run(tenant)
    manifest = _edited(tenant, "bad-run", _revision(revision.format(source=source)))
    _refused_everywhere(tenant, manifest, reason)


def test_another_accounts_run_is_refused_exactly_like_a_missing_one(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    source = _source_run(tenant)
    theirs = _edited(other_tenant, "theirs", _revision(f"run:{source}@6"))
    missing = _edited(other_tenant, "missing", _revision("run:run_aaaaaaaaaaaaaaaaaaaaaaaa@6"))
    bodies = []
    for manifest in (theirs, missing):
        plan = other_tenant.ito(
            "plan", "--booking", other_tenant.booking_id, "--manifest", str(manifest)
        )
        (refusal,) = [r for r in plan.data["refusals"] if r["code"] == CODE]
        bodies.append(refusal)
    assert bodies[0] == bodies[1]
    _refused_everywhere(other_tenant, theirs, "run_not_found")


def test_a_checkpoint_outside_the_bookings_storage_is_refused(tenant: Tenant) -> None:
    source = _source_run(tenant)
    # A booking whose storage holds the manifests and their data but not the source's
    # checkpoints (under storage/runs).
    elsewhere = tenant.booking(storage_uri=f"file://{tenant.workdir}/storage/manifests")
    manifest = _edited(tenant, "elsewhere", _revision(f"run:{source}@6"))
    _refused_everywhere(tenant, manifest, "outside_booking_storage", booking=elsewhere)


def test_a_checkpoint_trained_with_another_tokenizer_is_refused(tenant: Tenant) -> None:
    source = _source_run(tenant)

    def edit(doc: dict[str, Any]) -> None:
        doc["model"]["revision"] = f"run:{source}@6"
        doc["model"]["tokenizer"] = {
            "uri": f"{tenant.workdir}/storage/tokenizers/t.json",
            "sha256": "c" * 64,
        }

    manifest = _edited(tenant, "tokenizer", edit)
    _refused_everywhere(tenant, manifest, "tokenizer_mismatch")


def test_the_server_never_hashes_the_weights_and_the_plan_says_the_engine_will(
    tenant: Tenant,
) -> None:
    """Hashing a tenant's file inside a request held a write transaction for as long as the
    file took (a 16 GiB sparse file: 112 s, other tenants got ``store_busy``). The digest is
    the engine's to verify as it loads the weights (``tests/pipeline/test_initial_weights``
    refuses a wrong one before step 0); the plan names that check."""
    directory, _ = _hf_dir(tenant.workdir / "storage" / "models" / "tiny")
    with (directory / "model.safetensors").open("r+b") as weights:
        weights.truncate(16 << 30)  # sparse: nothing is written, reading it would take minutes
    manifest = _edited(tenant, "hf-digest", _revision(f"hf:{directory}@sha256:{'0' * 64}"))
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is True, plan.stdout
    assert "model.safetensors" in plan.data["initial_weights"]["verified_by_engine"]


@pytest.mark.parametrize("planted", ["fifo", "too_large", "link", "directory"])
def test_a_config_json_the_server_cannot_read_at_once_is_refused_at_once(
    tenant: Tenant, planted: str
) -> None:
    """A FIFO as ``config.json`` held another tenant's confirm for as long as it stayed closed;
    twelve froze the API. Now: a regular file, opened without following a link and without
    blocking, at most 1 MiB, or ``weights_unreadable`` — plan, confirm and create alike."""
    directory, sha = _hf_dir(tenant.workdir / "storage" / "models" / "tiny")
    config = directory / "config.json"
    config.unlink()
    if planted == "fifo":
        os.mkfifo(config)
    elif planted == "too_large":
        with config.open("wb") as handle:
            handle.truncate(768 << 20)
    elif planted == "link":
        elsewhere = tenant.workdir / "config.json"
        elsewhere.write_text(json.dumps(llama_config(SIZES["tiny"]).to_dict()))
        config.symlink_to(elsewhere)
    else:
        config.mkdir()
    manifest = _edited(tenant, f"hf-{planted}", _revision(f"hf:{directory}@sha256:{sha}"))
    _refused_everywhere(tenant, manifest, "weights_unreadable")


def test_a_hugging_face_directory_of_another_architecture_is_refused(tenant: Tenant) -> None:
    directory, sha = _hf_dir(tenant.workdir / "storage" / "models" / "tiny", vocab=1024)
    manifest = _edited(tenant, "hf-arch", _revision(f"hf:{directory}@sha256:{sha}"))
    _refused_everywhere(tenant, manifest, "architecture_mismatch")


@pytest.mark.parametrize("where", ["outside", "link_out"])
def test_a_hugging_face_directory_outside_the_bookings_storage_is_refused_or_left_unread(
    tenant: Tenant, where: str
) -> None:
    """Outside the booking's storage: refused, whether this server could read it or not. A link
    inside it to a directory outside: not read by the server (no probing of its files), left
    to the engine, which proves the directory on disk and refuses the link."""
    directory, sha = _hf_dir(tenant.workdir / "models" / "tiny")
    if where == "outside":
        manifest = _edited(tenant, "hf-out", _revision(f"hf:{directory}@sha256:{sha}"))
        _refused_everywhere(tenant, manifest, "outside_booking_storage")
        return
    link = tenant.workdir / "storage" / "linked"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(directory)
    manifest = _edited(tenant, "hf-link", _revision(f"hf:{link}@sha256:{'0' * 64}"))
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    assert plan.rc == 0 and plan.data["ready"] is True, plan.stdout  # nothing read, nothing told


def test_a_path_that_is_not_normalised_is_refused(tenant: Tenant) -> None:
    manifest = _edited(tenant, "hf-dots", _revision(f"hf:/opt/../etc@sha256:{'0' * 64}"))
    _refused_everywhere(tenant, manifest, "malformed")


def test_a_bare_digest_without_a_location_is_not_a_revision(tenant: Tenant) -> None:
    manifest = _edited(tenant, "bare", _revision("sha256:" + "ab" * 32))
    error = _refused(_confirm(tenant, manifest), "manifest_invalid")
    assert "$.model.revision" in [e["path"] for e in error["details"]["errors"]]
