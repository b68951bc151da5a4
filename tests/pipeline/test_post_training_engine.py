"""Post-training on the engine end to end: real ``torchrun`` with two gloo processes on the
``post`` recipe — a few pre-training steps, then SFT → DPO → RLVR — with checkpoints, resume,
gates and exports as in pre-training.

One uninterrupted run (module fixture) is the reference; crashed and resumed runs are compared
with it step by step.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ito.core.manifest import parse_manifest
from ito.pipeline.data import read_data_rows
from ito.pipeline.tokenizer import EOS
from tests.pipeline.test_pretrain_engine import (
    assert_same_losses,
    events,
    losses,
    make_spec,
    torchrun,
)

pytestmark = pytest.mark.slow

STEPS = 6
"""Steps of every stage."""
STAGES = ["pretrain", "sft", "dpo", "rlvr"]
FIRST = {stage: i * STEPS + 1 for i, stage in enumerate(STAGES)}
"""Each stage's first global step."""


def make_post_spec(root: Path, **overrides: Any) -> Path:
    return make_spec(
        root,
        recipe_name="post",
        every_steps=2,
        **({"run_id": "run-post-1", "stages": STAGES, "max_steps_per_stage": STEPS} | overrides),
    )


def edit_manifest(spec: Path, edit: Any) -> None:
    doc = json.loads(spec.read_text())
    edit(doc["manifest"])
    spec.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("post-reference")
    result = torchrun(make_post_spec(root))
    assert result.returncode == 0, result.stdout[-4000:]
    return root


def test_sft_dpo_and_rlvr_run_after_the_curriculum_with_their_own_figures(
    reference: Path,
) -> None:
    evs = events(reference)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"
    started = [(e["stage"], e["steps"]) for e in evs if e["type"] == "stage" and "steps" in e]
    assert started == [(stage, STEPS) for stage in STAGES]
    assert [e["stage"] for e in evs if e["type"] == "gate"] == STAGES
    assert [e["stage"] for e in evs if e["type"] == "export"] == STAGES

    metrics = [e for e in evs if e["type"] == "metric" and "loss" in e["values"]]
    assert [m["step"] for m in metrics] == list(range(1, len(STAGES) * STEPS + 1))
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for m in metrics:
        by_stage.setdefault(m["stage"], []).append(m["values"])
    assert all(math.isfinite(v["loss"]) for vs in by_stage.values() for v in vs)
    first_dpo = by_stage["dpo"][0]
    assert {"dpo_margin", "dpo_accuracy", "dpo_chosen_nll"} <= set(first_dpo)
    # At DPO's first step the policy is its own reference: every pair's DPO loss is
    # −log σ(0), and the recipe's RPO term adds rpo_alpha × the chosen completions' NLL.
    alpha = json.loads((reference / "spec.json").read_text())["manifest"]["post_training"]["dpo"][
        "rpo_alpha"
    ]
    assert alpha > 0 and first_dpo["dpo_chosen_nll"] > 0
    expected = math.log(2) + alpha * first_dpo["dpo_chosen_nll"]
    assert first_dpo["loss"] == pytest.approx(expected, rel=1e-5)
    assert first_dpo["dpo_margin"] == pytest.approx(0.0, abs=1e-5)
    for values in by_stage["rlvr"]:
        assert 0 < values["kept_group_fraction"] <= 1
        assert values["generation_rounds"] >= 1
        assert 1 <= values["response_length"] <= 6  # the recipe's completion budget
        assert 0 <= values["truncated_fraction"] <= 1
        assert -1 <= values["reward_mean"] <= 1
    # Post-training's peak rates are fractions of pre-training's.
    peak = max(v["lr"] for v in by_stage["pretrain"])
    assert max(v["lr"] for v in by_stage["sft"]) < peak
    assert max(v["lr"] for v in by_stage["dpo"]) < max(v["lr"] for v in by_stage["sft"])

    # Each post-training gate measured held-out exact match and web loss.
    for gate in [e for e in evs if e["type"] == "gate" and e["stage"] != "pretrain"]:
        assert [(r["eval"], r["data"]) for r in gate["results"]] == [
            ("exact_match", "arith-heldout"),
            ("heldout_loss", "web"),
        ]


def test_the_last_post_training_export_loads_in_transformers_and_generates_until_end_of_text(
    reference: Path,
) -> None:
    """``generate`` on the export, with nothing of this package, stops where the engine's
    greedy generation does (at end-of-text, not at ``LlamaConfig``'s default ids 1 and 2, which
    are ordinary tokens here) and scores the held-out sums as the RLVR gate did."""
    evs = events(reference)
    (export,) = [e for e in evs if e["type"] == "export" and e["stage"] == "rlvr"]
    (gate,) = [e for e in evs if e["type"] == "gate" and e["stage"] == "rlvr"]
    (measured,) = [r["value"] for r in gate["results"] if r["eval"] == "exact_match"]
    directory = Path(export["path"])
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    assert model.config.eos_token_id == model.generation_config.eos_token_id == eos
    assert model.config.bos_token_id is None

    spec = json.loads((reference / "spec.json").read_text())
    ref = parse_manifest(json.dumps(spec["manifest"]).encode()).data_by_id()["arith-heldout"]
    items = read_data_rows(ref, Path(spec["workdir"]))
    answers = [str(row.get("answer")) for row in items]
    max_new = max(len(tokenizer.encode(a)) for a in answers) + 1  # as the battery bounds it
    hits = 0
    with torch.no_grad():
        for row, answer in zip(items, answers, strict=True):
            prompt = tokenizer(str(row.get("prompt")), return_tensors="pt")
            out = model.generate(**prompt, do_sample=False, max_new_tokens=max_new)
            new = out[0, prompt["input_ids"].shape[1] :].tolist()
            # Generation ends at the first end-of-text or at the bound, never past one.
            assert eos not in new[:-1] and (new[-1] == eos or len(new) == max_new)
            said = str(tokenizer.decode(new[:-1] if new[-1] == eos else new))
            hits += said.strip() == answer.strip()
    assert math.isclose(hits / len(items), measured, abs_tol=1e-9)


@pytest.mark.parametrize("stage", ["sft", "dpo", "rlvr"])
def test_a_rank_killed_in_the_middle_of_a_post_training_stage_resumes_the_same_curve(
    reference: Path, tmp_path: Path, stage: str
) -> None:
    # At the stage's last step: the save two steps before it waited for the one before that,
    # so a checkpoint inside the stage is committed when the rank dies.
    fail = FIRST[stage] + STEPS - 1
    spec = make_post_spec(tmp_path, fail_at={"rank": 1, "step": fail})
    result = torchrun(spec, "--max-restarts=1")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "exitcode: 137" in result.stdout

    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"
    (at,) = [
        i
        for i, e in enumerate(evs)
        if e["type"] == "log" and e["message"].startswith("resumed from")
    ]
    assert f"/{stage}/" in evs[at]["message"]
    resumed_step = int(evs[at]["message"].rsplit("step ", 1)[1].rstrip(")"))
    assert resumed_step == max(e["step"] for e in evs[:at] if e["type"] == "checkpoint")
    after = [s for s, _ in losses(evs[at:])]
    assert after == list(range(resumed_step + 1, len(STAGES) * STEPS + 1))
    assert_same_losses(losses(evs), dict(losses(events(reference))))
    if stage == "dpo":
        # The reference scores came from the checkpoint, not from the resumed policy.
        dpo_gates = [e for e in evs if e["type"] == "gate" and e["stage"] == "dpo"]
        ref_gates = [e for e in events(reference) if e["type"] == "gate" and e["stage"] == "dpo"]
        assert dpo_gates[0]["results"] == ref_gates[0]["results"]


def test_a_post_training_gate_that_fails_ends_the_run_before_the_next_stage(
    tmp_path: Path,
) -> None:
    spec = make_post_spec(tmp_path, stages=["pretrain", "sft", "dpo"], max_steps_per_stage=2)

    def unreachable(manifest: dict[str, Any]) -> None:
        manifest["eval_batteries"]["arith-sft"][0]["min"] = 0.99

    edit_manifest(spec, unreachable)
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "gate_failed"
    assert evs[-1]["stage"] == "sft"
    (gate,) = [e for e in evs if e["type"] == "gate" and e["stage"] == "sft"]
    assert gate["passed"] is False and gate["results"][0]["passed"] is False
    assert gate["results"][0]["value"] < 0.99
    assert "dpo" not in {e.get("stage") for e in evs}


@pytest.mark.parametrize("worker", [False, True], ids=["synchronous", "rollout-worker"])
def test_rewards_that_never_vary_end_the_run_with_dynamic_sampling_exhausted(
    tmp_path: Path, worker: bool
) -> None:
    """An untrained model never answers a sum: with no length shaping every reward is 0, no
    group is informative, and after ``max_empty_steps`` such steps, none ever better, the stage
    ends with the code — through the worker's batches too. Once, cleanly: exit 0, no loss."""
    spec = make_post_spec(tmp_path, stages=["rlvr"], max_steps_per_stage=2, rollout_worker=worker)

    def flat_rewards(manifest: dict[str, Any]) -> None:
        dapo = manifest["post_training"]["rlvr"]["dapo"]
        dapo["overlong"]["soft_tokens"] = 0
        dapo["max_generation_rounds"] = 2
        dapo["max_empty_steps"] = 2

    edit_manifest(spec, flat_rewards)
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done", result.stdout[-4000:]
    assert evs[-1]["status"] == "failed" and evs[-1]["code"] == "dynamic_sampling_exhausted"
    steps = [e["values"] for e in evs if e["type"] == "metric" and "loss" in e["values"]]
    # Both steps were skipped: no loss, no gradient (the last ones' figures may not be out).
    assert all(v["loss"] is None and v["grad_norm"] == 0 for v in steps)
    assert not [e for e in evs if e["type"] == "checkpoint" and e["stage"] == "rlvr"]


def test_rlvr_on_a_task_the_policy_already_solves_ends_early_as_completed(tmp_path: Path) -> None:
    """SFT teaches one sum until the policy answers it every time; RLVR on that prompt then
    finds every group all right (nothing to learn): its steps are skipped — no optimizer step —
    and after ``max_empty_steps`` of them the stage ends early, completed, with the counts, and
    its gate decides. No failure, no restart (DESIGN §7.6)."""
    steps = 240
    spec = make_post_spec(tmp_path, stages=["sft", "rlvr"], max_steps_per_stage=steps)
    data = tmp_path / "data"
    one = [{"prompt": "2+5=", "completion": "7"}] * 64
    (data / "arith-sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in one))
    asked = [{"prompt": "2+5=", "answer": "7"}] * 64
    (data / "arith-prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in asked))

    def solved(manifest: dict[str, Any]) -> None:
        for ref in manifest["data"]:
            if ref["id"] in ("arith-sft", "arith-prompts"):
                digest = hashlib.sha256((data / f"{ref['id']}.jsonl").read_bytes()).hexdigest()
                ref["sha256"] = digest
        manifest["post_training"]["sft"]["max_tokens"] *= 80  # enough steps to learn the sum
        rlvr = manifest["post_training"]["rlvr"]
        rlvr["temperature"] = 0.2
        rlvr["dapo"]["max_empty_steps"] = 3

    edit_manifest(spec, solved)
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded", evs[-1]
    assert not [e for e in evs if e["type"] == "restart"]
    rlvr = [
        e["values"]
        for e in evs
        if e["type"] == "metric" and e["stage"] == "rlvr" and "loss" in e["values"]
    ]
    assert 3 <= len(rlvr) < STEPS + 2  # ended before its planned steps
    tail = rlvr[-3:]
    assert all(v["loss"] is None and v["informative_groups"] == 0 for v in tail)
    assert all(v["reward_mean"] == 1.0 and v["solved_fraction"] == 1.0 for v in tail)
    assert all(v["tokens_per_s"] == 0 for v in tail)  # nothing trained on
    (completed,) = [
        e
        for e in evs
        if e["type"] == "stage" and e["stage"] == "rlvr" and e["status"] == "completed"
    ]
    assert completed["steps_taken"] == len(rlvr) and completed["skipped_steps"] >= 3
    (gate,) = [e for e in evs if e["type"] == "gate" and e["stage"] == "rlvr"]
    assert gate["passed"] is True
    assert [e["stage"] for e in evs if e["type"] == "export"] == ["sft", "rlvr"]


def rlvr_metrics(root: Path) -> list[dict[str, Any]]:
    return [
        e["values"]
        for e in events(root)
        if e["type"] == "metric" and e["stage"] == "rlvr" and "loss" in e["values"]
    ]


FIGURES = ["loss", "grad_norm", "reward_mean", "kept_group_fraction", "generation_rounds"]
"""RLVR figures that a step computes from its samples and the policy (not from the clock)."""


def test_the_separate_rollout_worker_at_max_staleness_0_gives_the_synchronous_losses(
    reference: Path, tmp_path: Path
) -> None:
    # The recipe asks for max_staleness 0, for which the engine's own choice is the
    # synchronous loop (the reference); the hook forces the separate worker.
    result = torchrun(make_post_spec(tmp_path, rollout_worker=True))
    assert result.returncode == 0, result.stdout[-4000:]
    assert events(tmp_path)[-1]["status"] == events(reference)[-1]["status"]
    assert losses(events(tmp_path)) == losses(events(reference))
    ours, theirs = rlvr_metrics(tmp_path), rlvr_metrics(reference)
    assert [{k: v[k] for k in FIGURES} for v in ours] == [
        {k: v[k] for k in FIGURES} for v in theirs
    ]
    assert all(v["rollout_lag_max"] == 0 and v["rollout_dropped"] == 0 for v in ours)
    assert not (tmp_path / "work" / "rollout").exists()


def test_a_slow_trainer_with_max_staleness_1_never_consumes_a_lag_2_sample_and_counts_drops(
    tmp_path: Path,
) -> None:
    """A worker allowed to generate two steps ahead (one more than the bound: the default is
    max_staleness, which never makes a batch the gate must drop) and a trainer much slower
    than generation: some batches are two versions old when their step comes; the trainer
    drops them, counts them, and trains on the batch generated again with its weights."""
    spec = make_post_spec(
        tmp_path,
        stages=["rlvr"],
        max_steps_per_stage=4,
        min_step_seconds=6.0,
        rollout_lookahead=2,
    )

    def stale_one(manifest: dict[str, Any]) -> None:
        manifest["post_training"]["rlvr"]["max_staleness"] = 1

    edit_manifest(spec, stale_one)
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    assert events(tmp_path)[-1]["type"] == "done"
    metrics = rlvr_metrics(tmp_path)
    assert len(metrics) == 4
    for values in metrics:
        assert values["rollout_lag_max"] <= 1
        lags = {
            int(k.rsplit("_", 1)[1]): v
            for k, v in values.items()
            if k[:12] == "rollout_lag_" and k != "rollout_lag_max"
        }
        assert values["rollout_dropped"] == sum(n for lag, n in lags.items() if lag > 1)
        assert math.isfinite(values["loss"])
    assert sum(v["rollout_dropped"] for v in metrics) > 0
    assert not (tmp_path / "work" / "rollout").exists()


def test_at_max_staleness_1_the_engine_uses_the_worker_and_drops_nothing(tmp_path: Path) -> None:
    """The engine's own choice: stale samples allowed, so rollouts come from the separate
    worker, which generates at most max_staleness steps ahead: nothing is too stale."""
    spec = make_post_spec(tmp_path, stages=["rlvr"], max_steps_per_stage=4)

    def stale_one(manifest: dict[str, Any]) -> None:
        manifest["post_training"]["rlvr"]["max_staleness"] = 1

    edit_manifest(spec, stale_one)
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    metrics = rlvr_metrics(tmp_path)
    assert len(metrics) == 4
    assert all(v["rollout_lag_max"] <= 1 and v["rollout_dropped"] == 0 for v in metrics)


def test_rlvr_through_the_worker_resumed_after_a_rank_dies_continues_the_same_curve(
    reference: Path, tmp_path: Path
) -> None:
    """The restarted world starts a new worker at the resumed step (the old one, its parent
    gone, exits); at max_staleness 0 the curve is the synchronous reference's."""
    fail = FIRST["rlvr"] + STEPS - 1
    spec = make_post_spec(tmp_path, fail_at={"rank": 1, "step": fail}, rollout_worker=True)
    result = torchrun(spec, "--max-restarts=1")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "exitcode: 137" in result.stdout
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded"
    assert_same_losses(losses(evs), dict(losses(events(reference))))
    # Every RLVR step, before the crash and after the resume, took the worker's batch.
    assert all(v["rollout_lag_max"] == 0 for v in rlvr_metrics(tmp_path))
    assert not (tmp_path / "work" / "rollout").exists()


def test_a_layout_the_worker_does_not_serve_runs_rlvr_in_the_synchronous_loop_with_a_warning(
    tmp_path: Path,
) -> None:
    spec = make_post_spec(
        tmp_path,
        stages=["rlvr"],
        max_steps_per_stage=2,
        layout={"dp_shard": 1, "tp": 2},
    )

    def stale_one(manifest: dict[str, Any]) -> None:
        manifest["post_training"]["rlvr"]["max_staleness"] = 1

    edit_manifest(spec, stale_one)
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert any(e["type"] == "log" and e["level"] == "warning" for e in evs)
    metrics = rlvr_metrics(tmp_path)
    assert len(metrics) == 2
    assert not any("rollout_lag_max" in v for v in metrics)
