"""``leave`` ends a process with its status and keeps what it printed and logged."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_leave_keeps_buffered_output_and_logs_and_exits_with_the_status() -> None:
    script = textwrap.dedent(
        """
        import atexit, logging, sys
        from ito.pipeline.process_exit import leave

        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
        atexit.register(lambda: print("teardown ran"))
        sys.stdout.write("result without newline")
        logging.getLogger("x").info("logged line")
        leave(3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3
    # Buffered output reached the pipe; the interpreter's teardown (atexit) never ran.
    assert done.stdout == "result without newline"
    assert "logged line" in done.stderr
