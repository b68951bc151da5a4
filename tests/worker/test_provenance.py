"""Provenance served and bound (DESIGN §7.4): the report a real data preparation wrote is
uploaded by the worker holding the lease, bound to the run once, served to the run's tenant
(and to nobody else), and training refuses a shard the bound report does not list. Real server
on loopback (both backends), real worker API, real ``prepare_data`` on the recipe's data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from ito.core.errors import ItoError
from ito.core.manifest import parse_manifest
from ito.core.provenance import provenance_digest
from ito.pipeline.data import check_shard, read_documents
from ito.pipeline.data_prep import PROVENANCE_FILE, prepare_data, prepared_dir, shard_path
from ito.worker.api import WorkerApi
from tests.support import Tenant

pytestmark = pytest.mark.slow


def _leased(tenant: Tenant, key: str) -> tuple[WorkerApi, str, Path]:
    manifest = tenant.manifest(name=key)
    run_id = tenant.train(manifest, key)
    worker_key = tenant.server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )["api_key"]
    api = WorkerApi(tenant.server.url, str(worker_key))
    lease = api.lease()
    assert lease is not None and lease.run_id == run_id and lease.provenance_sha256 is None
    return api, run_id, manifest


def _prepared(manifest: Path, workdir: Path) -> bytes:
    prepare_data(parse_manifest(manifest.read_bytes()), workdir)
    return (prepared_dir(workdir) / PROVENANCE_FILE).read_bytes()


def _bound_rows(tenant: Tenant, run_id: str) -> tuple[int, str | None]:
    with tenant.server.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT count(*) FROM run_provenance WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
        bound = conn.execute(
            text("SELECT provenance_sha256 FROM runs WHERE id = :r"), {"r": run_id}
        ).scalar_one()
    return int(rows), bound


def test_the_report_is_bound_once_and_served_to_its_tenant_only(
    tenant: Tenant, other_tenant: Tenant, tmp_path: Path
) -> None:
    api, run_id, manifest = _leased(tenant, "prov")
    raw = _prepared(manifest, tmp_path / "work")
    bound = api.provenance(run_id, 1, raw)
    assert bound.sha256 == provenance_digest(raw) and not bound.replayed

    served = tenant.ito("runs", "provenance", run_id)
    assert served.rc == 0, served.stdout
    assert served.data["sha256"] == bound.sha256 and served.data["attempt"] == 1
    assert served.data["report"] == json.loads(raw)
    assert tenant.ito("runs", "show", run_id).data["provenance_sha256"] == bound.sha256
    events = tenant.ito("runs", "show", run_id).data["events"]
    assert [e["data"]["sha256"] for e in events if e["kind"] == "provenance"] == [bound.sha256]

    # The same bytes again (a resumed attempt): nothing new.
    assert api.provenance(run_id, 1, raw).replayed
    # Other bytes: refused, and the bound report stays.
    other = json.loads(raw)
    other["manifest_name"] = "something else"
    with pytest.raises(ItoError) as refused:
        api.provenance(run_id, 1, json.dumps(other).encode())
    assert refused.value.code == "provenance_mismatch"
    assert _bound_rows(tenant, run_id) == (1, bound.sha256)
    assert tenant.ito("runs", "provenance", run_id).data["sha256"] == bound.sha256

    # Another tenant's run answers exactly like a missing one.
    theirs = other_tenant.ito("runs", "provenance", run_id)
    absent = run_id[:-1] + ("a" if run_id[-1] != "a" else "b")
    missing = other_tenant.ito("runs", "provenance", absent)
    assert theirs.code == missing.code == "run_not_found"
    api.close()


def test_a_report_over_the_contamination_limit_or_of_other_data_is_refused_and_binds_nothing(
    tenant: Tenant, tmp_path: Path
) -> None:
    api, run_id, manifest = _leased(tenant, "dirty")
    report = json.loads(_prepared(manifest, tmp_path / "work"))
    assert tenant.ito("runs", "provenance", run_id).code == "provenance_not_found"

    contaminated = json.loads(json.dumps(report))
    contaminated["evals"][0]["contaminated"] = 1  # the recipe's policy allows 0
    with pytest.raises(ItoError) as refused:
        api.provenance(run_id, 1, json.dumps(contaminated).encode())
    assert refused.value.code == "data_policy_violation"

    elsewhere = json.loads(json.dumps(report))
    elsewhere["datasets"][0]["input_sha256"] = "0" * 64
    with pytest.raises(ItoError) as refused:
        api.provenance(run_id, 1, json.dumps(elsewhere).encode())
    assert refused.value.code == "provenance_mismatch"

    # The manifest names no tokenizer: the report's must be one trained on the data.
    assert report["tokenizer"]["source"] == "trained"
    named = json.loads(json.dumps(report))
    named["tokenizer"]["source"] = "manifest"
    with pytest.raises(ItoError) as refused:
        api.provenance(run_id, 1, json.dumps(named).encode())
    assert refused.value.code == "provenance_mismatch"

    broken = json.loads(json.dumps(report))
    broken["datasets"][0]["counts"]["output"] += 1
    with pytest.raises(ItoError) as refused:
        api.provenance(run_id, 1, json.dumps(broken).encode())
    assert refused.value.code == "invalid_arguments"

    assert _bound_rows(tenant, run_id) == (0, None)
    assert tenant.ito("runs", "provenance", run_id).code == "provenance_not_found"
    api.close()


def test_training_reads_only_shards_the_bound_report_lists(tenant: Tenant, tmp_path: Path) -> None:
    manifest_path = tenant.manifest(name="shards")
    workdir = tmp_path / "work"
    raw = _prepared(manifest_path, workdir)
    bound = provenance_digest(raw)
    manifest = parse_manifest(manifest_path.read_bytes())
    ref = next(r for r in manifest.data if r.role != "eval")
    shard = shard_path(workdir, ref.id)
    assert read_documents(ref, workdir, bound)  # as prepared: read

    # A shard changed after preparation.
    original = shard.read_bytes()
    shard.write_bytes(original.replace(b"}\n", b"} \n", 1))
    with pytest.raises(ItoError) as refused:
        read_documents(ref, workdir, bound)
    assert refused.value.code == "provenance_mismatch"
    shard.write_bytes(original)

    # A report that is not the bound one (even if it lists this shard).
    with pytest.raises(ItoError) as refused:
        check_shard(workdir, ref.id, original, provenance_digest(raw + b" "))
    assert refused.value.code == "provenance_mismatch"
