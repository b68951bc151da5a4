"""``bench/mfu.py`` on a machine without CUDA: one line saying so, exit status 0, nothing run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mfu_bench_without_cuda_says_so_and_exits_zero(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TMPDIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "mfu.py"), "--size", "1b", "--steps", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    assert "no CUDA device" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no work directory made: nothing was started
