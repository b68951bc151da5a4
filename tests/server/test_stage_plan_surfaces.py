"""The stage plan a run stores at creation, and every surface drawing from it (DESIGN §5.9,
issue 12 point 2): ``ito plan`` and ``runs show`` list exactly its stages with the engine's
steps; ``runs show`` and ``runs watch`` show the running stage's step / total, tokens and ETA;
when the run ends only the stages that completed are done, and its final event names them.

The pipeline's side is the real worker API on loopback, driven by hand (a lease, reported
stage and metric events, the finish) — what a worker reports, without training a model."""

from __future__ import annotations

import json
import selectors
import subprocess
from typing import Any

import httpx
import pytest

from tests.support import ITO, Tenant, run_cli, wait_until

pytestmark = pytest.mark.slow

STAGES = ["data_prep", "pretrain", "midtrain", "long_context"]


class Worker:
    def __init__(self, tenant: Tenant) -> None:
        self.url = tenant.server.url
        self.key = str(
            tenant.server.desk(
                "/v1/desk/keys",
                {
                    "account_id": tenant.account_id,
                    "role": "worker",
                    "booking_id": tenant.booking_id,
                },
            )["api_key"]
        )

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = httpx.post(
            self.url + path, json=body, timeout=30, headers={"authorization": f"Bearer {self.key}"}
        ).json()
        assert answer["ok"], answer
        return dict(answer["data"] or {})

    def report(self, run_id: str, *events: dict[str, Any]) -> None:
        self.post(f"/v1/worker/runs/{run_id}/report", {"attempt": 1, "events": list(events)})

    def steps(self, run_id: str, stage: str, first: int, last: int) -> None:
        self.report(
            run_id,
            *(
                {
                    "type": "metric",
                    "stage": stage,
                    "step": step,
                    "values": {"loss": 5.0, "step_seconds": 0.5},
                }
                for step in range(first, last + 1)
            ),
        )


def _documents(text: str) -> list[dict[str, Any]]:
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        document, at = decoder.raw_decode(text, at)
        found.append(document)
    return found


def _stage(stage: str, status: str) -> dict[str, Any]:
    return {"type": "stage", "stage": stage, "status": status}


def test_the_run_carries_its_plan_and_every_surface_shows_exactly_its_stages(
    tenant: Tenant,
) -> None:
    manifest = tenant.manifest()
    planned = tenant.ito("plan", "--booking", tenant.booking_id, "--manifest", str(manifest))
    plan_stages = planned.data["stage_plan"]
    assert [s["stage"] for s in plan_stages] == STAGES
    run_id = tenant.train(manifest, "stage-plan")

    shown = tenant.ito("runs", "show", run_id).data
    stored = shown["stage_plan"]
    assert stored["exact"] and [s["name"] for s in stored["stages"]] == STAGES
    # What plan promised is what the run stored: steps as the engine counts them.
    assert [s["steps"] for s in stored["stages"]] == [s["steps"] for s in plan_stages]
    per_step = stored["sequences_per_step"]
    for stage in stored["stages"][1:]:
        assert stage["steps"] == max(1, stage["tokens"] // (per_step * stage["seq_len"]))
    assert [r["name"] for r in shown["progress"]] == STAGES
    assert {r["status"] for r in shown["progress"]} == {"pending"}
    pretrain = stored["stages"][1]
    total = pretrain["steps"]
    assert total > 5

    worker = Worker(tenant)
    leased = worker.post("/v1/worker/lease", {})
    assert leased["run_id"] == run_id
    worker.report(run_id, _stage("data_prep", "started"), _stage("data_prep", "completed"))
    worker.report(run_id, _stage("pretrain", "started"))
    worker.steps(run_id, "pretrain", 1, 5)

    shown = tenant.ito("runs", "show", run_id).data
    rows = {r["name"]: r for r in shown["progress"]}
    assert rows["data_prep"]["status"] == "done"
    row = rows["pretrain"]
    assert (row["status"], row["step"], row["steps"]) == ("running", 5, total)
    assert row["tokens"] == 5 * pretrain["tokens_per_step"]
    assert row["eta_seconds"] == pytest.approx((total - 5) * 0.5)
    # For a person: the stages of the plan, one line each, with step / total and an ETA.
    human = run_cli([ITO, "runs", "show", run_id], tenant.env(tenant.requester_key))
    assert human.rc == 0, human.stderr
    lines = [line.split() for line in human.stdout.splitlines() if line.startswith("  ")]
    assert [words[0] for words in lines] == STAGES
    pretrain_line = next(line for line in human.stdout.splitlines() if "pretrain " in line)
    assert f"step 5/{total}" in pretrain_line and "ETA" in pretrain_line

    # ``runs watch --json``: one envelope per change, each listing exactly the plan's stages.
    watch = subprocess.Popen(
        [ITO, "runs", "watch", run_id, "--interval", "0.2", "--json"],
        env=tenant.env(tenant.requester_key),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Its first envelope, before anything else is reported: pretrain at step 5 of its total.
        with selectors.DefaultSelector() as ready:
            assert watch.stdout is not None
            ready.register(watch.stdout, selectors.EVENT_READ)
            assert ready.select(timeout=30), "watch printed nothing"
        first = json.loads(watch.stdout.readline())
        running = {r["name"]: r for r in first["data"]["progress"]}["pretrain"]
        assert (running["status"], running["step"], running["steps"]) == ("running", 5, total)
        assert first["data"]["stage"] == "pretrain" and first["data"]["step"] == 5
        first_midtrain = pretrain["first_step"] + total
        worker.steps(run_id, "pretrain", 6, total)
        worker.report(run_id, _stage("pretrain", "completed"), _stage("midtrain", "started"))
        worker.steps(run_id, "midtrain", first_midtrain + 1, first_midtrain + 1)

        def midtrain_running() -> bool:
            rows = tenant.ito("runs", "show", run_id).data["progress"]
            return any(r["name"] == "midtrain" and r["step"] == 1 for r in rows)

        wait_until(midtrain_running, timeout=30)
        # The run ends (as a gate failure would end it) before midtrain completes.
        worker.post(
            f"/v1/worker/runs/{run_id}/finish",
            {"attempt": 1, "status": "gate_failed", "failure_code": "eval_gate_failed"},
        )
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
    envelopes = [first, *_documents(out)]  # one line per change, then the final envelope
    assert watch.returncode == 0, err
    assert all([r["name"] for r in e["data"]["progress"]] == STAGES for e in envelopes)
    final = envelopes[-1]["data"]
    assert final["state"] == "gate_failed"
    statuses = {r["name"]: r["status"] for r in final["progress"]}
    assert statuses == {
        "data_prep": "done",
        "pretrain": "done",
        "midtrain": "stopped",
        "long_context": "not_run",
    }
    midtrain = next(r for r in final["progress"] if r["name"] == "midtrain")
    assert (midtrain["step"], midtrain["eta_seconds"]) == (1, None)

    # The final event names what ran: the stages that completed, nothing else.
    events = tenant.ito("runs", "show", run_id).data["events"]
    last = events[-1]
    assert last["to_state"] == "gate_failed"
    assert last["data"]["stages_completed"] == ["data_prep", "pretrain"]
    assert "data_prep, pretrain" in last["message"] and "long_context" not in last["message"]


def test_a_run_created_before_plans_were_stored_still_shows_only_what_could_run(
    tenant: Tenant,
) -> None:
    """Runs created before the stage plan was stored have an estimate whose stages came from
    the manifest (post-training among them, which no engine of theirs ran): they still show,
    their plan rebuilt from those stages without the post-training ones."""
    from ito.server.store.db import Database
    from ito.server.store.tables import Run

    run_id = tenant.train(tenant.manifest(), "legacy-plan")
    db = Database(tenant.server.database_url)
    try:
        with db.write() as session:
            run = session.get(Run, run_id)
            assert run is not None
            old = {k: v for k, v in run.estimate.items() if k != "stage_plan"}
            old["stages"] = [
                *old["stages"],
                {"stage": "sft", "tokens": 4000, "seq_len": 256, "flops": 1.0, "seconds": 61.0},
            ]
            run.estimate = old
    finally:
        db.dispose()
    shown = tenant.ito("runs", "show", run_id).data
    assert shown["stage_plan"]["exact"] is False
    assert [s["name"] for s in shown["stage_plan"]["stages"]] == STAGES
    assert [r["name"] for r in shown["progress"]] == STAGES
    listed = tenant.ito("runs", "list").data["runs"]
    assert [s["name"] for s in listed[0]["stage_plan"]["stages"]] == STAGES
