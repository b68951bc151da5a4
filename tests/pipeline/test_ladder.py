"""The ladder decision job in the engine (DESIGN §7.4): real ``torchrun`` with two gloo processes
on the ``ladder-helpful`` and ``ladder-harmful`` recipes.

Custom data in the domain the stage's battery measures (written sums, measured on held-out sums)
passes and the run trains; shuffled-token noise, measured on held-out web text, is rejected and
the run ends ``gate_failed`` / ``ladder_rejected`` before any training step. The decision is
written once in the checkpoint storage: a restarted attempt reads it instead of training the proxies
again.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from ito.recipes import build_recipe
from tests.pipeline.test_pretrain_engine import events, torchrun

pytestmark = pytest.mark.slow


def make_spec(root: Path, recipe: str) -> Path:
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    built = build_recipe(recipe, str(data))
    for name, content in built.files.items():
        (data / name).write_bytes(content)
    spec = {
        "run_id": "run-ladder-1",
        "attempt": 1,
        "manifest": built.manifest,
        "workdir": str(root / "work"),
        "checkpoint_dir": str(root / "ckpt"),
        "events_path": str(root / "events.jsonl"),
        "stages": ["pretrain"],
        "max_steps_per_stage": 4,
        "fail_at": None,
        "loss_spike_at": None,
    }
    path = root / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _ladder_gate(evs: list[dict[str, Any]]) -> dict[str, Any]:
    (gate,) = [e for e in evs if e["type"] == "gate" and e["stage"] == "ladder"]
    return gate


def _check_decision(gate: dict[str, Any], recipe: str) -> None:
    """The gate's numbers are what the rule says of them."""
    manifest = build_recipe(recipe, "/data").manifest
    margin = manifest["ladder"]["margin"]
    facts = gate["ladder"]
    assert facts["proxy_size"] == "tiny"
    assert facts["reference_data"] == ["web"] and facts["custom_data"] == ["custom"]
    # Same budget for both arms: the steps that fit the ladder's tokens on 2 ranks × 4 × 128.
    assert facts["steps"] == manifest["ladder"]["tokens"] // (2 * 4 * 128)
    assert facts["tokens"] == facts["steps"] * 2 * 4 * 128
    battery = manifest["eval_batteries"][manifest["curriculum"][0]["battery"]]
    assert [(r["eval"], r["data"]) for r in gate["results"]] == [
        (s["eval"], s["data"]) for s in battery
    ]
    for result in gate["results"]:
        assert math.isclose(result["threshold"], result["reference"] * (1 + margin))
        assert result["passed"] == (result["value"] <= result["threshold"])
    assert gate["passed"] == all(r["passed"] for r in gate["results"])


def _decide(tmp_path: Path, recipe: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the engine on ``recipe``; its events and its checked ladder gate."""
    assert torchrun(make_spec(tmp_path, recipe)).returncode == 0
    evs = events(tmp_path)
    gate = _ladder_gate(evs)
    _check_decision(gate, recipe)
    return evs, gate


def test_custom_data_in_the_batterys_domain_passes_and_the_run_trains(tmp_path: Path) -> None:
    evs, gate = _decide(tmp_path, "ladder-helpful")
    (result,) = gate["results"]
    assert gate["passed"] and result["value"] < result["reference"]  # it helps, not only ties
    kinds = [(e["type"], e.get("stage"), e.get("status")) for e in evs if e["type"] != "log"]
    ladder_done = kinds.index(("stage", "ladder", "completed"))
    assert kinds.index(("stage", "ladder", "started")) < ladder_done
    # The untrained model is measured and trained only after the decision.
    first_metric = next(i for i, k in enumerate(kinds) if k[0] == "metric")
    assert ladder_done < first_metric < kinds.index(("stage", "pretrain", "started"))
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"


def test_noise_as_custom_data_is_rejected_before_any_training_step(tmp_path: Path) -> None:
    evs, gate = _decide(tmp_path, "ladder-harmful")
    (result,) = gate["results"]
    assert not gate["passed"] and result["value"] > result["threshold"]
    assert evs[-1] == {
        **evs[-1],
        "type": "done",
        "status": "gate_failed",
        "stage": "ladder",
        "code": "ladder_rejected",
    }
    # No metric, no stage but the ladder's start, no checkpoint: nothing of the run trained.
    assert not [e for e in evs if e["type"] in ("metric", "checkpoint")]
    assert [(e["stage"], e["status"]) for e in evs if e["type"] == "stage"] == [
        ("ladder", "started")
    ]
    assert not list((tmp_path / "ckpt").glob("**/COMMIT"))


def test_a_restarted_attempt_reads_the_decision_instead_of_training_the_proxies(
    tmp_path: Path,
) -> None:
    spec = make_spec(tmp_path, "ladder-helpful")
    assert torchrun(spec).returncode == 0
    decision = json.loads(next((tmp_path / "ckpt").glob("**/ladder.json")).read_text())
    assert decision["passed"] is True
    # A fresh attempt with the decision on disk and no checkpoint yet (as if the first attempt
    # had crashed right after the decision).
    for path in (tmp_path / "ckpt").glob("**/pretrain"):
        shutil.rmtree(path)
    (tmp_path / "events.jsonl").unlink()
    assert torchrun(spec).returncode == 0
    evs = events(tmp_path)
    assert not [e for e in evs if e["type"] == "gate" and e["stage"] == "ladder"]
    assert not [e for e in evs if e["type"] == "stage" and e["stage"] == "ladder"]
    # The recorded decision let the run train on, and stays as it was written.
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"
    assert [e for e in evs if e["type"] == "metric"]
    assert json.loads(next((tmp_path / "ckpt").glob("**/ladder.json")).read_text()) == decision
