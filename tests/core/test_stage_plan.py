"""The stage plan (``ito.core.stage_plan``): exactly the stages a run executes, with the steps
the engine takes on the planned layout, and each stage's progress from what the run reported;
and the human figures the pages and the client print (``ito.core.human_format``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ito.core.human_format import duration, expires_in, token_count, usd, utc_instant
from ito.core.manifest import Manifest, parse_manifest
from ito.core.pricing import estimate_cost
from ito.core.run_plan import SEQUENCES_PER_RANK, layout_spec, plan_run_parallelism
from ito.core.stage_plan import (
    STAGE_OVERHEAD_SECONDS,
    UNCALIBRATED_SLOWDOWN,
    StagePlan,
    build_stage_plan,
    legacy_stage_plan,
    rlvr_factor,
    sequences_per_step,
    stage_progress,
    stored_stage_plan,
)
from ito.recipes import build_recipe
from tests.core.conftest import with_post_training


def _manifest(**edits: Any) -> Manifest:
    document = json.loads(json.dumps(build_recipe("test", "/data").manifest))
    document |= edits
    return parse_manifest(json.dumps(document).encode())


def _plan(manifest: Manifest | None = None, per_step: int = 8, dp: int = 2) -> StagePlan:
    return build_stage_plan(
        manifest or _manifest(),
        throughput_flops=1e12,
        sequences_per_step=per_step,
        data_parallel=dp,
    )


def test_the_plan_lists_data_prep_then_the_curriculum_with_the_engine_s_steps() -> None:
    manifest = _manifest()
    plan = _plan(manifest, per_step=8)
    assert plan.names == ["data_prep"] + [s.stage for s in manifest.curriculum]
    assert [s.kind for s in plan.stages] == ["data_prep"] + ["curriculum"] * 3
    first = 0
    for stage, config in zip(plan.stages[1:], manifest.curriculum, strict=True):
        # ito.pipeline.train.Trainer._plans: max(1, tokens // (sequences × seq_len)).
        assert stage.steps == max(1, config.tokens // (8 * config.seq_len))
        assert stage.first_step == first
        assert stage.tokens_per_step == 8 * config.seq_len
        assert (stage.tokens, stage.seq_len, stage.battery) == (
            config.tokens,
            config.seq_len,
            config.battery,
        )
        first += stage.steps
    assert plan.stages[0].steps is None and plan.stages[0].seconds > 0


def test_a_stage_smaller_than_one_step_still_takes_one() -> None:
    plan = _plan(per_step=10_000)
    assert all(s.steps == 1 for s in plan.stages if s.kind == "curriculum")


def test_the_estimate_prices_exactly_the_plan_and_stores_it() -> None:
    estimate = estimate_cost(
        _manifest(), accelerator="cpu", nodes=1, gpus_per_node=2, rate_usd_per_gpu_hour=1.0
    )
    plan = estimate.stage_plan
    assert plan.sequences_per_step == SEQUENCES_PER_RANK * 2
    assert estimate.seconds == pytest.approx(plan.seconds, abs=1e-3)
    stored = estimate.to_dict()
    assert [s["stage"] for s in stored["stages"]] == plan.names
    assert stored_stage_plan(stored) == plan


@pytest.mark.parametrize(
    ("gpu", "nodes", "per_node", "fabric"),
    [("cpu", 1, 2, "ethernet"), ("h100", 1, 8, "nvlink"), ("h100", 2, 8, "infiniband")],
)
def test_steps_per_stage_follow_the_layout_the_engine_builds(
    gpu: str, nodes: int, per_node: int, fabric: str
) -> None:
    from ito.pipeline.layout import EngineLayout

    manifest = _manifest()
    if gpu != "cpu":
        document = json.loads(json.dumps(build_recipe("test", "/data").manifest))
        document["model"]["size"] = "150m"
        document["resources"] |= {"accelerators": [gpu], "nodes": nodes, "gpus_per_node": 8}
        manifest = parse_manifest(json.dumps(document).encode())
    run_plan = plan_run_parallelism(
        manifest, gpu=gpu, nodes=nodes, gpus_per_node=per_node, fabric=fabric
    )
    world = nodes * per_node
    spec = run_plan.layout if run_plan.layout is not None else None
    engine = EngineLayout.from_spec(spec, world)
    expected = engine.sequences_per_rank * engine.dp
    assert sequences_per_step(run_plan.plan, world) == expected
    if spec is None:
        assert expected == SEQUENCES_PER_RANK * world
    else:
        assert layout_spec(run_plan.plan) == spec


def test_post_training_stages_come_after_the_curriculum_through_the_same_function() -> None:
    document = json.loads(json.dumps(build_recipe("test", "/data").manifest))
    manifest = parse_manifest(json.dumps(with_post_training(document)).encode())
    plan = _plan(manifest)
    assert plan.names[-3:] == ["sft", "dpo", "rlvr"]
    assert {s.kind for s in plan.stages[-3:]} == {"post_training"}
    assert plan.stages[-3].first_step == sum(s.steps or 0 for s in plan.stages[:-3])
    assert [s.battery for s in plan.stages[-3:]] == ["arith"] * 3


def test_post_training_steps_are_the_rows_the_engine_trains_on_at_each_stage_s_length() -> None:
    # The post recipe: SFT at seq_len 32, DPO and RLVR at 16, RLVR in groups of 8; 4 sequences
    # per rank on 2 data-parallel ranks (the engine's default on 2 CPU processes).
    manifest = parse_manifest(json.dumps(build_recipe("post", "/data").manifest).encode())
    sft, dpo, rlvr = _plan(manifest, per_step=8, dp=2).stages[-3:]
    assert (sft.seq_len, sft.tokens_per_step, sft.steps) == (32, 8 * 32, 2048 // (8 * 32))
    # DPO: a chosen and a rejected row per pair, two pairs per rank.
    assert (dpo.tokens_per_step, dpo.steps) == (8 * 16, 2048 // (8 * 16))
    # RLVR: whole groups, so one group of 8 samples per rank although the layout has 4 slots.
    assert (rlvr.tokens_per_step, rlvr.steps) == (16 * 16, 2048 // (16 * 16))
    assert rlvr.first_step == dpo.first_step + (dpo.steps or 0)


def test_a_run_stored_before_plans_shows_its_estimate_stages_without_unrun_post_training() -> None:
    estimate = {
        "stages": [
            {"stage": "data_prep", "tokens": 0, "seq_len": 0, "flops": 0.0, "seconds": 60.0},
            {"stage": "pretrain", "tokens": 10, "seq_len": 8, "flops": 1.0, "seconds": 61.0},
            {"stage": "sft", "tokens": 10, "seq_len": 8, "flops": 1.0, "seconds": 61.0},
            {"stage": "rlvr", "tokens": 10, "seq_len": 8, "flops": 1.0, "seconds": 61.0},
        ]
    }
    plan = stored_stage_plan(estimate)
    assert plan == legacy_stage_plan(estimate)
    assert plan.names == ["data_prep", "pretrain"] and not plan.exact
    assert stored_stage_plan(None).stages == []


def _progress(plan: StagePlan, **facts: Any) -> dict[str, dict[str, Any]]:
    base: dict[str, Any] = {
        "terminal": False,
        "started": (),
        "completed": (),
        "last_step": {},
        "step_seconds": None,
    }
    rows = stage_progress(plan, **(base | facts))
    assert [r.name for r in rows] == plan.names  # never a stage outside the plan
    return {r.name: r.model_dump() for r in rows}


def test_progress_counts_steps_inside_the_running_stage() -> None:
    plan = _plan(per_step=8)
    pretrain, midtrain = plan.stage("pretrain"), plan.stage("midtrain")
    assert pretrain is not None and midtrain is not None and pretrain.steps is not None
    rows = _progress(
        plan,
        started={"data_prep", "pretrain"},
        completed={"data_prep"},
        last_step={"pretrain": 7},
        step_seconds=0.5,
    )
    assert rows["data_prep"]["status"] == "done"
    row = rows["pretrain"]
    assert (row["status"], row["step"], row["steps"]) == ("running", 7, pretrain.steps)
    assert row["tokens"] == 7 * pretrain.tokens_per_step
    assert row["eta_seconds"] == pytest.approx((pretrain.steps - 7) * 0.5)
    assert rows["midtrain"]["status"] == "pending" and rows["midtrain"]["step"] == 0
    # The next stage's steps count from its own first step (metrics carry the global step).
    later = _progress(
        plan,
        started={"data_prep", "pretrain", "midtrain"},
        completed={"data_prep", "pretrain"},
        last_step={"pretrain": pretrain.steps, "midtrain": midtrain.first_step + 2},
    )
    assert later["pretrain"]["status"] == "done"
    assert (later["midtrain"]["status"], later["midtrain"]["step"]) == ("running", 2)
    assert later["midtrain"]["eta_seconds"] is not None  # from the estimate before any pace


def test_an_ended_run_marks_done_only_what_completed() -> None:
    plan = _plan()
    rows = _progress(
        plan,
        terminal=True,
        started={"data_prep", "pretrain"},
        completed={"data_prep"},
        last_step={"pretrain": 3},
    )
    assert rows["data_prep"]["status"] == "done"
    assert rows["pretrain"]["status"] == "stopped" and rows["pretrain"]["step"] == 3
    assert {rows[n]["status"] for n in ("midtrain", "long_context")} == {"not_run"}
    assert all(r["eta_seconds"] is None for r in rows.values())


def test_human_figures() -> None:
    assert [duration(s) for s in (0, 44.2, 60, 220, 440.536, 3600, 3660, 90_000)] == [
        "0 s",
        "45 s",
        "1 min",
        "3 min 40 s",
        "7 min 21 s",
        "1 h",
        "1 h 01 min",
        "1 d 1 h",
    ]
    assert (usd(1.234), usd(5), usd(0.0042), usd(1234.5)) == (
        "$1.23",
        "$5.00",
        "$0.0042",
        "$1,234.50",
    )
    assert (token_count(950), token_count(12_300), token_count(1_200_000)) == (
        "950",
        "12.3k",
        "1.2M",
    )
    moment = datetime(2026, 12, 4, 20, 14, 5, 123456, tzinfo=UTC)
    assert utc_instant(moment) == "2026-12-04 20:14:05 UTC"
    assert expires_in(moment + timedelta(minutes=14, seconds=59), moment) == "expires in 14 min"
    assert expires_in(moment + timedelta(seconds=30), moment) == "expires in 30 s"
    assert expires_in(moment - timedelta(minutes=2), moment) == "expired 2 min ago"


def _demo(**dapo: Any) -> Manifest:
    document = json.loads(json.dumps(build_recipe("demo", "/data").manifest))
    document["post_training"]["rlvr"]["dapo"] |= dapo
    return parse_manifest(json.dumps(document).encode())


def test_every_stage_has_an_upper_bound_of_its_uncalibrated_throughput() -> None:
    plan = _plan(_demo())
    for stage in plan.stages:
        if stage.name != "rlvr":
            assert stage.upper == pytest.approx(stage.seconds * UNCALIBRATED_SLOWDOWN)
    assert plan.upper_seconds == pytest.approx(sum(s.upper for s in plan.stages))
    assert plan.upper_seconds > plan.seconds


def test_rlvr_is_priced_at_its_expected_rounds_and_bounded_by_its_most() -> None:
    few = _plan(_demo(expected_generation_rounds=1, max_generation_rounds=8)).stage("rlvr")
    many = _plan(_demo(expected_generation_rounds=6, max_generation_rounds=8)).stage("rlvr")
    more = _plan(_demo(expected_generation_rounds=6, max_generation_rounds=32)).stage("rlvr")
    assert few is not None and many is not None and more is not None
    assert few.seconds < many.seconds == more.seconds  # the expectation prices the rounds
    assert few.upper == many.upper < more.upper  # the upper bound takes the most rounds
    compute = (many.flops / (rlvr_factor(6))) * rlvr_factor(8)
    assert many.upper == pytest.approx(
        (compute / 1e12 + STAGE_OVERHEAD_SECONDS) * UNCALIBRATED_SLOWDOWN
    )


def test_expected_rounds_above_the_most_allowed_are_refused_at_their_path() -> None:
    from ito.core.errors import ItoError

    with pytest.raises(ItoError) as refused:
        _demo(expected_generation_rounds=9, max_generation_rounds=8)
    assert refused.value.code == "manifest_invalid"
    assert "$.post_training.rlvr.dapo.expected_generation_rounds" in json.dumps(
        refused.value.details
    )


def test_the_estimate_carries_the_upper_cost_beside_the_expected_one() -> None:
    estimate = estimate_cost(
        _demo(), accelerator="cpu", nodes=1, gpus_per_node=2, rate_usd_per_gpu_hour=0.5
    )
    assert estimate.upper_seconds == pytest.approx(estimate.stage_plan.upper_seconds, abs=1e-3)
    assert estimate.upper_cost_usd == pytest.approx(
        estimate.upper_seconds / 3600 * 2 * 0.5, rel=1e-6
    )
    assert estimate.upper_cost_usd > estimate.cost_usd
    assert estimate.to_dict()["upper_cost_usd"] == estimate.upper_cost_usd


def test_a_stage_that_ended_early_is_done_at_the_steps_it_took() -> None:
    plan = _plan(per_step=8)
    pretrain = plan.stage("pretrain")
    assert pretrain is not None and pretrain.steps is not None and pretrain.steps > 3
    rows = _progress(
        plan,
        started={"data_prep", "pretrain"},
        completed={"data_prep", "pretrain"},
        last_step={"pretrain": 3},
        taken={"pretrain": 3},
    )
    row = rows["pretrain"]
    assert (row["status"], row["step"], row["steps"]) == ("done", 3, pretrain.steps)
    assert row["tokens"] == 3 * pretrain.tokens_per_step
    whole = _progress(plan, started={"pretrain"}, completed={"data_prep", "pretrain"})
    assert whole["pretrain"]["step"] == pretrain.steps  # no record: it took its plan
