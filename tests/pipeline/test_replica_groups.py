"""A run with two replica groups (DESIGN §7.3): two torchrun worlds behind a torchft lighthouse,
launched by the worker's local executor exactly as for a leased run. One group's rank is killed
mid-run: the survivor drops it from the quorum and goes on alone, torchrun restarts the dead
group, which heals from the survivor (model, optimizer, position) and trains in lock-step again.
The run succeeds with one report per step and both groups end with identical parameters."""

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

STEPS = 100
KILL_AT = 12
PACE_S = 0.4
"""Per-step pacing, so the survivor's solo phase (about 37 s) outlasts the dead group's
detection (the lighthouse's 5 s heartbeat timeout) and restart (torchrun's monitor, then
importing torch and transformers: 15 s on a loaded 2-CPU machine)."""


def _launch(root: Path, **spec: Any) -> tuple[int, list[dict[str, Any]]]:
    path = make_spec(root, stages=["pretrain"], max_steps_per_stage=STEPS,
                     min_step_seconds=PACE_S, **spec)
    doc = json.loads(path.read_text())
    doc["manifest"]["resources"]["replica_groups"] = 2
    doc["manifest"]["curriculum"][0]["tokens"] = 2 * 4 * 128 * (STEPS + 10)
    path.write_text(json.dumps(doc))
    (root / "work").mkdir(exist_ok=True)
    executor = LocalExecutor()
    executor.start(LaunchSpec(run_id="run-test-1", attempt=1, spec_path=path,
                              workdir=root / "work", nodes=1, gpus_per_node=2, max_restarts=1,
                              replica_groups=2))
    try:
        (code,) = wait_until(lambda: (c := executor.poll()) is not None and (c,),
                             timeout=300, interval=0.5)
    finally:
        executor.kill()
    return int(code), events(root)


def test_a_killed_replica_group_is_dropped_restarted_and_healed_while_the_other_trains(
        tmp_path: Path) -> None:
    code, evs = _launch(tmp_path, fail_at={"replica": 1, "rank": 0, "step": KILL_AT})
    log = (tmp_path / "work" / "torchrun-attempt-1.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    done = [e for e in evs if e["type"] == "done"]
    assert [d["status"] for d in done] == ["succeeded"]

    metrics = [e for e in evs if e["type"] == "metric"]
    # One report per committed step, whichever group led it.
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    replicas = [m["values"]["replicas"] for m in metrics]
    # Together before the kill (the first step may be one group's alone: whichever group
    # starts first does not wait for a peer that is not heartbeating yet; the other heals).
    assert 2 in replicas[:KILL_AT - 1]
    # The killed group's step is the survivor's alone, and so are the next ones...
    assert replicas[KILL_AT - 1] == 1
    back = replicas.index(2, KILL_AT - 1)
    assert set(replicas[KILL_AT - 1:back]) == {1}
    # ...until the restarted group healed and rejoined, for good.
    assert set(replicas[back:]) == {2}
    losses = [m["values"]["loss"] for m in metrics]
    assert losses[-1] < losses[0] - 0.5

    logs = [e["message"] for e in evs if e["type"] == "log"]
    assert any(m.startswith("[replica 1] healed from a live replica group") for m in logs)
    assert [e["type"] for e in evs].count("restart") == 1
    ends = [re.search(r"^\[replica (\d)\] rank 0 parameters digest (\w+) at step (\d+)", m)
            for m in logs]
    finals = {m.group(1): (m.group(2), int(m.group(3))) for m in ends if m}
    assert set(finals) == {"0", "1"}
    assert finals["0"] == finals["1"] and finals["0"][1] == STEPS  # identical parameters
    assert committed_checkpoints(tmp_path / "ckpt")[-1].step == STEPS
