"""The run page's stage timeline and progress (``ito.server.web.dashboard``), from a run's
record and events as the services return them: a stage is done only when its ``completed``
event says so — never because the run succeeded — and a gate's verdict is its records'."""

from __future__ import annotations

from typing import Any

from ito.server.web.dashboard import progress_of, timeline_of

PLAN = [
    {"stage": "data_prep", "tokens": 0},
    {"stage": "pretrain", "tokens": 20000},
    {"stage": "midtrain", "tokens": 4000},
]


def _run(state: str, stage: str | None) -> dict[str, Any]:
    return {"state": state, "stage": stage, "estimate": {"stages": PLAN}}


def _stage(stage: str, status: str, at: str) -> dict[str, Any]:
    return {
        "kind": "stage",
        "data": {"stage": stage, "status": status},
        "at": at,
        "to_state": None,
    }


def _gate(stage: str, passed: bool) -> dict[str, Any]:
    return {"stage": stage, "eval": "heldout_loss", "data": "web", "passed": passed}


EVENTS = [
    _stage("data_prep", "started", "t0"),
    _stage("data_prep", "completed", "t1"),
    _stage("pretrain", "started", "t2"),
]


def test_a_running_stage_is_running_and_the_stages_after_it_are_planned() -> None:
    timeline = timeline_of(_run("running", "pretrain"), EVENTS, [], {"pretrain": [1, 2, 3]})
    assert [(t["stage"], t["status"]) for t in timeline] == [
        ("data_prep", "completed"),
        ("pretrain", "running"),
        ("midtrain", "planned"),
    ]
    assert timeline[1]["steps"] == (1, 3) and timeline[1]["planned_tokens"] == 20000
    assert timeline[1]["started_at"] == "t2" and timeline[1]["completed_at"] is None


def test_a_stage_cut_short_by_the_end_of_the_run_is_stopped_and_the_rest_not_run() -> None:
    timeline = timeline_of(_run("gate_failed", "pretrain"), EVENTS, [_gate("pretrain", False)], {})
    assert [t["status"] for t in timeline] == ["completed", "stopped", "not run"]
    assert [t["verdict"] for t in timeline] == [None, "failed", None]


def test_a_stage_passes_its_gate_only_when_every_record_passed() -> None:
    gates = [_gate("pretrain", True), _gate("pretrain", False), _gate("midtrain", True)]
    timeline = timeline_of(_run("running", "midtrain"), EVENTS, gates, {})
    verdicts = {t["stage"]: t["verdict"] for t in timeline}
    assert verdicts == {"data_prep": None, "pretrain": "failed", "midtrain": "passed"}
    assert [len(t["gates"]) for t in timeline] == [0, 2, 1]


def test_progress_counts_the_stages_completed_not_the_runs_state() -> None:
    assert progress_of(_run("succeeded", "midtrain"), completed=2) == {
        "completed": 2,
        "total": 3,
        "percent": 67,
    }
    # The runs list has no events: the stages before the current one, or all for a success.
    assert progress_of(_run("running", "midtrain"))["completed"] == 2
    assert progress_of(_run("succeeded", "midtrain"))["completed"] == 3
    assert progress_of({"state": "queued", "stage": None, "estimate": {}})["percent"] == 0
