"""The README's main command, as a new user runs it: ``scripts/demo.py`` end to end (a real
server, the real CLI, the in-process worker training the demo recipe on two gloo processes),
in a home of its own. Its figures are what the README promises the demo shows: every stage
earns its place.

The run's id seeds its data order and rollouts, so each run of this test is another sample of
the recipe; the closing notes of issue 25 record the loaded fresh-clone runs behind it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 900
"""Far above the demo's few minutes; a demo past it is a failure in itself."""


def test_the_demo_succeeds_and_every_post_training_stage_earns_its_place(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    env["ITO_DEMO_HOME"] = str(tmp_path / "demo")
    summary_path = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--summary", str(summary_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    out = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    summary = json.loads(summary_path.read_text())
    assert summary["state"] == "succeeded" and summary["failure_code"] is None, out

    exact = {
        g["stage"]: g["value"]
        for g in summary["gates"]
        if g["eval"] == "exact_match" and g["data"] == "arith-heldout"
    }
    assert all(g["passed"] for g in summary["gates"]), summary["gates"]
    # SFT leaves headroom (imperfect demonstrations), and RLVR's verifier uses it: held-out
    # greedy exact match after RLVR is above DPO's, and the reward rises through the stage.
    assert 0.3 <= exact["sft"] <= 0.85, exact
    assert exact["rlvr"] > exact["dpo"], exact
    tenths = summary["reward_tenths"]
    assert len(tenths) == 10
    assert tenths[-1] >= tenths[0] + 0.1, tenths

    # Every stage took at most the upper bound the approver was shown, and the run spent at
    # most the bound it approved.
    stages = summary["stage_seconds"]
    assert set(stages) == {
        "data_prep",
        "pretrain",
        "midtrain",
        "long_context",
        "sft",
        "dpo",
        "rlvr",
    }
    for name, took in stages.items():
        assert took["took"] <= took["upper"], (name, took)
    assert 0 < summary["cost_usd"] <= float(summary["cost_bound_usd"])
