"""``bench/data_prep.py`` in a tiny mode: it runs, its figures are well formed, and what it plants
(near-duplicate copies, eval passages, near misses) is found — never a timing assertion.

The datatrove half needs datatrove in a virtualenv of its own (not this project's); where that
python is absent it is skipped with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "data_prep.py"
DOCS = 300
DATATROVE_PYTHON = os.environ.get("ITO_BENCH_DATATROVE_PYTHON", "/work/bench-venv/bin/python")

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ITO_BENCH_DATATROVE_PYTHON"}
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(BENCH), "--docs", str(DOCS), "--repeats", "1", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _figures(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr + done.stdout[-3000:]
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert figures["bench"] == "data_prep"
    assert figures["docs"] == DOCS
    return figures


def _assert_found_everything_planted(scores: dict[str, Any], corpus: dict[str, Any]) -> None:
    assert scores["near_dup_expected"] == corpus["copies"]
    assert scores["near_dup_recall"] == 1.0
    assert scores["near_dup_false_positives"] == 0
    assert scores["decont_recall"] == 1.0
    assert scores["decont_false_positives"] == 0
    assert scores["decont_near_misses_flagged"] == 0
    assert scores["kept"] == DOCS - corpus["copies"] - corpus["contaminated"]


def test_ours_alone_finds_every_planted_duplicate_and_passage(tmp_path: Path) -> None:
    figures = _figures(_run(tmp_path, "--ours-only"))
    assert set(figures["sides"]) == {"ours"}
    ours = figures["sides"]["ours"]
    assert ours["seconds"] > 0 and ours["docs_per_s"] > 0
    assert figures["ratio_docs_per_s"] is None
    assert figures["found_same_every_round"] is True
    assert figures["goals_met"] == {
        "ours_near_dup_recall": True,
        "ours_near_dup_false_positives": True,
    }
    _assert_found_everything_planted(figures["scores"]["ours"], figures["corpus"])
    assert list(tmp_path.iterdir()) == []  # its temporary directory is removed


def test_without_datatrove_python_it_refuses_and_runs_nothing(tmp_path: Path) -> None:
    done = _run(tmp_path, "--datatrove-python", str(tmp_path / "no-such-python"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(
    not Path(DATATROVE_PYTHON).exists(),
    reason=f"no datatrove virtualenv at {DATATROVE_PYTHON} (set ITO_BENCH_DATATROVE_PYTHON)",
)
def test_beside_datatrove_both_find_the_planted_ones_and_a_ratio_is_printed(
    tmp_path: Path,
) -> None:
    figures = _figures(_run(tmp_path, "--datatrove-python", DATATROVE_PYTHON))
    assert set(figures["sides"]) == {"ours", "datatrove"}
    assert figures["datatrove_version"]
    assert figures["ratio_docs_per_s"] > 0
    assert [r["round"] for r in figures["per_round_ratios"]] == [0]
    for side in ("ours", "datatrove"):
        _assert_found_everything_planted(figures["scores"][side], figures["corpus"])
