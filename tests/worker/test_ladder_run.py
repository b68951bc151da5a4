"""The ladder decision job end to end (DESIGN §7.4): a real ``ito-worker`` runs confirmed runs of
the ``ladder-harmful`` and ``ladder-helpful`` recipes against the real server (SQLite and
PostgreSQL). The plan and the estimate carry the ladder and its cost; shuffled-token noise is
rejected — the run ends ``gate_failed`` / ``ladder_rejected`` with its decision served and no
training step taken; written sums, in the domain the stage's battery measures, pass and the run
trains every stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import Tenant

pytestmark = pytest.mark.slow


def _ladder_in_the_plan(tenant: Tenant, manifest: Path) -> None:
    plan = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest)).data
    assert plan["ready"] is True, plan["refusals"]
    stages = [s["stage"] for s in plan["stage_plan"]]
    assert stages[:3] == ["data_prep", "ladder", "pretrain"]
    (ladder,) = [s for s in plan["stage_plan"] if s["stage"] == "ladder"]
    assert ladder["tokens"] == 2 * 20_000 and ladder["estimated_seconds"] > 0


def _run(tenant: Tenant, tmp_path: Path, recipe: str) -> tuple[str, dict[str, Any]]:
    """Plan, confirm and create a run of ``recipe``, and let a worker run it to its end."""
    manifest = tenant.manifest(recipe, recipe=recipe)
    _ladder_in_the_plan(tenant, manifest)
    run_id = tenant.train(manifest, f"{recipe}-1")
    _, worker = tenant.work_once(tmp_path / "worker-home")
    assert worker.returncode == 0, worker.stderr[-3000:]
    return run_id, tenant.api("GET", f"/v1/runs/{run_id}")["data"]


def test_noise_as_custom_data_is_rejected_before_the_run_trains(
    tenant: Tenant, tmp_path: Path
) -> None:
    run_id, final = _run(tenant, tmp_path, "ladder-harmful")
    assert final["state"] == "gate_failed", final
    assert final["failure_code"] == "ladder_rejected"
    stages = [(e["data"].get("stage"), e["data"].get("status")) for e in final["events"]]
    assert ("ladder", "started") in stages and ("ladder", "completed") not in stages
    assert not [s for s in stages if s[0] in ("pretrain", "midtrain", "long_context")]
    (decision_event,) = [e for e in final["events"] if e["kind"] == "gate"]
    assert decision_event["data"]["ladder"]["custom_data"] == ["custom"]
    # Every surface: the ladder ran and stopped the run, no curriculum stage ran, and the
    # final event names only data preparation as completed.
    statuses = {r["name"]: r["status"] for r in final["progress"]}
    assert statuses == {
        "data_prep": "done",
        "ladder": "stopped",
        "pretrain": "not_run",
        "midtrain": "not_run",
        "long_context": "not_run",
    }
    ended = next(e for e in final["events"] if e["to_state"] == "gate_failed")
    assert ended["data"]["stages_completed"] == ["data_prep"]

    served = tenant.ito("runs", "gates", run_id).data
    assert served["ladder"]["passed"] is False
    assert served["ladder"]["reference_data"] == ["web"]
    assert served["ladder"]["steps"] > 0 and served["ladder"]["tokens"] > 0
    (gate,) = served["gates"]
    assert (gate["stage"], gate["eval"], gate["data"], gate["passed"]) == (
        "ladder",
        "heldout_loss",
        "web",
        False,
    )
    assert gate["value"] > gate["threshold"] == pytest.approx(gate["reference"] * 1.01)
    # Nothing of the run trained: no loss, no checkpoint.
    assert tenant.ito("runs", "metrics", run_id, "--name", "loss").data["points"] == []
    assert tenant.ito("runs", "checkpoints", run_id).data["checkpoints"] == []


def test_custom_data_that_helps_the_battery_passes_and_the_run_trains(
    tenant: Tenant, tmp_path: Path
) -> None:
    run_id, final = _run(tenant, tmp_path, "ladder-helpful")
    assert final["state"] == "succeeded", final
    kinds = [(e["kind"], e["data"].get("stage"), e["data"].get("status")) for e in final["events"]]
    order = [k[1] for k in kinds if k[0] == "stage" and k[2] == "completed"]
    assert order == ["data_prep", "ladder", "pretrain", "midtrain", "long_context"]
    assert [s["name"] for s in final["stage_plan"]["stages"]] == order
    assert {r["status"] for r in final["progress"]} == {"done"}
    ended = next(e for e in final["events"] if e["to_state"] == "succeeded")
    assert ended["data"]["stages_completed"] == order

    served = tenant.ito("runs", "gates", run_id).data
    assert served["ladder"]["passed"] is True
    ladder = [g for g in served["gates"] if g["stage"] == "ladder"]
    assert [(g["eval"], g["data"], g["passed"]) for g in ladder] == [
        ("heldout_loss", "arith-heldout", True)
    ]
    assert ladder[0]["value"] < ladder[0]["reference"]
    assert [g["stage"] for g in served["gates"]] == [
        "ladder",
        "pretrain",
        "midtrain",
        "midtrain",
        "long_context",
    ]
