"""Per-step fault tolerance with torchft: two replica groups on gloo behind a real lighthouse.

Replica 1 SIGKILLs itself mid-step (after backward, before the gradient allreduce). Replica 0
discards that step, forms a quorum alone once the lighthouse stops hearing replica 1, and keeps
committing. A restarted replica 1 heals from replica 0 (model and optimizer over torchft's HTTP
checkpoint transport) and the two train in lock-step again. torchft's guarantee, asserted here:
after every committed step all participants hold bit-identical parameters and the same averaged
loss.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ito.pipeline.lighthouse import Lighthouse

pytestmark = pytest.mark.slow

STEPS = 300
KILL_AT = 10
PACE_S = 0.1
"""Per-step pacing: the survivor's solo phase (about ``STEPS × PACE_S``) must outlast the
restarted replica's start-up, which is mostly importing torch and transformers."""
DEADLINE_S = 150.0
ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the replica trainer is ``tests.pipeline.ft_replica``, run from there."""


def spawn(lighthouse: Lighthouse, replica: int, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "tests.pipeline.ft_replica",
        "--replica-id",
        str(replica),
        "--lighthouse",
        lighthouse.address,
        "--steps",
        str(STEPS),
        "--out",
        str(out),
        "--min-step-seconds",
        str(PACE_S),
        "--log-level",
        "INFO",
        *extra,
    ]
    with out.with_suffix(".stderr").open("wb") as err:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        return subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path},
        )


def read(path: Path, type_: str = "step") -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # a line still being written is left out
    return [e for e in map(json.loads, lines) if e["type"] == type_]


def committed(path: Path) -> dict[int, dict[str, Any]]:
    steps = [r for r in read(path) if r["committed"]]
    by_step = {r["step"]: r for r in steps}
    assert len(by_step) == len(steps), f"{path.name}: a step was committed twice"
    return by_step


def stderr_tail(out: Path) -> str:
    return out.with_suffix(".stderr").read_text(errors="replace")[-3000:]


def wait_for(what: str, ready: Callable[[], bool], deadline: float, out: Path) -> None:
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; {out.name} stderr:\n{stderr_tail(out)}")
        time.sleep(0.05)


def finish(proc: subprocess.Popen[bytes], deadline: float, out: Path) -> int:
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{out.name} still running at the deadline:\n{stderr_tail(out)}")


def test_survivor_commits_alone_after_a_kill_and_the_restarted_replica_heals_from_it(
    tmp_path: Path,
) -> None:
    r0, r1, r1_again = tmp_path / "r0.jsonl", tmp_path / "r1.jsonl", tmp_path / "r1-again.jsonl"
    deadline = time.monotonic() + DEADLINE_S
    procs: list[subprocess.Popen[bytes]] = []
    with Lighthouse.start(tmp_path / "lighthouse.log") as lighthouse:
        try:
            procs.append(spawn(lighthouse, 0, r0))
            procs.append(spawn(lighthouse, 1, r1, "--kill-at", str(KILL_AT)))
            assert finish(procs[1], deadline, r1) == -signal.SIGKILL, stderr_tail(r1)
            wait_for(
                "the survivor's first step alone",
                lambda: any(
                    r["participants"] == 1 and r["step"] >= KILL_AT for r in committed(r0).values()
                ),
                deadline,
                r0,
            )
            procs.append(spawn(lighthouse, 1, r1_again))
            assert finish(procs[0], deadline, r0) == 0, stderr_tail(r0)
            assert finish(procs[2], deadline, r1_again) == 0, stderr_tail(r1_again)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    survivor, victim, rejoined = committed(r0), committed(r1), committed(r1_again)

    # Before the kill both replicas were in the quorum and identical after every step.
    assert max(victim) == KILL_AT - 1, "replica 1 should die inside step KILL_AT"
    assert victim[KILL_AT - 1]["participants"] == 2, "replica 1 joined after its --kill-at"
    for step, record in victim.items():
        if record["participants"] == 2:
            assert record["params"] == survivor[step]["params"], step
            assert record["mean_loss"] == survivor[step]["mean_loss"], step

    # The step replica 1 died in was discarded by the survivor, then retried and committed alone.
    discarded = [r for r in read(r0) if not r["committed"]]
    assert discarded, "the survivor should discard the step its peer died in"
    assert {r["step"] for r in discarded} == {KILL_AT}
    assert survivor[KILL_AT]["participants"] == 1

    # The survivor reached its target: every step 1..STEPS committed exactly once.
    assert sorted(survivor) == list(range(1, STEPS + 1))
    assert read(r0, "finished")[0]["step"] == STEPS

    # The restarted replica recovered the survivor's state instead of starting over ...
    recovered = read(r1_again, "recovered")
    assert len(recovered) == 1, "the restarted replica should heal exactly once"
    caught_up = recovered[0]["step"]
    assert KILL_AT <= caught_up < STEPS
    assert not [r for r in read(r1_again) if not r["committed"]]
    assert sorted(rejoined) == list(range(caught_up + 1, STEPS + 1))
    # ... the survivor trained alone until then and with two participants from then on ...
    for step in range(KILL_AT, STEPS + 1):
        assert survivor[step]["participants"] == (1 if step <= caught_up else 2), step
    # ... and after every step since, both replicas hold the same parameters and mean loss.
    for step, record in rejoined.items():
        assert record["participants"] == 2, step
        assert record["params"] == survivor[step]["params"], step
        assert record["mean_loss"] == survivor[step]["mean_loss"], step

    # It trains: the averaged loss falls.
    losses = [survivor[s]["mean_loss"] for s in sorted(survivor)]
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20 - 0.5
