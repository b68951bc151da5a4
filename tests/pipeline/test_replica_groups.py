"""A run with two replica groups (DESIGN §7.3): two torchrun worlds behind a torchft lighthouse,
launched by the worker's local executor exactly as for a leased run. One group's rank is killed
mid-run: the survivor drops it from the quorum and goes on alone, torchrun restarts the dead
group, which heals from the survivor (model, optimizer, position) and trains in lock-step again.
The run succeeds with one report per step and both groups end with identical parameters.

What is asserted is what the protocol guarantees, not when things happen on a loaded machine:
the killed group exits before it asks for its kill step's quorum, so that step is the survivor's
alone; the restarted group is held (``fail_at.rejoin_after_steps``) until the survivor committed
``HOLD_STEPS`` more steps, so every step in between is the survivor's alone too; once healed, the
groups commit every later step together. Which group started first, and at which step a late
starter first joined, are left free."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ito.pipeline.checkpoint import committed_checkpoints
from ito.worker.executors import LaunchSpec, LocalExecutor
from tests.pipeline.test_pretrain_engine import events, make_spec
from tests.support import wait_until

pytestmark = pytest.mark.slow

STEPS = 120
KILL_AT = 12
HOLD_STEPS = 9
"""Steps past the newest commit it finds that the restarted group waits for (the spec commits
every 3 steps)."""
PACE_S = 0.4
"""Per-step pacing: after the held group is released it needs a few seconds (load the commit,
join the quorum, heal) while the survivor still has about 90 paced steps (36 s) to go. Its
restart (torchrun's monitor, importing torch) happens during the hold."""


def _launch(root: Path, **spec: Any) -> tuple[int, list[dict[str, Any]]]:
    path = make_spec(
        root, stages=["pretrain"], max_steps_per_stage=STEPS, min_step_seconds=PACE_S, **spec
    )
    doc = json.loads(path.read_text())
    doc["manifest"]["resources"]["replica_groups"] = 2
    doc["manifest"]["curriculum"][0]["tokens"] = 2 * 4 * 128 * (STEPS + 10)
    path.write_text(json.dumps(doc))
    (root / "work").mkdir(exist_ok=True)
    executor = LocalExecutor()
    executor.start(
        LaunchSpec(
            run_id="run-test-1",
            attempt=1,
            spec_path=path,
            workdir=root / "work",
            nodes=1,
            gpus_per_node=2,
            max_restarts=1,
            replica_groups=2,
        )
    )
    try:
        (code,) = wait_until(
            lambda: (c := executor.poll()) is not None and (c,), timeout=300, interval=0.5
        )
    finally:
        executor.kill()
    return int(code), events(root)


def _step_of(logs: list[str], pattern: str) -> int:
    found = [int(m.group(1)) for m in (re.search(pattern, line) for line in logs) if m]
    assert len(found) == 1, (pattern, logs)
    return found[0]


def test_a_killed_replica_group_is_dropped_restarted_and_healed_while_the_other_trains(
    tmp_path: Path,
) -> None:
    code, evs = _launch(
        tmp_path,
        fail_at={"replica": 1, "rank": 0, "step": KILL_AT, "rejoin_after_steps": HOLD_STEPS},
    )
    log = (tmp_path / "work" / "torchrun-attempt-1.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    done = [e for e in evs if e["type"] == "done"]
    assert [d["status"] for d in done] == ["succeeded"]

    metrics = [e for e in evs if e["type"] == "metric" and "loss" in e["values"]]
    # One report per committed step, whichever group led it.
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    replicas = [m["values"]["replicas"] for m in metrics]
    assert set(replicas) == {1, 2}
    logs = [e["message"] for e in evs if e["type"] == "log"]

    # The group died at the first step at or past KILL_AT that it ran, before asking for that
    # step's quorum; restarted, it was held until the survivor's commit at step `held`: from
    # the kill to that commit the survivor trained alone.
    killed = _step_of(logs, r"^\[replica 1\] fault injection: rank 0 exits at step (\d+)$")
    held = _step_of(
        logs,
        r"^\[replica 1\] fault injection: rejoining after the commit at "
        r"step (\d+)$",
    )
    assert KILL_AT <= killed < held
    assert set(replicas[killed - 1 : held]) == {1}
    # It then rejoined (healed from the survivor if it was behind, as it is unless it loaded
    # the very commit the survivor's next quorum starts from), and from the step it rejoined on
    # every step was committed by both groups. (A late starter may also have healed at the
    # start of the run.)
    back = replicas.index(2, held)
    assert set(replicas[back:]) == {2}, replicas
    heals = [
        int(m.group(1))
        for m in (
            re.search(r"^\[replica 1\] healed from a live replica group at step (\d+)", line)
            for line in logs
        )
        if m
    ]
    assert [step for step in heals if step >= held] in ([], [back]), (heals, back)
    assert [e["type"] for e in evs].count("restart") == 1
    losses = [m["values"]["loss"] for m in metrics]
    assert losses[-1] < losses[0] - 0.5

    ends = [
        re.search(r"^\[replica (\d)\] rank 0 parameters digest (\w+) at step (\d+)", m)
        for m in logs
    ]
    finals = {m.group(1): (m.group(2), int(m.group(3))) for m in ends if m}
    assert set(finals) == {"0", "1"}
    assert finals["0"] == finals["1"] and finals["0"][1] == STEPS  # identical parameters
    assert committed_checkpoints(tmp_path / "ckpt")[-1].step == STEPS
