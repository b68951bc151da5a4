"""The pretrain engine end to end: real ``torchrun`` with two gloo processes on the test recipe.

One uninterrupted run (module fixture) is the reference; the other runs are compared with it
step by step.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from ito.core.manifest import parse_manifest
from ito.core.provenance import provenance_digest
from ito.pipeline.batteries import MAX_EVAL_SEQUENCES
from ito.pipeline.checkpoint import COMMIT, committed_checkpoints
from ito.pipeline.data import pack, read_data_rows, split_heldout
from ito.pipeline.data_prep import PROVENANCE_FILE, prepare_data, prepared_dir
from ito.pipeline.tokenizer import TOKENIZER_FILE, tokenizer_bytes, train_tokenizer
from ito.recipes import build_recipe

pytestmark = pytest.mark.slow

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
MAX_STEPS = 8
"""Pretrain steps per run; the test recipe's long_context budget is one step."""
DEADLINE_S = 240


def make_spec(
    root: Path, *, recipe_name: str = "test", every_steps: int = 3, **overrides: Any
) -> Path:
    """``spec.json`` for the engine on ``recipe_name`` (its data written under ``root``),
    checkpointing every ``every_steps``; ``overrides`` replace top-level spec fields."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    recipe = build_recipe(recipe_name, str(data))
    for name, content in recipe.files.items():
        (data / name).write_bytes(content)
    manifest = recipe.manifest
    manifest["checkpoint"] = {"every_steps": every_steps, "keep_last": 2, "storage": "booking"}
    spec = {
        "run_id": "run-test-1",
        "attempt": 1,
        "manifest": manifest,
        "workdir": str(root / "work"),
        "checkpoint_dir": str(root / "ckpt"),
        "events_path": str(root / "events.jsonl"),
        "stages": ["pretrain", "long_context"],
        "max_steps_per_stage": MAX_STEPS,
        "fail_at": None,
        "loss_spike_at": None,
    }
    spec.update(overrides)
    path = root / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def torchrun(spec: Path, *extra: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """Run the engine under torchrun with ``nproc`` processes; kill it if it passes the
    deadline."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    cmd = [
        TORCHRUN,
        "--standalone",
        f"--nproc-per-node={nproc}",
        *extra,
        "-m",
        "ito.pipeline.run",
        "--spec",
        str(spec),
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"torchrun passed its {DEADLINE_S}s deadline:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def events(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]


def losses(evs: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """Training steps' losses (not the evals' metrics)."""
    return [
        (e["step"], e["values"]["loss"])
        for e in evs
        if e["type"] == "metric" and "loss" in e["values"]
    ]


def assert_same_losses(run: list[tuple[int, float]], reference: dict[int, float]) -> None:
    assert run, "no metric events"
    for step, loss in run:
        assert math.isclose(loss, reference[step], rel_tol=1e-5), (step, loss, reference[step])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reference")
    result = torchrun(make_spec(root))
    assert result.returncode == 0, result.stdout[-4000:]
    return root


def test_each_stage_is_exported_for_transformers_and_reproduces_its_gates_loss(
    reference: Path,
) -> None:
    """``from_pretrained`` on the export, with nothing of this package, gives the held-out
    loss the engine measured at the stage's gate (long_context's export carries its scaled
    RoPE base)."""
    evs = events(reference)
    exports = {e["stage"]: e for e in evs if e["type"] == "export"}
    gates = {e["stage"]: e for e in evs if e["type"] == "gate"}
    assert sorted(exports) == ["long_context", "pretrain"]
    spec = json.loads((reference / "spec.json").read_text())
    web = parse_manifest(json.dumps(spec["manifest"]).encode()).data_by_id()["web"]
    docs = [row.text for row in read_data_rows(web, Path(spec["workdir"]))]
    heldout = split_heldout(docs, web.role)[1]
    for stage, seq_len in (("pretrain", 128), ("long_context", 256)):
        export = exports[stage]
        directory = Path(export["path"])
        weights = (directory / "model.safetensors").read_bytes()
        assert hashlib.sha256(weights).hexdigest() == export["sha256"]
        assert export["bytes"] == sum(f.stat().st_size for f in directory.iterdir())
        model = AutoModelForCausalLM.from_pretrained(directory)
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        total = sum(len(e.ids) + 1 for e in tokenizer.encode_batch(heldout))
        sequences = pack(tokenizer, heldout, min(seq_len, total))[:MAX_EVAL_SEQUENCES]
        with torch.no_grad():
            loss = float(model(input_ids=sequences, labels=sequences).loss)
        (result,) = gates[stage]["results"]
        assert result["eval"] == "heldout_loss"
        assert math.isclose(loss, result["value"], rel_tol=1e-4), (stage, loss, result["value"])


def test_uninterrupted_run_lowers_the_loss_and_writes_well_formed_events(reference: Path) -> None:
    evs = events(reference)
    assert all(isinstance(e["ts"], float) for e in evs)
    assert [e["type"] for e in evs if e["type"] not in ("metric", "log", "checkpoint")] == [
        "mesh",
        "stage",
        "export",
        "gate",
        "stage",
        "stage",
        "export",
        "gate",
        "stage",
        "done",
    ]
    (mesh,) = [e for e in evs if e["type"] == "mesh"]
    assert mesh["dims"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1}
    assert mesh["planned"] is False and mesh["micro_batch"] == 4
    stages = [(e["stage"], e["status"]) for e in evs if e["type"] == "stage"]
    assert stages == [
        ("pretrain", "started"),
        ("pretrain", "completed"),
        ("long_context", "started"),
        ("long_context", "completed"),
    ]
    assert evs[-1]["status"] == "succeeded"

    # The evals' values: the untrained model's at step 0, then at each stage's gate.
    evals = [
        (e["stage"], e["step"], set(e["values"]))
        for e in evs
        if "loss" not in e.get("values", {"loss": 0})
    ]
    assert evals == [
        ("pretrain", 0, {"eval/heldout_loss/web"}),
        ("pretrain", MAX_STEPS, {"eval/heldout_loss/web"}),
        ("long_context", MAX_STEPS + 1, {"eval/heldout_loss/web"}),
    ]
    metrics = [e for e in evs if e["type"] == "metric" and "loss" in e["values"]]
    assert [m["step"] for m in metrics] == list(range(1, MAX_STEPS + 2))
    assert [m["stage"] for m in metrics] == ["pretrain"] * MAX_STEPS + ["long_context"]
    for m in metrics:
        assert set(m["values"]) == {
            "loss",
            "lr",
            "grad_norm",
            "tokens_per_s",
            "mfu",
            "step_seconds",
            "tokens",
        }
        assert m["values"]["mfu"] is None  # no known peak on CPU
        assert m["values"]["tokens_per_s"] > 0 and m["values"]["grad_norm"] > 0
    loss = [m["values"]["loss"] for m in metrics]
    assert loss[MAX_STEPS - 1] < loss[0] - 0.5

    gates = [e for e in evs if e["type"] == "gate"]
    for gate in gates:
        assert gate["battery"] == "core" and gate["passed"] is True
        (result,) = gate["results"]
        assert result["eval"] == "heldout_loss" and result["data"] == "web"
        # The test recipe's gate: held-out loss at most 0.95 × the untrained model's.
        assert result["threshold"] == pytest.approx(0.95 * result["initial"])
        assert result["value"] < result["threshold"] and result["passed"]

    ckpts = [e for e in evs if e["type"] == "checkpoint"]
    assert [(c["stage"], c["step"]) for c in ckpts] == [
        ("pretrain", 3),
        ("pretrain", 6),
        ("pretrain", 8),
        ("long_context", 9),
    ]
    for c in ckpts:
        assert c["bytes"] > 0 and c["seconds"] > 0
        assert c["path"].endswith(f"{c['stage']}/step_{c['step']:08d}")


def test_keep_last_leaves_only_the_newest_committed_checkpoints(reference: Path) -> None:
    kept = committed_checkpoints(reference / "ckpt")
    assert [(c.stage, c.step) for c in kept] == [("pretrain", 8), ("long_context", 9)]
    assert not (reference / "ckpt" / "pretrain" / "step_00000003").exists()
    assert not (reference / "ckpt" / "pretrain" / "step_00000006").exists()
    commit = json.loads((kept[-1].path / COMMIT).read_text())
    assert commit["step"] == 9 and commit["stage"] == "long_context"
    assert commit["tokens_seen"] == 2 * 4 * (128 * MAX_STEPS + 256)
    assert commit["bytes"] > 0 and commit["seconds"] > 0


def test_killed_rank_resumes_from_the_last_commit_with_the_same_losses(
    reference: Path, tmp_path: Path
) -> None:
    spec = make_spec(tmp_path, fail_at={"rank": 1, "step": 7})
    result = torchrun(spec, "--max-restarts=1")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "exitcode: 137" in result.stdout  # torchrun saw the injected fault

    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"
    (at,) = [
        i
        for i, e in enumerate(evs)
        if e["type"] == "log" and e["message"].startswith("resumed from")
    ]
    resumed_step = int(evs[at]["message"].rsplit("step ", 1)[1].rstrip(")"))
    committed_before = [e["step"] for e in evs[:at] if e["type"] == "checkpoint"]
    assert resumed_step == max(committed_before)

    steps = [s for s, _ in losses(evs)]
    assert steps.count(resumed_step + 1) == 2, "the steps after the commit ran twice"
    assert steps[-1] == MAX_STEPS + 1
    assert_same_losses(losses(evs), dict(losses(events(reference))))
    # The step-0 value was measured once, before step 1, and the resumed attempt read it
    # from the checkpoint's trainer state: the gates compare with the same one.
    metric_steps = [e["step"] for e in evs if e["type"] == "metric"]
    assert metric_steps.count(0) == 1 and metric_steps[0] == 0
    gates = [e for e in evs if e["type"] == "gate"]
    (initial,) = [e["values"]["eval/heldout_loss/web"] for e in evs if e.get("step") == 0]
    # (long_context's is of its own sequence length, measured at step 0 too.)
    assert [g["stage"] for g in gates] == ["pretrain", "long_context"]
    assert gates[0]["results"][0]["initial"] == initial
    assert gates[1]["results"][0]["initial"] > 0


def test_half_written_checkpoint_is_ignored_on_resume(reference: Path, tmp_path: Path) -> None:
    # A later attempt of the reference run: the checkpoints it may resume from are those the
    # server recorded (its checkpoint events), as the worker passes them.
    recorded = [e["sha256"] for e in events(reference) if e["type"] == "checkpoint"]
    spec = make_spec(tmp_path, recorded_checkpoints=recorded)
    shutil.copytree(reference / "ckpt", tmp_path / "ckpt")
    # Back to the end of pretrain, plus two step directories a killed save could leave behind.
    shutil.rmtree(tmp_path / "ckpt" / "long_context" / "step_00000009")
    for stage, step in (("long_context", 9), ("pretrain", 50)):
        junk = tmp_path / "ckpt" / stage / f"step_{step:08d}"
        junk.mkdir(parents=True)
        (junk / ".metadata").write_bytes(b"half-written")
        (junk / "__0_0.distcp").write_bytes(b"\0" * 100)

    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"
    logs = [e["message"] for e in evs if e["type"] == "log"]
    assert any(m.startswith("resumed from") and m.endswith("(step 8)") for m in logs)
    assert sum("ignored uncommitted checkpoint" in m for m in logs) == 2
    assert [s for s, _ in losses(evs)] == [MAX_STEPS + 1]
    assert_same_losses(losses(evs), dict(losses(events(reference))))
    assert not (tmp_path / "ckpt" / "pretrain" / "step_00000050").exists()
    assert [e["stage"] for e in evs if e["type"] == "gate"] == ["pretrain", "long_context"]


def test_failed_gate_ends_the_run_gate_failed_with_exit_status_zero(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, stages=["pretrain"], max_steps_per_stage=1)
    doc = json.loads(spec.read_text())
    doc["manifest"]["eval_batteries"]["core"][0] = {
        "eval": "heldout_loss",
        "data": "web",
        "max": 0.01,
    }
    spec.write_text(json.dumps(doc))

    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    (gate,) = [e for e in evs if e["type"] == "gate"]
    assert gate["passed"] is False and gate["results"][0]["passed"] is False
    assert gate["results"][0]["threshold"] == 0.01 and gate["results"][0]["value"] > 0.01
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "gate_failed"
    assert ("pretrain", "completed") not in [
        (e["stage"], e["status"]) for e in evs if e["type"] == "stage"
    ]


def test_a_stop_request_commits_a_checkpoint_and_a_later_attempt_resumes_it_exactly(
    reference: Path, tmp_path: Path
) -> None:
    # The worker's stop file is there before the first step: rank 0 raises the flag in step 1's
    # all-reduce, every rank reads it while step 2 computes, and step 2 is committed.
    spec = make_spec(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "stop-1").write_text("budget\n")
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "stopped"
    assert evs[-1]["step"] == 2
    assert [(e["stage"], e["step"]) for e in evs if e["type"] == "checkpoint"] == [("pretrain", 2)]
    assert [c.step for c in committed_checkpoints(tmp_path / "ckpt")] == [2]
    assert [s for s, _ in losses(evs)] == [1, 2]  # a committed step's metrics are out
    assert not [e for e in evs if e["type"] == "gate"]

    # Attempt 2 has its own stop file (none): it resumes after step 2 and matches the reference.
    doc = json.loads(spec.read_text())
    doc["attempt"] = 2
    spec.write_text(json.dumps(doc))
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"
    assert [s for s, _ in losses(evs)] == list(range(1, MAX_STEPS + 2))
    assert_same_losses(losses(evs), dict(losses(events(reference))))


@pytest.mark.parametrize(
    ("steps", "ratio", "status"), [(1, 0.6, "gate_failed"), (8, 0.95, "succeeded")]
)
def test_a_gate_relative_to_step_0_fails_a_budget_too_small_to_learn_and_passes_one_that_learns(
    tmp_path: Path, steps: int, ratio: float, status: str
) -> None:
    spec = make_spec(tmp_path, stages=["pretrain"], max_steps_per_stage=steps)
    doc = json.loads(spec.read_text())
    doc["manifest"]["eval_batteries"]["core"] = [
        {"eval": "heldout_loss", "data": "web", "max_ratio": ratio}
    ]
    spec.write_text(json.dumps(doc))

    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    step0 = [e for e in evs if e["type"] == "metric" and e["step"] == 0]
    (initial,) = [e["values"]["eval/heldout_loss/web"] for e in step0]
    (gate,) = [e for e in evs if e["type"] == "gate"]
    (res,) = gate["results"]
    assert res["initial"] == initial and math.isclose(res["threshold"], ratio * initial)
    assert res["rule"] == f"heldout_loss(web) ≤ {ratio:g} × step 0"
    assert res["passed"] is (status == "succeeded") and evs[-1]["status"] == status


def test_the_engine_tokenizes_with_the_prepared_tokenizer_and_refuses_one_swapped_after(
    tmp_path: Path,
) -> None:
    spec = make_spec(tmp_path, stages=["pretrain"], max_steps_per_stage=1)
    doc = json.loads(spec.read_text())
    # The manifest names a tokenizer (trained on other text than the run's); data preparation
    # copies it beside the shards and the report bound to the run lists its digest.
    named = tmp_path / "data" / "named-tokenizer.json"
    texts = [json.loads(line)["text"] for line in (tmp_path / "data" / "arith-mid.jsonl").open()]
    named.write_bytes(tokenizer_bytes(train_tokenizer(texts, 400)))
    digest = hashlib.sha256(named.read_bytes()).hexdigest()
    doc["manifest"]["model"]["tokenizer"] = {"uri": f"file://{named}", "sha256": digest}
    workdir = tmp_path / "work"
    report = prepare_data(parse_manifest(json.dumps(doc["manifest"]).encode()), workdir)
    assert (report.tokenizer.source, report.tokenizer.sha256) == ("manifest", digest)
    doc["provenance_sha256"] = provenance_digest(
        (prepared_dir(workdir) / PROVENANCE_FILE).read_bytes()
    )
    spec.write_text(json.dumps(doc))
    prepared = prepared_dir(workdir) / TOKENIZER_FILE

    # Swapped after preparation (another valid tokenizer): refused before any step.
    prepared.write_bytes(tokenizer_bytes(train_tokenizer(["something else entirely"] * 50, 300)))
    result = torchrun(spec, nproc=1)
    assert result.returncode == 0  # a coded refusal ends the run once, cleanly: no restart
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "failed"
    assert evs[-1]["code"] == "provenance_mismatch"
    assert not losses(evs)
    assert not committed_checkpoints(tmp_path / "ckpt")

    # The prepared file back: the run trains with it, and trains no tokenizer of its own.
    prepared.write_bytes(named.read_bytes())
    (tmp_path / "events.jsonl").unlink()
    result = torchrun(spec, nproc=1)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert losses(evs) and evs[-1]["status"] in ("succeeded", "gate_failed")
    assert not (tmp_path / "ckpt" / TOKENIZER_FILE).exists()
