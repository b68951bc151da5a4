"""Running one of this folder's two-process check scripts (``*_check.py``) under torchrun.

Each script prints what differs and exits non-zero when its check fails; the test asserts the
exit status and shows the tail of the output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
DEADLINE_S = 300


def assert_check_passes(script: str, *args: str, nproc: int = 2) -> None:
    result = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(Path(__file__).with_name(script)),
            *args,
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
