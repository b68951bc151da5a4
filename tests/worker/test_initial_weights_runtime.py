"""Fine-tuning from an earlier run, end to end with real processes (DESIGN §7.6): a run trains
through the in-process worker of ``ito-server serve``; a second run of the same account whose
manifest says ``run:<first>@<its last step>`` is resolved at plan/create, leased with the
checkpoint's digest, handed to the engine below the booking's storage, verified and loaded —
and its step-0 held-out loss is the first run's last one, not a random model's; so is that of a
third run from the first run's Hugging Face export."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Server, Tenant, make_tenant, start_server, stop_server
from tests.worker.test_runtime_local import TERMINAL, _wait_state

pytestmark = pytest.mark.slow
EVAL = "eval/heldout_loss/web"


@pytest.fixture(scope="module")
def worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("revision-home")
    srv = start_server(
        f"sqlite:///{home / 'ito.db'}",
        home,
        worker=True,
        extra_env={"ITO_LEASE_TTL_SECONDS": "8", "ITO_HEARTBEAT_SECONDS": "1"},
    )
    yield srv
    stop_server(srv)


def _pretrain_only(t: Tenant, name: str, revision: str = "scratch") -> Path:
    path = t.manifest(name)
    document = json.loads(path.read_text())
    document["curriculum"] = [s for s in document["curriculum"] if s["stage"] == "pretrain"]
    document["checkpoint"]["keep_last"] = 50
    document["model"]["revision"] = revision
    path.write_text(json.dumps(document))
    return path


def _eval_points(t: Tenant, run_id: str) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = t.ito("runs", "metrics", run_id, "--name", EVAL).data["points"]
    return points


def test_a_run_from_an_earlier_runs_checkpoint_starts_at_its_eval_loss(
    worker_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(worker_server, tmp_path / "t", "finetune")
    source = t.train(_pretrain_only(t, "source"), "source-1")
    first = _wait_state(t, source, TERMINAL)
    assert first["state"] == "succeeded", first
    last = max(c["step"] for c in t.ito("runs", "checkpoints", source).data["checkpoints"])
    first_evals = _eval_points(t, source)
    random_model = next(p["value"] for p in first_evals if p["step"] == 0)
    trained = next(p["value"] for p in first_evals if p["step"] == last)

    run_id = t.train(_pretrain_only(t, "tuned", f"run:{source}@{last}"), "tuned-1")
    recorded = t.api("GET", f"/v1/runs/{run_id}")["data"]["estimate"]["initial_weights"]
    assert (recorded["run_id"], recorded["step"]) == (source, last)
    final = _wait_state(t, run_id, TERMINAL)
    # Its gate is relative to its own step 0 (the loaded model): a short budget may not move it.
    assert final["state"] in ("succeeded", "gate_failed"), final
    logs = [line["message"] for line in t.ito("runs", "logs", run_id).data["lines"]]
    assert any("initial weights loaded from run:" in m for m in logs)
    start = next(p["value"] for p in _eval_points(t, run_id) if p["step"] == 0)
    assert math.isclose(start, trained, rel_tol=1e-4), (start, trained)
    assert start < random_model - 1.0

    # The same weights as the first run's Hugging Face export, inside the booking's storage.
    (export,) = t.ito("runs", "checkpoints", source).data["exports"]
    revision = f"hf:{export['path']}@sha256:{export['sha256']}"
    from_hf = t.train(_pretrain_only(t, "from-hf", revision), "from-hf-1")
    final = _wait_state(t, from_hf, TERMINAL)
    assert final["state"] in ("succeeded", "gate_failed"), final
    start = next(p["value"] for p in _eval_points(t, from_hf) if p["step"] == 0)
    assert math.isclose(start, trained, rel_tol=1e-4), (start, trained)
