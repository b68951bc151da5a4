"""A failed eval gate ends the run for good (DESIGN §7.5, §5.9), end to end: a real
``ito-worker`` trains a confirmed run of the test recipe against the real server (SQLite and
PostgreSQL) with a pretrain budget of one step and a gate relative to step 0 that one step
cannot reach. The run ends ``gate_failed`` with its gate records and checkpoints, and no path
— restart, cancel, a worker's lease — continues it or creates anything."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ito.worker.api import WorkerApi
from tests.support import Tenant

pytestmark = pytest.mark.slow
MAX_RATIO = 0.3
"""The gate: held-out loss at most 0.3 × the untrained model's, out of reach after one step."""


def test_a_budget_too_small_to_learn_fails_its_gate_and_nothing_continues_the_run(
    tenant: Tenant, tmp_path: Path
) -> None:
    manifest = tenant.manifest("one-step")
    document = json.loads(manifest.read_text())
    # One optimizer step's worth of tokens: 2 ranks × 4 sequences × 128 tokens.
    document["curriculum"][0]["tokens"] = 1024
    document["eval_batteries"]["core"] = [
        {"eval": "heldout_loss", "data": "web", "max_ratio": MAX_RATIO}
    ]
    manifest.write_text(json.dumps(document))
    run_id = tenant.train(manifest, "one-step-1")

    # A cancel approved while the run was still queued (and so cancellable), kept for later.
    cancel_ref = tenant.ito("confirm", "--action", "cancel", "--run", run_id).data[
        "confirmation_ref"
    ]
    assert tenant.ito("approve", cancel_ref, key="approver").rc == 0

    worker_key, worker = tenant.work_once(tmp_path / "worker-home")
    assert worker.returncode == 0, worker.stderr[-3000:]

    final = tenant.api("GET", f"/v1/runs/{run_id}")["data"]
    assert final["state"] == "gate_failed", final
    assert final["failure_code"] == "eval_gate_failed"
    stages = [(e["data"].get("stage"), e["data"].get("status")) for e in final["events"]]
    assert ("pretrain", "started") in stages
    assert ("pretrain", "completed") not in stages
    assert not [s for s in stages if s[0] == "midtrain"], final["events"]

    # The gate record: the measured value, the untrained model's, the threshold, failed.
    gates = tenant.ito("runs", "gates", run_id).data["gates"]
    assert [(g["stage"], g["eval"], g["data"], g["passed"]) for g in gates] == [
        ("pretrain", "heldout_loss", "web", False)
    ]
    (gate,) = gates
    assert gate["rule"] == f"heldout_loss(web) ≤ {MAX_RATIO:g} × step 0"
    assert math.isclose(gate["threshold"], MAX_RATIO * gate["initial"])
    assert gate["value"] > gate["threshold"]
    # The same numbers as the measurements reported at step 0 and after the one step.
    points = tenant.ito("runs", "metrics", run_id, "--name", "eval/heldout_loss/web").data["points"]
    assert [p["step"] for p in points] == [0, 1]
    assert [p["value"] for p in points] == pytest.approx([gate["initial"], gate["value"]])

    checkpoints = tenant.ito("runs", "checkpoints", run_id).data["checkpoints"]
    assert checkpoints and not any(c["deleted"] for c in checkpoints)
    assert max(c["step"] for c in checkpoints) == 1

    before = tenant.counts()
    assert before["confirmations"] == {"consumed": 1, "approved": 1}

    # A restart needs a proposal the run never made: refused before any confirmation exists.
    restart = tenant.ito("confirm", "--action", "restart", "--run", run_id, "--checkpoint", "1")
    assert restart.code == "invalid_transition"
    # Nor does an approved confirmation of another action restart it.
    restarted = tenant.ito(
        "runs", "restart", run_id, "--confirmation-ref", cancel_ref, "--idempotency-key", "r-1"
    )
    assert restarted.code == "confirmation_mismatch"
    # Cancel: no new confirmation, and the one approved earlier is refused, not spent.
    assert tenant.ito("confirm", "--action", "cancel", "--run", run_id).code == (
        "run_not_cancellable"
    )
    cancelled = tenant.ito(
        "runs", "cancel", run_id, "--confirmation-ref", cancel_ref, "--idempotency-key", "c-1"
    )
    assert cancelled.code == "run_not_cancellable"
    # A worker of the booking finds nothing to lease.
    api = WorkerApi(tenant.server.url, str(worker_key))
    try:
        assert api.lease() is None
    finally:
        api.close()

    assert tenant.counts() == before
    after = tenant.api("GET", f"/v1/runs/{run_id}")["data"]
    assert after["state"] == "gate_failed" and after["failure_code"] == "eval_gate_failed"
    assert len(after["events"]) == len(final["events"])
    assert tenant.ito("runs", "checkpoints", run_id).data["checkpoints"] == checkpoints
